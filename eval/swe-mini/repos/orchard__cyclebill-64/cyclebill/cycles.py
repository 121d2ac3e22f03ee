"""Monthly billing dates for subscriptions, anchored on the day the subscription started."""


def add_months(day, months):
    month_index = day.month - 1 + months
    year = day.year + month_index // 12
    month = month_index % 12 + 1
    return day.replace(year=year, month=month)


def billing_dates(anchor, count):
    """The first `count` billing dates. Each is computed from the anchor, not from the previous
    date, so a subscription started on the 31st bills on the 31st whenever the month has one."""
    return [add_months(anchor, n) for n in range(count)]


def next_billing_date(anchor, after):
    """The first billing date strictly after `after`."""
    months = max(0, (after.year - anchor.year) * 12 + after.month - anchor.month)
    while add_months(anchor, months) <= after:
        months += 1
    return add_months(anchor, months)
