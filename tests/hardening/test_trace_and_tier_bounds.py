"""Issue 39, classes 5, 8 and part of 9: `--trace-dir` is bounded in open files, ledger memory and
disk and degrades by dropping counted trace lines; the tier's fingerprint covers every weight and
its pages carry a keyed MAC; tier and trace files are private; --hicache-size with redis is
refused at start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from runtime.cache.tier import codec
from runtime.cache.tier.file_store import FileStore
from runtime.cache.tier.hooks import _tensors, mac_key, model_fingerprint
from runtime.cache.tier.store import CorruptEntry
from runtime.config import EngineConfig
from runtime.engine.generation import GenerationRequest
from runtime.server.trace_dir import TraceDir, TraceDirConfig
from runtime.server.trace_files import FileBounds

KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))


def _out(n: int) -> dict:
    meta = {"prompt_tokens": n, "cached_tokens": 0, "finish_reason": {"type": "length"}}
    return {"meta_info": meta, "output_ids": [1, 2]}


def _observe(trace: TraceDir, salt: str | None, session: str, tokens: int) -> None:
    request = GenerationRequest(input_ids=tuple(range(1, tokens + 1)), session_id=session, cache_salt=salt)
    trace.observe([request], [_out(tokens)])


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---- class 5: --trace-dir resources -------------------------------------------------------------
@pytest.mark.parametrize("tenants", [300, 1000])
def test_many_salts_keep_open_files_bounded(tmp_path: Path, tenants: int) -> None:
    """One file per salt, kept forever, exhausted 256 descriptors at ~250 salts."""
    trace = TraceDir(TraceDirConfig(tmp_path, FileBounds(max_open_files=8)), tokenize=list)
    before = _fds()
    for i in range(tenants):
        _observe(trace, f"tenant-{i}", "s", 4)
    assert trace.stats()["open_files"] <= 8 and _fds() - before <= 8
    assert trace.stats()["dropped_lines"] == 0
    assert len(list(tmp_path.glob("*.jsonl"))) == tenants  # every tenant's line was written
    _observe(trace, "tenant-0", "s", 4)  # a closed writer reopens and appends
    first = next(p for p in tmp_path.glob("*.jsonl") if len(p.read_text().splitlines()) == 2)
    assert first.exists()
    trace.close()


@pytest.mark.parametrize(("sessions", "tokens"), [(300, 2000), (50, 20_000)])
def test_ledgers_are_bounded_in_tokens(tmp_path: Path, sessions: int, tokens: int) -> None:
    """300 cheap requests with new prompt_cache_keys once added 248 MiB of ledgers."""
    config = TraceDirConfig(tmp_path, max_ledger_tokens=100_000, max_session_tokens=50_000)
    trace = TraceDir(config, tokenize=list)
    for i in range(sessions):
        _observe(trace, None, f"key-{i}", tokens)
        assert trace.stats()["ledger_tokens"] <= 100_000
    assert trace.stats()["sessions"] < sessions
    trace.close()


def test_one_long_session_starts_afresh_past_its_bound(tmp_path: Path) -> None:
    trace = TraceDir(TraceDirConfig(tmp_path, max_session_tokens=10_000), tokenize=list)
    for _ in range(12):
        _observe(trace, None, "long", 2000)
        assert trace.stats()["ledger_tokens"] <= 10_000
    trace.close()


def test_disk_budget_deletes_rotated_files_then_drops_counted_lines(tmp_path: Path) -> None:
    bounds = FileBounds(max_bytes=4096, keep=3, max_total_bytes=16_000)
    trace = TraceDir(TraceDirConfig(tmp_path, bounds), tokenize=list)

    def on_disk() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob("*.jsonl*"))

    for i in range(400):  # one tenant: rotated files make room for its new lines
        _observe(trace, "busy", f"s{i}", 5)
        assert on_disk() <= 16_000
    assert trace.stats()["deleted_files"] > 0 and trace.stats()["dropped_lines"] == 0
    for i in range(600):  # live files alone past the budget: lines are dropped, counted
        _observe(trace, f"t{i % 8}", f"s{i}", 5)
        assert on_disk() <= 16_000
    stats = trace.stats()
    assert stats["dropped_lines"] > 0 and stats["disk_bytes"] == on_disk()
    trace.close()


def test_write_failures_drop_lines_and_never_raise(tmp_path: Path) -> None:
    root = tmp_path / "trace"
    trace = TraceDir(TraceDirConfig(root), tokenize=list)
    _observe(trace, None, "s", 4)
    trace.files.close()
    for p in root.iterdir():
        p.unlink()
    root.rmdir()
    root.write_text("not a directory any more")
    for i in range(50):
        _observe(trace, f"salt-{i}", "s", 4)  # ENOTDIR on every open: counted, not raised
    assert trace.stats()["dropped_lines"] == 50 and trace.stats()["write_errors"] == 50


def test_trace_files_are_private(tmp_path: Path) -> None:
    root = tmp_path / "trace"
    root.mkdir(mode=0o755)
    trace = TraceDir(TraceDirConfig(root), tokenize=list)
    _observe(trace, "tenant", "s", 4)
    trace.close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in root.iterdir()} == {0o600}


# ---- class 8: the tier's fingerprint, page MACs, file modes -------------------------------------
def test_fingerprint_reads_every_weight(engine) -> None:
    """The walk once skipped callable weight holders: 63 tensors, never the embedding, lm_head or
    a projection."""
    model = engine.model
    counted = sum(t.numel() for _, t in _tensors(model))
    linears = [m for layer in model.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert counted >= sum(m.weight.numel() for m in linears) + model.lm_head.weight.numel()


@pytest.mark.parametrize("where", ["down", "lm_head", "qkv"])
def test_any_weight_change_changes_the_fingerprint(engine, where: str) -> None:
    """A swap that keeps the norms (a LoRA merge) must not serve pages of the old weights."""
    model = engine.model
    before = model_fingerprint(model, "m", "float32")
    tensor = model.lm_head.weight if where == "lm_head" else getattr(model.layers[7], where).weight
    index = tensor.numel() // 2  # not in the first or last 2,048 elements the sample read
    flat = tensor.view(-1)
    old = flat[index].item()
    try:
        flat[index] = old + 1.0
        assert model_fingerprint(model, "m", "float32") != before
    finally:
        flat[index] = old
    assert model_fingerprint(model, "m", "float32") == before


def _page() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 1, 8, 4, generator=g) for _ in range(2)]


@pytest.mark.parametrize(
    "forge",
    [
        "other_key",  # a page written under another key (another server, or a forger without ours)
        "payload_bit",  # a flipped payload bit (a CRC recomputed by a forger no longer passes)
        "header_shape",  # a header edited to reinterpret the payload
        "old_format",  # a CRC-only page of the previous format
    ],
)
def test_forged_pages_are_refused(forge: str) -> None:
    blob = bytearray(codec.encode("k1", "float32", _page(), KEY_A))
    if forge == "other_key":
        blob = bytearray(codec.encode("k1", "float32", _page(), KEY_B))
    elif forge == "payload_bit":
        blob[-5] ^= 0x10
    elif forge == "header_shape":
        blob = bytearray(bytes(blob).replace(b"[2,1,8,4]", b"[2,1,4,8]", 1))
    else:
        blob[:4] = b"RAKV"
    with pytest.raises(CorruptEntry):
        codec.decode("k1", "float32", blob, KEY_A)


def test_tier_files_are_private_and_the_key_file_persists(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    config = EngineConfig(enable_hierarchical_cache=True, hicache_storage_dir=str(root))
    first = mac_key(config)
    assert mac_key(config) == first  # the same directory keeps its key across restarts
    store = FileStore(root, 10**6)
    assert store.put("ab12cd", codec.encode("ab12cd", "float32", _page(), first))
    modes = {stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}
    dirs = {stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")] if p.is_dir()}
    assert modes == {0o600} and dirs == {0o700}
    shared = EngineConfig(
        enable_hierarchical_cache=True, hicache_storage_dir=str(root), hicache_mac_key="x" * 20
    )
    assert mac_key(shared) == mac_key(shared) != first  # a configured key wins, derived alike


@pytest.mark.parametrize("size", [0.01, 4.0])
def test_hicache_size_with_redis_is_refused_at_start(size: float) -> None:
    with pytest.raises(ValueError, match="hicache_size"):
        EngineConfig(enable_hierarchical_cache=True, hicache_storage_backend="redis", hicache_size=size)


def test_the_mac_key_never_reaches_server_info() -> None:
    import dataclasses

    config = EngineConfig(enable_hierarchical_cache=True, hicache_storage_dir="x", hicache_mac_key="s" * 20)
    assert "s" * 20 not in repr(config)
    assert not next(f for f in dataclasses.fields(config) if f.name == "hicache_mac_key").repr
