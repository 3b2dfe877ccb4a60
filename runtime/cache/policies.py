"""Eviction policies by name. Each has SGLang's shape: `get_priority(node)`, lower goes first."""

from __future__ import annotations

from collections.abc import Callable

from runtime.cache.radix import EvictionPolicy, TreeNode


class LRU:
    def get_priority(self, node: TreeNode) -> object:
        return node.last_access_time


class LFU:
    def get_priority(self, node: TreeNode) -> object:
        return (node.hit_count, node.last_access_time)


class FIFO:
    def get_priority(self, node: TreeNode) -> object:
        return node.creation_time


class SLRU:
    """Segmented LRU: nodes hit at least `protected_threshold` times leave after all probation nodes."""

    def __init__(self, protected_threshold: int = 2) -> None:
        self.protected_threshold = protected_threshold

    def get_priority(self, node: TreeNode) -> object:
        return (node.hit_count >= self.protected_threshold, node.last_access_time)


class Priority:
    """Request priority first (SGLang's `priority` field), recency second."""

    def get_priority(self, node: TreeNode) -> object:
        return (node.priority, node.last_access_time)


def _session_policy(**kwargs: object) -> EvictionPolicy:
    from runtime.cache.session_policy import SessionPolicy  # noqa: PLC0415 — heavier, optional

    return SessionPolicy(**kwargs)  # type: ignore[arg-type]


POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": LRU,
    "lfu": LFU,
    "fifo": FIFO,
    "slru": SLRU,
    "priority": Priority,
    "session": _session_policy,
}


def make_policy(name: str, **kwargs: object) -> EvictionPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; choose from {sorted(POLICIES)}") from None
    return factory(**kwargs)
