"""Files and tar: write, read, stat, list, binary safety, missing files, directory trees."""

from __future__ import annotations

import secrets

import pytest

from orchard.core.errors import NotFound
from orchard.testing.conformance._rig import ConformanceRig


class FileChecks(ConformanceRig):
    def test_files_write_read_stat_and_list(self, shared):
        info, sandbox = shared
        folder = f"files-{secrets.token_hex(3)}"
        sandbox.write_file(f"{folder}/sub/a.txt", "text\n")
        sandbox.write_file(f"{folder}/run.sh", b"#!/bin/sh\necho ran\n", mode=0o750)
        assert sandbox.read_file(f"{info.spec.workdir}/{folder}/sub/a.txt") == b"text\n"
        assert sandbox.exec(f"cat {folder}/sub/a.txt && ./{folder}/run.sh").stdout == "text\nran\n"
        stat = sandbox.stat(f"{folder}/run.sh")
        assert not stat.is_dir and stat.size == len(b"#!/bin/sh\necho ran\n") and stat.mode & 0o777 == 0o750
        assert sandbox.stat(f"{folder}/sub").is_dir
        assert [(f.name, f.is_dir) for f in sandbox.list_dir(folder)] == [("run.sh", False), ("sub", True)]

    def test_files_are_binary_safe(self, sandbox):
        data = bytes(range(256)) * 257
        sandbox.write_file("binary.bin", data)
        assert sandbox.read_file("binary.bin") == data
        assert sandbox.exec("wc -c < binary.bin").stdout.strip() == str(len(data))

    def test_a_missing_file_is_not_found(self, sandbox):
        for call in (lambda: sandbox.read_file("no/such/file"), lambda: sandbox.stat("no/such/file"),
                     lambda: sandbox.list_dir("no/such/dir")):
            with pytest.raises(NotFound):
                call()

    def test_a_directory_tree_uploads_and_downloads_intact(self, sandbox, tmp_path):
        tree = {"top.txt": b"top\n", "empty": b"", "a/b/c.bin": bytes(range(256)) * 40, "a/d.txt": b"d\n"}
        source = tmp_path / "source"
        for name, data in tree.items():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes(data)
        remote = f"tree-{secrets.token_hex(3)}"
        sandbox.upload(source, remote)
        assert sandbox.read_file(f"{remote}/a/b/c.bin") == tree["a/b/c.bin"]
        listing = sandbox.exec(f"cd {remote} && find . -type f | sort").stdout.split()
        assert listing == sorted(f"./{name}" for name in tree)
        sandbox.download(remote, tmp_path / "back")
        back = {str(p.relative_to(tmp_path / "back")): p.read_bytes()
                for p in (tmp_path / "back").rglob("*") if p.is_file()}
        assert back == tree
