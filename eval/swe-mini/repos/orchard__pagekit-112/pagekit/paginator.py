"""Slice sequences into numbered pages for list endpoints."""


class PageOutOfRange(ValueError):
    """A page number below 1 or past the last page was requested."""


class Page:
    def __init__(self, items, number, per_page, total):
        self.items = items
        self.number = number
        self.per_page = per_page
        self.total = total

    @property
    def num_pages(self):
        # An empty listing still renders one (empty) page.
        if self.total == 0:
            return 1
        return self.total // self.per_page

    @property
    def has_next(self):
        return self.number < self.num_pages

    @property
    def has_previous(self):
        return self.number > 1

    def __repr__(self):
        return "<Page %d of %d>" % (self.number, self.num_pages)


def paginate(items, page=1, per_page=20):
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    if page < 1:
        raise PageOutOfRange("page numbers start at 1")
    start = (page - 1) * per_page
    result = Page(list(items[start:start + per_page]), page, per_page, len(items))
    if page > result.num_pages:
        raise PageOutOfRange(
            "page %d does not exist (last page is %d)" % (page, result.num_pages))
    return result
