import pytest

from pagekit import PageOutOfRange, paginate


def test_first_page_items():
    page = paginate(list(range(45)), page=1, per_page=20)
    assert page.items == list(range(20))
    assert page.has_next
    assert not page.has_previous


def test_exact_multiple_of_per_page():
    page = paginate(list(range(40)), page=2, per_page=20)
    assert page.items == list(range(20, 40))
    assert page.num_pages == 2
    assert not page.has_next


def test_empty_listing_has_one_page():
    page = paginate([], page=1, per_page=10)
    assert page.items == []
    assert page.num_pages == 1


def test_page_zero_rejected():
    with pytest.raises(PageOutOfRange):
        paginate([1, 2, 3], page=0)
