"""docs/sandbox-ports.md, every block run as written on the embedded local backend: the sync example
serves a page through `forward_port`, the async one talks to a one-shot server through `open_port`."""

from __future__ import annotations

import contextlib
import io

from tests import doc_blocks

PAGE = doc_blocks.ROOT / "docs" / "sandbox-ports.md"


def test_the_examples_run_as_written(embedded_home):
    (_, forward, forward_line), (_, open_port, open_line) = doc_blocks.of_kind(PAGE, "python")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        doc_blocks.run_python(forward, f"sandbox-ports.md:{forward_line}", {})
    assert printed.getvalue() == "hello from inside\n"
    namespace: dict = {}
    doc_blocks.run_python(open_port, f"sandbox-ports.md:{open_line}", namespace)
    assert namespace["answer"] == b"PING"
