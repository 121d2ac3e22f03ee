from .backoff import backoff_delays, retry

__all__ = ["backoff_delays", "retry"]
