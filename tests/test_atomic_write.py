"""orchard.core.atomic_write: the one atomic write every on-disk format of Orchard goes through."""

from __future__ import annotations

import os
import threading

import pytest

from orchard.core.atomic_write import atomic_write_bytes, atomic_write_text


@pytest.mark.parametrize("durable", [True, False])
def test_replaces_the_file_whole_and_keeps_its_mode(tmp_path, durable):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old", durable=durable)
    os.chmod(target, 0o640)
    atomic_write_bytes(target, b"new", durable=durable)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left


def test_a_new_file_gets_the_mode_asked_for(tmp_path):
    atomic_write_bytes(tmp_path / "secret", b"x", mode=0o600)
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old")

    with pytest.raises(TypeError):  # fails mid-write, after the temporary file exists
        atomic_write_bytes(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "state.json"
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for _ in range(50):
                atomic_write_text(target, f"writer {n}\n" * 1000, durable=False)
        except BaseException as exc:  # noqa: BLE001 — collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    text = target.read_text()
    assert len(set(text.splitlines())) == 1 and len(text.splitlines()) == 1000  # one writer's file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
