import os

import pytest

from staticserve import Forbidden, file_for


@pytest.fixture
def docroot(tmp_path):
    root = tmp_path / "public"
    (root / "guide").mkdir(parents=True)
    (root / "guide" / "index.html").write_text("<h1>guide</h1>")
    (root / "style.css").write_text("body {}")
    return str(root)


def test_plain_file(docroot):
    assert file_for(docroot, "/style.css") == os.path.join(docroot, "style.css")


def test_directory_serves_index(docroot):
    assert file_for(docroot, "/guide/") == os.path.join(docroot, "guide", "index.html")


def test_dotdot_escape_rejected(docroot):
    with pytest.raises(Forbidden):
        file_for(docroot, "/../../etc/passwd")


def test_missing_file(docroot):
    with pytest.raises(FileNotFoundError):
        file_for(docroot, "/nope.txt")
