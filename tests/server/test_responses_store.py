"""The Responses token store: tenant isolation and LRU bounds by count and bytes."""

from __future__ import annotations

from runtime.server.responses.store import ResponseStore, StoreConfig, StoredResponse


def _item(n: int) -> StoredResponse:
    history = tuple({"type": "message", "role": "user", "content": "x"} for _ in range(n))
    return StoredResponse(history=history, body={"id": "r", "output": []}, input_items=(), chain="c")


def test_other_tenant_sees_nothing() -> None:
    store = ResponseStore(StoreConfig())
    store.put("a", "resp_1", _item(5))
    assert store.get("a", "resp_1") is not None
    assert store.get("b", "resp_1") is None
    assert not store.delete("b", "resp_1") and len(store) == 1


def test_count_bound_evicts_least_recently_used() -> None:
    store = ResponseStore(StoreConfig(max_entries=2))
    store.put("t", "1", _item(1))
    store.put("t", "2", _item(1))
    store.get("t", "1")
    store.put("t", "3", _item(1))
    assert store.get("t", "2") is None and store.get("t", "1") is not None


def test_byte_bound_holds_and_oversize_is_refused() -> None:
    one = _item(100).size
    store = ResponseStore(StoreConfig(max_bytes=one * 2 + 1))
    for rid in "abc":
        store.put("t", rid, _item(100))
    assert len(store) == 2 and store.bytes_used <= one * 2 + 1
    assert not store.put("t", "big", _item(10_000)) and store.get("t", "big") is None
