"""A bounded least-recently-used cache and a memoize decorator built on it."""
import functools
from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._data = OrderedDict()  # oldest first

    def get(self, key, default=None):
        if key in self._data:
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return default

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)


def memoize(capacity=128):
    def decorator(func):
        cache = LRUCache(capacity)
        missing = object()

        @functools.wraps(func)
        def wrapper(*args):
            result = cache.get(args, missing)
            if result is missing:
                result = func(*args)
                cache.put(args, result)
            return result

        wrapper.cache = cache
        return wrapper

    return decorator
