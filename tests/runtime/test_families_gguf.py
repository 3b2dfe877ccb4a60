"""Qwen3 and Llama 3 GGUF files (written from tiny HF folders as llama.cpp's converter writes
them, tests/gguf_write.py) run on the compact forward and match HF transformers' forward of the
folder they came from, where transformers' own GGUF path does not (runtime/model/gguf_fixes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.model.model import LlamaModel
from tests.families import build_family
from tests.gguf_write import write_gguf
from tests.runtime.test_families import PROMPT

pytestmark = pytest.mark.slow  # loads the bundled tokenizer


def _reference(model) -> list[float]:
    with torch.inference_mode():
        lp = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), -1)
    return [lp[i, PROMPT[i + 1]].item() for i in range(len(PROMPT) - 1)]


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def pair(request, tmp_path_factory) -> tuple[str, Path, Path]:
    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    folder = build_family(root / "hf", request.param, plain=True)
    return request.param, folder, write_gguf(folder, root / f"tiny-{request.param}.gguf")


def test_gguf_runs_compact_and_matches_the_hf_folder(pair):
    from transformers import AutoModelForCausalLM

    family, folder, gguf = pair
    ref = _reference(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    with Engine(model_path=str(gguf), dtype="float32", max_total_tokens=2048) as eng:
        assert isinstance(eng.model, LlamaModel)
        out = eng.generate(input_ids=PROMPT, sampling_params=greedy, return_logprob=True, logprob_start_len=0)
        warm = eng.generate(input_ids=PROMPT, sampling_params=greedy)
    ours = [e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]
    # Llama 3 from a GGUF: llama.cpp's divisors instead of HF's interpolation (measured 3e-5)
    assert max(abs(a - b) for a, b in zip(ours, ref, strict=True)) < 2e-3
    assert warm["meta_info"]["cached_tokens"] == len(PROMPT) - 1
    assert warm["output_ids"] == out["output_ids"]


def test_transformers_alone_misreads_these_files(pair):
    """Why runtime/model/gguf_fixes.py exists: transformers 5.x gives Qwen3 a default head_dim (shapes
    do not fit) and drops Llama 3's rope_freqs (plain RoPE)."""
    from transformers import AutoModelForCausalLM

    family, folder, gguf = pair
    if family == "qwen3":
        with pytest.raises(RuntimeError, match="mismatch"):
            AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        return
    ref = _reference(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    plain = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    assert max(abs(a - b) for a, b in zip(_reference(plain.eval()), ref, strict=True)) > 0.1
