from .parse import parse_offset, parse_timestamp, to_utc

__all__ = ["parse_offset", "parse_timestamp", "to_utc"]
