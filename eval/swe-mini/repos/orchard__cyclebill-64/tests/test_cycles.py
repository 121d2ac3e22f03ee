from datetime import date

from cyclebill import add_months, next_billing_date


def test_add_months_same_year():
    assert add_months(date(2023, 3, 15), 2) == date(2023, 5, 15)


def test_add_months_across_year():
    assert add_months(date(2023, 11, 15), 3) == date(2024, 2, 15)


def test_subtract_months():
    assert add_months(date(2024, 1, 10), -1) == date(2023, 12, 10)


def test_next_billing_date_mid_month_anchor():
    assert next_billing_date(date(2023, 1, 15), date(2023, 6, 15)) == date(2023, 7, 15)
