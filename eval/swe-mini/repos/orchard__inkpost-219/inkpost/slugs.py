"""URL slugs for post titles."""
import re

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(title, max_length=60):
    slug = _NON_ALNUM.sub("-", title.lower()).strip("-")
    if len(slug) > max_length:
        slug = slug[:max_length].rstrip("-")
    return slug or "untitled"


def unique_slug(title, existing):
    """slugify(title), suffixed with -2, -3, ... until it is not in `existing`."""
    base = slugify(title)
    slug, n = base, 2
    while slug in existing:
        slug, n = "%s-%d" % (base, n), n + 1
    return slug
