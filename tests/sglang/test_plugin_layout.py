"""The plugin against SGLang 0.5.23's real node layout (no sglang needed): UnifiedTreeNode keeps
session refs in `component_data[ComponentType.FULL].session_ref` and `last_access_time` is a
logical counter (module global `_LAST_ACCESS_TIME_COUNTER_FLOAT`), not seconds."""

from __future__ import annotations

import sys
import types

from runtime import sglang_plugin


def _node(node_id: int, last: float, refs: int) -> types.SimpleNamespace:
    full = types.SimpleNamespace(session_ref=refs, session_ids=None, lock_ref=0)
    return types.SimpleNamespace(id=node_id, last_access_time=last, component_data=[full], key=[1, 2, 3])


def test_unified_node_layout_and_counter_clock(monkeypatch) -> None:
    counter = types.ModuleType(sglang_plugin._COUNTER_MODULE)
    counter._LAST_ACCESS_TIME_COUNTER_FLOAT = 100.0
    monkeypatch.setitem(sys.modules, sglang_plugin._COUNTER_MODULE, counter)
    policy = sglang_plugin.make_strategy()
    old, new = _node(1, 10.0, 0), _node(2, 90.0, 0)
    assert policy.get_priority(old) < policy.get_priority(new)  # LRU in counter units
    assert policy.get_priority(new) == (1, -10.0)
    shared, single = _node(3, 10.0, 3), _node(4, 10.0, 1)
    assert policy.get_priority(shared) > policy.get_priority(single)  # more live sessions: kept longer
    assert policy.get_priority(single) == policy.get_priority(old)  # one ref, same age: same rank
