from .writer import format_field, format_row, write_rows

__all__ = ["format_field", "format_row", "write_rows"]
