"""arnar.cache: a derived file is made once, read after, and never left half-written."""

import pytest

from arnar.cache import cache_dir, cached_file


def test_made_once_then_read(tmp_path):
    calls = []

    def make(path):
        calls.append(path)
        path.write_text("derived")

    first = cached_file("kind/a.v1.txt", make, tmp_path)
    assert first == tmp_path / "kind/a.v1.txt" and first.read_text() == "derived"
    assert cached_file("kind/a.v1.txt", make, tmp_path) == first and len(calls) == 1
    # the maker wrote a temporary of its own, not the final name
    assert calls[0].parent == first.parent and calls[0].name.startswith(".tmp.") and calls[0].name.endswith("a.v1.txt")
    assert sorted(p.name for p in first.parent.iterdir()) == ["a.v1.txt"]


def test_a_failed_make_leaves_nothing(tmp_path):
    def broken(path):
        path.write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        cached_file("kind/b.txt", broken, tmp_path)
    assert list((tmp_path / "kind").iterdir()) == []


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ARNAR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "arnar"
    monkeypatch.setenv("ARNAR_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"
