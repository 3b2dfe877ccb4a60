"""New weights for a running engine (`Engine.update_weights_from_disk`): load, and check they fit
the engine's KV pool and tokenizer (same architecture and shapes), before anything is swapped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from runtime.engine.build import DTYPES
from runtime.errors import InvalidRequest
from runtime.model import files as model_files
from runtime.model.model import LlamaModel, ModelConfig

#: SGLang's `load_format` values this loader serves (None and "auto" pick by the path)
LOAD_FORMATS = (None, "auto", "gguf", "safetensors")


def check_load_format(model_path: str, load_format: str | None) -> None:
    if load_format not in LOAD_FORMATS:
        raise InvalidRequest(f"load_format: {load_format!r} is not one of {[f for f in LOAD_FORMATS if f]}")
    is_gguf = Path(model_path).suffix == ".gguf"
    if (load_format == "gguf" and not is_gguf) or (load_format == "safetensors" and is_gguf):
        raise InvalidRequest(f"load_format: {load_format!r} does not match model_path {model_path!r}")


def load_compatible(model_path: str, current: Any, config: Any) -> LlamaModel:
    """The weights at `model_path`, built like `current` (dtype, device, quantization).

    Raises `InvalidRequest` when the path is missing or the architecture differs: the KV pool,
    the tokenizer and every cached prefix are shaped for the current model.
    """
    if not isinstance(current, LlamaModel):
        raise InvalidRequest(
            "model_path: weight updates need the compact forward (this engine runs the HF fallback)"
        )
    if not Path(model_path).exists():
        raise InvalidRequest(f"model_path: {model_path!r} does not exist")
    try:
        loaded = model_files.load(model_path, torch.float32)
        cfg = ModelConfig.from_hf(loaded.hf_config)  # UnsupportedModel is a ValueError
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"model_path: cannot load {model_path!r}: {exc}") from exc
    if _shape(cfg) != _shape(current.cfg):
        raise InvalidRequest(
            f"model_path: {model_path!r} has another architecture ({_shape(cfg)}) than the served model "
            f"({_shape(current.cfg)}); start a new server for it"
        )
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
