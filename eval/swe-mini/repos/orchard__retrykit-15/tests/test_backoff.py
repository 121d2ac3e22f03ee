import pytest

from retrykit import backoff_delays, retry


def flaky(failures):
    state = {"left": failures}

    def call():
        if state["left"]:
            state["left"] -= 1
            raise ConnectionError("try again")
        return "ok"

    return call


def test_delays_grow_exponentially():
    assert list(backoff_delays(4, base=0.5)) == [0.5, 1.0, 2.0, 4.0]


def test_retry_returns_after_success():
    waits = []
    assert retry(flaky(2), sleep=waits.append) == "ok"
    assert waits == [0.5, 1.0]


def test_retry_reraises_after_exhausting():
    with pytest.raises(ConnectionError):
        retry(flaky(10), retries=3, sleep=lambda s: None)


def test_non_retryable_error_propagates():
    def broken():
        raise KeyError("bug")

    with pytest.raises(KeyError):
        retry(broken, retry_on=(ConnectionError,), sleep=lambda s: None)
