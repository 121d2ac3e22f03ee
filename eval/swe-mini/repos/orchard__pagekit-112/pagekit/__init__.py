from .paginator import Page, PageOutOfRange, paginate

__all__ = ["Page", "PageOutOfRange", "paginate"]
