import io

from csvlite import format_field, format_row, write_rows


def test_plain_row():
    assert format_row(["a", 1, 2.5]) == "a,1,2.5\r\n"


def test_comma_forces_quotes():
    assert format_field("Smith, John") == '"Smith, John"'


def test_none_is_empty_field():
    assert format_row([None, "x"]) == ",x\r\n"


def test_write_rows_counts_data_rows():
    out = io.StringIO()
    assert write_rows(out, [[1, 2], [3, 4]], header=["a", "b"]) == 2
    assert out.getvalue() == "a,b\r\n1,2\r\n3,4\r\n"
