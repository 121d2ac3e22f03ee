"""A task directory's suite hash (a run's resume key, and what tells a report's cells apart) depends on its
files' names, content and modes only. The reference solution packs the task's files into the command the
oracle runs; it used to carry gzip's header time and each file's mtime, so every process that loaded
claw-mini hashed it differently: a resumed run was refused as another configuration, and two harnesses' runs
of the same suite were two suites in `orchard report`."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from orchard.eval.run_config import suite_hash
from orchard.eval.suites import load_suite

SUITE = Path(__file__).resolve().parents[1] / "eval" / "claw-mini"


def test_the_same_files_hash_the_same_at_another_time_and_mtime(tmp_path, monkeypatch):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(SUITE / "suite.json", suite)
    shutil.copytree(SUITE / "mail-reply-budget", suite / "mail-reply-budget")
    first = suite_hash(load_suite(suite))
    later = time.time() + 3600
    for path in (suite / "mail-reply-budget").rglob("*"):
        os.utime(path, (later, later))
    monkeypatch.setattr(time, "time", lambda: later)  # gzip's header time, were it not fixed
    assert suite_hash(load_suite(suite)) == first
    (suite / "mail-reply-budget" / "solution" / "solve.sh").write_text("#!/bin/sh\ntrue\n")
    assert suite_hash(load_suite(suite)) != first  # the content still counts
