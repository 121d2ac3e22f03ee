"""Busy blocks and free slots as (start, end) minutes since midnight, end exclusive."""


def merge_busy(blocks):
    """Merge overlapping busy blocks into a sorted list of disjoint blocks."""
    merged = []
    for start, end in sorted(blocks):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def free_slots(busy, day_start, day_end, min_length=0):
    """Gaps of at least `min_length` minutes between busy blocks within [day_start, day_end)."""
    slots = []
    cursor = day_start
    for start, end in merge_busy(busy):
        start, end = max(start, day_start), min(end, day_end)
        if start >= end:
            continue
        if start - cursor >= min_length:
            slots.append((cursor, start))
        cursor = max(cursor, end)
    if day_end - cursor >= min_length:
        slots.append((cursor, day_end))
    return slots
