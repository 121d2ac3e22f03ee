from inkpost import slugify, unique_slug


def test_basic_title():
    assert slugify("Hello, World!") == "hello-world"


def test_max_length_does_not_end_with_dash():
    assert slugify("a" * 59 + " bcd") == "a" * 59


def test_empty_title():
    assert slugify("!!!") == "untitled"


def test_unique_slug_suffix():
    assert unique_slug("Hello World", {"hello-world", "hello-world-2"}) == "hello-world-3"


def test_non_ascii_title():
    assert slugify("Zürich 2024") == "z-rich-2024"
