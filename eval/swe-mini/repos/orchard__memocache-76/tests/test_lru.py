from memocache import LRUCache, memoize


def test_put_evicts_oldest():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert len(cache) == 2


def test_put_existing_key_refreshes_it():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert "b" not in cache


def test_hit_and_miss_counters():
    cache = LRUCache(4)
    cache.put("a", 1)
    cache.get("a")
    cache.get("zzz")
    assert (cache.hits, cache.misses) == (1, 1)


def test_memoize_calls_once_per_argument():
    calls = []

    @memoize(capacity=8)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]
