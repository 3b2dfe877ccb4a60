"""SGLang's /v1/loads: one rank's LoadSnapshot (what smg's load monitor polls every second).

Shapes follow SGLang 0.5's `LoadSnapshot.to_dict` and its Prometheus form; sections this engine
has no data for (spec, lora, disagg) are omitted, as SGLang omits absent sections.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from runtime.server.errors import ApiError

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
_SECTION_KEYS = {"memory": "memory", "queues": "queues"}  # include name -> key; spec/lora/disagg: none here


def parse_sections(include: str | None) -> set[str] | None:
    """`include` parsed as SGLang does (None: everything); an unknown section is a 400."""
    if not include:
        return None
    sections = {s.strip() for s in include.split(",") if s.strip()}
    bad = sections - LOAD_SECTIONS
    if bad:
        raise ApiError(400, f"include: invalid load sections {sorted(bad)}; valid: {sorted(LOAD_SECTIONS)}")
    return None if not sections or "all" in sections else sections


def select_sections(load: dict[str, Any], sections: set[str] | None) -> dict[str, Any]:
    """SGLang's LoadSnapshot.to_dict: core keys always, a section only when asked for (or all)."""
    if sections is None:
        return load
    drop = {key for name, key in _SECTION_KEYS.items() if name not in sections}
    return {k: v for k, v in load.items() if k not in drop}


def snapshot(engine: Engine) -> dict[str, Any]:
    """One rank's SGLang LoadSnapshot from one consistent read under the scheduler lock (reentrant,
    so `get_cache_stats` nests). Tokens follow SGLang: `num_used_tokens` are the pool slots that
    cannot be reclaimed (running requests and the tree nodes they lock), i.e. capacity - free -
    evictable; the evictable warm cache is not load. (`/get_load`'s `num_tokens` counts the whole
    tree.) Fields this engine cannot measure are left out rather than reported as 0:
    `gen_throughput` (completion tokens are counted only when a request finishes, aborts never),
    `utilization`, `total_prefill_busy_us`; smg reads an absent field as 0."""
    snap = engine.snapshot()
    stats = snap.stats
    evictable = snap.cache.evictable_tokens
    # Requests still in the submit inbox (drained at the next step) are not visible here.
    uncached, waiting_tokens = snap.waiting_uncached_tokens, snap.waiting_tokens
    capacity = int(stats["pool_capacity_tokens"])
    used = capacity - int(stats["pool_free_tokens"]) - evictable
    total = used + waiting_tokens  # SGLang: KV in use plus the waiting requests' tokens
    queued = int(stats["queue_depth"])
    memory: dict[str, Any] = {
        "kv_cache_gb": round(stats["pool_capacity_bytes"] / 2**30, 3),
        "graph_gb": 0.0,  # no CUDA graphs are captured
        "token_capacity": capacity,
    }
    info = engine.info()
    memory = {"weight_gb": round(info.weight_bytes / 2**30, 3), **memory}
    return {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": int(stats["running"]),
        "num_waiting_reqs": queued,
        "num_waiting_uncached_tokens": uncached,
        "num_used_tokens": used,
        "num_total_tokens": total,
        "num_active_tokens": total,  # differs from total only for disaggregated decode
        "num_prealloc_ready_tokens": 0,  # disaggregated decode only
        "max_total_num_tokens": capacity,
        "max_running_requests": info.config.max_running_requests,
        "token_usage": round(used / capacity, 4) if capacity else 0.0,
        "cache_hit_rate": round(float(stats["hit_rate"]), 4),  # since start, finished requests
        "total_prefill_uncached_tokens": int(stats["prefill_tokens_computed"]),
        "decode_moments": None,  # SGLang's "no decode-step timings"
        "memory": memory,
        # grammars compile before submit, nothing pauses, and admission reserves a request's whole
        # footprint so nothing is ever retracted: those queues are empty by construction
        "queues": {"waiting": queued, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }


def accelerator(engine: Engine) -> tuple[str | None, int]:
    """(marketing name, count) of the device one rank runs on; (None, 0) on the CPU."""
    device = engine.info().config.device
    if not device.startswith("cuda"):
        return None, 0
    import torch

    return torch.cuda.get_device_name(torch.device(device)), 1


def prometheus(loads: list[dict[str, Any]]) -> bytes:
    """SGLang's text form: one gauge per numeric field, `sglang_<key>` or `sglang_<section>_<key>`,
    labelled with the rank."""
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in loads:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            fields = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, v in fields:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    name = f"sglang_{key}_{sub}" if sub else f"sglang_{key}"
                    samples.setdefault(name, []).append((rank, v))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {v}' for rank, v in values]
    return ("\n".join(lines) + "\n").encode()
