"""New weights for a running engine (`Engine.update_weights_from_disk`): check the headers, then
load, and check they fit the engine's KV pool and tokenizer (same architecture and shapes),
before anything is swapped.

`preflight` reads only a model's headers (config.json, a GGUF's metadata, safetensors' JSON
headers), so a path to a huge or random file costs nothing (a 1 GiB file once added 3 GiB RSS),
and whatever is wrong with the path, the client gets the same answer: the endpoint is no oracle
for which files exist (the detail goes to the server log)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from runtime.engine.build import DTYPES
from runtime.env import offline_hub
from runtime.errors import InvalidRequest
from runtime.model import files as model_files
from runtime.model import gguf_fixes
from runtime.model.model import LlamaModel, ModelConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from runtime.config import EngineConfig
    from runtime.model.hf_model import HFModel

#: SGLang's `load_format` values this loader serves (None and "auto" pick by the path)
LOAD_FORMATS = (None, "auto", "gguf", "safetensors")
log = logging.getLogger("radixagent.weights")


def check_load_format(model_path: str, load_format: str | None) -> None:
    if load_format not in LOAD_FORMATS:
        raise InvalidRequest(f"load_format: {load_format!r} is not one of {[f for f in LOAD_FORMATS if f]}")
    is_gguf = Path(model_path).suffix == ".gguf"
    if (load_format == "gguf" and not is_gguf) or (load_format == "safetensors" and is_gguf):
        raise InvalidRequest(f"load_format: {load_format!r} does not match model_path {model_path!r}")


NOT_LOADABLE = "model_path: no model of the served architecture can be read there (details in the server log)"
#: a safetensors JSON header larger than this is not a checkpoint of a model this size
_MAX_HEADER_BYTES = 64 * 2**20


def preflight(model_path: str, current: LlamaModel | HFModel) -> None:
    """Header-only checks that `model_path` holds weights of `current`'s architecture; one
    `InvalidRequest(NOT_LOADABLE)` for every failure (missing, unreadable, not a model, other
    shapes), the reason logged."""
    try:
        reason = _preflight_problem(Path(model_path), current)
    except Exception as exc:  # whatever a hostile file makes a parser raise
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        log.warning("update_weights_from_disk refused %r: %s", model_path, reason)
        raise InvalidRequest(NOT_LOADABLE)


def _preflight_problem(path: Path, current: LlamaModel | HFModel) -> str | None:
    if not isinstance(current, LlamaModel):
        return "weight updates need the compact forward (this engine runs the HF fallback)"
    if path.suffix == ".gguf":
        if not path.is_file():
            return "no such GGUF file"
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return "not a GGUF file (bad magic)"
    elif not (path / "config.json").is_file():
        return "neither a .gguf file nor a folder with config.json"
    cfg = ModelConfig.from_hf(_header_config(path))
    if _shape(cfg) != _shape(current.cfg):
        return f"another architecture ({_shape(cfg)}) than the served model ({_shape(current.cfg)})"
    if path.suffix != ".gguf":
        return _safetensors_problem(path)
    return None


def _header_config(path: Path) -> PretrainedConfig:
    """The HF config from headers only (a GGUF's metadata is memory-mapped, not loaded)."""
    offline_hub()
    from transformers import AutoConfig

    if path.suffix == ".gguf":
        return gguf_fixes.read(path).apply(AutoConfig.from_pretrained(path.parent, gguf_file=path.name))
    return AutoConfig.from_pretrained(path)


def _safetensors_problem(folder: Path) -> str | None:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return "no .safetensors files beside config.json"
    for file in files:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= _MAX_HEADER_BYTES:
                return f"{file.name}: not a safetensors file (header of {size} bytes)"
            try:
                json.loads(f.read(size))
            except ValueError:
                return f"{file.name}: unreadable safetensors header"
    return None


def load_compatible(model_path: str, current: LlamaModel | HFModel, config: EngineConfig) -> LlamaModel:
    """The weights at `model_path`, built like `current` (dtype, device, quantization).

    Raises `InvalidRequest` when the path is missing or the architecture differs: the KV pool,
    the tokenizer and every cached prefix are shaped for the current model.
    """
    preflight(model_path, current)
    try:
        loaded = model_files.load(model_path, torch.float32)
        cfg = ModelConfig.from_hf(loaded.hf_config)  # UnsupportedModel is a ValueError
    except (OSError, ValueError) as exc:
        log.warning("update_weights_from_disk could not load %r: %s", model_path, exc)
        raise InvalidRequest(NOT_LOADABLE) from exc
    if _shape(cfg) != _shape(current.cfg):  # the headers agreed, the weights do not
        log.warning("update_weights_from_disk %r: architecture %s", model_path, _shape(cfg))
        raise InvalidRequest(NOT_LOADABLE)
    assert config.dtype is not None  # EngineConfig resolves it
    return LlamaModel(cfg, loaded.state_dict, DTYPES[config.dtype], config.device, config.torchao_config)


def _shape(cfg: ModelConfig) -> tuple:
    return (
        cfg.arch,
        cfg.vocab_size,
        cfg.hidden,
        cfg.layers,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.intermediate,
    )
