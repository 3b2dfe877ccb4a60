"""`--kv-events-config`: SGLang 0.5.23's KVEventsConfig JSON, every field honoured or refused.

Fields (SGLang's names and defaults): `publisher` ("null" | "zmq"), `endpoint` (the PUB socket:
bound when `bind` is true, or when unset and the address is a wildcard / ipc / inproc one;
connected otherwise), `bind`, `replay_endpoint` (a ROUTER socket serving missed batches),
`buffer_steps` (batches kept for replay), `hwm` (the PUB socket's high-water mark),
`max_queue_size` (cache changes queued between the engine and the publisher thread; past it a
change is dropped and counted, the engine never waits), `topic`, `format` ("default" | "dynamo").
Any other key, or a value of the wrong type, is a ValueError naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

PUBLISHERS = ("null", "zmq")
FORMATS = ("default", "dynamo")
_WILDCARDS = ("*", "::", "0.0.0.0")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    bind: bool | None = None
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    format: str = "default"

    def __post_init__(self) -> None:
        problems = []
        if self.publisher not in PUBLISHERS:
            problems.append(f"publisher must be one of {PUBLISHERS}")
        if self.format not in FORMATS:
            problems.append(f"format must be one of {FORMATS}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                problems.append(f"{name} must be a tcp://, ipc:// or inproc:// address")
        if problems:
            raise ValueError("invalid --kv-events-config: " + "; ".join(problems))

    @property
    def enabled(self) -> bool:
        return self.publisher != "null"

    @property
    def dynamo(self) -> bool:
        return self.format == "dynamo"

    def binds(self) -> bool:
        """SGLang's rule: bind wildcard, ipc and inproc addresses unless `bind` says otherwise."""
        if self.bind is not None:
            return self.bind
        return any(w in self.endpoint for w in _WILDCARDS) or self.endpoint.startswith(
            ("ipc://", "inproc://")
        )


_TYPES: dict[str, tuple[type, ...]] = {
    "publisher": (str,),
    "endpoint": (str,),
    "bind": (bool, type(None)),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
    "format": (str,),
}


def parse_kv_events_config(raw: str | None) -> KVEventsConfig | None:
    """None for no config (or publisher "null"); ValueError naming a bad field."""
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    known = {f.name for f in fields(KVEventsConfig)}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"--kv-events-config: unknown field {key!r}; known: {sorted(known)}")
        kinds = _TYPES[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"--kv-events-config: field {key!r} has the wrong type")
    config = KVEventsConfig(**data)
    return config if config.enabled else None
