from .money import format_amount, parse_amount, split_evenly

__all__ = ["format_amount", "parse_amount", "split_evenly"]
