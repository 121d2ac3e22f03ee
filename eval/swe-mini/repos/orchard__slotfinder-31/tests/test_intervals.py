from slotfinder import free_slots, merge_busy


def test_overlapping_blocks_merge():
    assert merge_busy([(540, 600), (570, 630)]) == [(540, 630)]


def test_unsorted_input():
    assert merge_busy([(700, 720), (540, 560)]) == [(540, 560), (700, 720)]


def test_free_slots_between_meetings():
    busy = [(540, 600), (660, 720)]
    assert free_slots(busy, 480, 1020) == [(480, 540), (600, 660), (720, 1020)]


def test_free_slots_min_length():
    busy = [(540, 600), (615, 720)]
    assert free_slots(busy, 540, 780, min_length=30) == [(720, 780)]
