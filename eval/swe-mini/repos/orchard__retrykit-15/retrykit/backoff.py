"""Retry a flaky call with exponential backoff, never waiting longer than max_delay."""
import time


def backoff_delays(retries, base=0.5, factor=2.0, max_delay=30.0):
    """The seconds to wait before each of `retries` retries."""
    delay = base
    for _ in range(retries):
        yield delay
        delay = min(delay, max_delay) * factor


def retry(func, retries=5, retry_on=(Exception,), sleep=time.sleep, **backoff):
    """Call `func` until it succeeds; after `retries` failed retries the last error propagates."""
    delays = backoff_delays(retries, **backoff)
    while True:
        try:
            return func()
        except retry_on:
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)
