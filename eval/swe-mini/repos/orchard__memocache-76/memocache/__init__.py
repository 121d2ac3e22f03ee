from .lru import LRUCache, memoize

__all__ = ["LRUCache", "memoize"]
