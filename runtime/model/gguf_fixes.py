"""What transformers' GGUF loader leaves out of a model, read from the file itself.

- Qwen3 (and any architecture whose head_dim is not hidden/heads, e.g. Qwen3-0.6B: 1024/16 = 64,
  head_dim 128): transformers maps no `attention.key_length` for qwen3, so the config would
  derive a wrong head_dim and the q/k/v shapes would not fit. The config gets the file's.
- Llama 3.x: llama.cpp stores the `llama3` rope scaling as per-frequency divisors, the tensor
  `rope_freqs.weight`, and no rope_scaling metadata; transformers drops the tensor and runs
  plain RoPE. The compact forward applies the divisors (runtime/model/rope.py), as llama.cpp does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from gguf import GGUFReader
    from transformers import PretrainedConfig

ROPE_FREQS_TENSOR = "rope_freqs.weight"


@dataclass(frozen=True, slots=True)
class GGUFFixes:
    config: dict[str, int] = field(default_factory=dict)  # config attributes to set
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # extra state-dict entries

    def apply(self, config: PretrainedConfig) -> PretrainedConfig:
        for key, value in self.config.items():
            setattr(config, key, value)
        return config


def read(path: Path) -> GGUFFixes:
    """The fixes the GGUF at `path` needs (none for most files)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    config: dict[str, int] = {}
    key_length = _field(reader, f"{arch}.attention.key_length")
    if isinstance(key_length, (int, np.integer)):
        config["head_dim"] = int(key_length)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name == ROPE_FREQS_TENSOR:
            tensors["rope_freqs"] = torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(-1))
    return GGUFFixes(config, tensors)


def _field(reader: GGUFReader, name: str) -> object:
    f = reader.fields.get(name)
    return None if f is None else f.contents()
