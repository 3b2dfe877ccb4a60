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


def test_a_stored_chain_puts_its_turns_back_after_the_memos_dropped_them() -> None:
    """The chat path's memos are bounded; a stored response keeps its chain's generated turns and
    restores them (the tokens generated, not a re-rendering) before the chain continues."""
    from runtime.server.reasoning_history import Turn, TurnMemo
    from runtime.server.tools.formats import RawCall
    from runtime.server.tools.prompt import CallMemo
    from runtime.server.turn_records import CAPTURE

    turns, calls = TurnMemo(capacity=1), CallMemo(capacity=1)
    recorded: list = []
    token = CAPTURE.set(recorded)
    try:
        turns.record(["turn-a"], Turn("answer a", (5, 6, 7), "<|im_start|>assistant\n"))
        calls.record(["call_1"], '<tool_call>{"name":"add"}</tool_call>', "", (RawCall("add", "{}"),), (9, 9))
    finally:
        CAPTURE.reset(token)
    stored = StoredResponse(
        history=(), body={"id": "r", "output": []}, input_items=(), chain="c", replays=tuple(recorded)
    )
    assert len(stored.replays) == 2 and stored.size > _item(0).size  # the turns count against the bound
    turns.record(["turn-b"], Turn("answer b", (8,), ""))  # other traffic: both memos drop theirs
    calls.record(["call_2"], "x", "", (RawCall("add", "{}"),), (1,))
    assert turns.lookup("turn-a") is None and calls.lookup("call_1", "", (("add", "{}"),)) is None

    stored.restore()
    assert turns.lookup("turn-a") == Turn("answer a", (5, 6, 7), "<|im_start|>assistant\n")
    hit = calls.lookup("call_1", "", (("add", "{}"),))
    assert hit is not None and hit.output_ids == (9, 9)


def test_memos_capture_nothing_outside_the_responses_door() -> None:
    from runtime.server.reasoning_history import Turn, TurnMemo
    from runtime.server.turn_records import CAPTURE

    assert CAPTURE.get() is None
    TurnMemo().record(["k"], Turn("t", None, ""))  # no capture list: nothing kept, nothing raised
