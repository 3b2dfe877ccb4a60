from __future__ import annotations

import errno
import logging
import os

import pytest

from runtime.cache.tier.file_store import FileStore


def test_put_get_and_restart(tmp_path):
    s = FileStore(tmp_path, 10_000)
    assert s.put("ab12", b"x" * 100)
    assert bytes(s.get("ab12")) == b"x" * 100
    assert s.get("ffff") is None
    again = FileStore(tmp_path, 10_000)  # a restart: the index comes back from the directory
    assert again.contains(["ab12", "ffff"]) == [True, False]
    assert again.footprint() == {"entries": 1, "bytes": 100}


def test_bound_evicts_least_recently_used(tmp_path):
    s = FileStore(tmp_path, 350)
    for k in ("aa01", "aa02", "aa03"):
        assert s.put(k, b"y" * 100)
    s.get("aa01")  # now most recent
    assert s.put("aa04", b"z" * 100)
    assert s.contains(["aa01", "aa02", "aa03", "aa04"]) == [True, False, True, True]
    assert s.footprint()["bytes"] <= 350
    assert not s.put("aa05", b"q" * 400)  # bigger than the whole bound
    assert FileStore(tmp_path, 150).footprint()["bytes"] <= 150  # a smaller bound at restart shrinks


def test_leftover_tmp_files_are_removed(tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / ".ab12.1.0.tmp").write_bytes(b"partial")
    FileStore(tmp_path, 1000)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_unwritable_directory_warns_once_and_never_raises(tmp_path, caplog):
    target = tmp_path / "tier"
    target.write_text("a file where the directory should be")
    with caplog.at_level(logging.WARNING, "radixagent.tier"):
        s = FileStore(target, 1000)
        assert not s.put("ab12", b"x")
        assert not s.put("ab13", b"x")
        assert s.get("ab12") is None
    assert s.counters.put_failures == 2
    assert sum("cannot write" in r.message or "unusable" in r.message for r in caplog.records) <= 2
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


def test_disk_full_warns_once(tmp_path, caplog, monkeypatch):
    s = FileStore(tmp_path, 10_000)

    def full(path, mode="wb", *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("runtime.cache.tier.file_store.open_private", full)
    with caplog.at_level(logging.WARNING, "radixagent.tier"):
        assert not s.put("ab12", b"x" * 10)
        assert not s.put("ab13", b"x" * 10)
    assert [r.message for r in caplog.records if "disk full" in r.message].__len__() == 1
    monkeypatch.undo()
    assert s.put("ab12", b"x" * 10)  # recovers once space is back
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path):
    os.chmod(tmp_path, 0o500)
    try:
        assert not FileStore(tmp_path, 1000).put("ab12", b"x")
    finally:
        os.chmod(tmp_path, 0o700)
