"""`exception_text`: the one way Orchard's error messages name a cause, even one with no message."""

import httpx

from orchard.core.errors import exception_text


def test_an_exception_without_a_message_is_named_by_its_type():
    # An exception object is always true: `exc or type(exc).__name__` would format as "" here.
    assert exception_text(httpx.ConnectError("")) == "ConnectError"
    assert exception_text(ConnectionResetError()) == "ConnectionResetError"


def test_an_exception_with_a_message_is_its_message():
    assert exception_text(httpx.ConnectError("All connection attempts failed")) == "All connection attempts failed"
    assert exception_text(ValueError("  padded \n")) == "padded"
