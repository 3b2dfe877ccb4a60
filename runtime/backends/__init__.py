"""Backends by name: `connect(target)` picks one from a registry.

- `"embedded"` or an `Engine` instance: in-process (`EmbeddedBackend`)
- `"http://host:port"` / `"https://..."` (or `"sglang:<url>"`): SGLang-native /generate (`SGLangBackend`)
- `"openai:<base-url>"`: any OpenAI-compatible server's /v1/completions (`OpenAIBackend`)

Implementations are imported on first use, so `connect("http://...")` never loads torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from runtime.backends.base import Backend, Completion

__all__ = ["BACKENDS", "Backend", "Completion", "connect"]

#: name -> "module:Class"; the class takes the URL (when the target has one) then keyword options
BACKENDS: dict[str, str] = {
    "embedded": "runtime.backends.embedded:EmbeddedBackend",
    "sglang": "runtime.backends.sglang:SGLangBackend",
    "openai": "runtime.backends.openai_compat:OpenAIBackend",
}


def backend_class(name: str) -> Callable[..., Backend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def connect(target: object = "embedded", **options: object) -> Backend:
    """A `Backend` for `target` (see the module docstring). `options` go to the backend's constructor
    (e.g. `api_key=`, `model=`, `max_attempts=`, `retry_backoff_s=`; for "embedded": Engine config such as `max_total_tokens=`)."""
    if isinstance(target, Backend):
        return target
    if not isinstance(target, str):
        return backend_class("embedded")(engine=target, **options)
    if target == "embedded":
        return backend_class("embedded")(**options)
    if target.startswith(("http://", "https://")):
        return backend_class("sglang")(target, **options)
    name, sep, url = target.partition(":")
    if sep and name in BACKENDS and name != "embedded" and url:
        return backend_class(name)(url, **options)
    raise ValueError(
        f"cannot connect to {target!r}: use 'embedded', an Engine, 'http://host:port' or 'openai:<base-url>'"
    )
