"""The Qwen3 / Llama 3 compact forward on a GPU against HF transformers on the same GPU (tiny
random models built from the families' config classes): prompt logprobs, and decode steps after
a prefill (cached) equal to the same positions computed in one pass.

    python3 -m evals.benchmarks.families_gpu [--device cuda]
"""

from __future__ import annotations

import argparse
import json

import torch


def _config(family: str):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=4096,
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=2048,
        tie_word_embeddings=family == "llama3",
    )
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=64, rope_theta=1e6)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return LlamaConfig(**common, rope_parameters=rope)


def check(family: str, dtype: torch.dtype, device: str) -> dict:
    from transformers import AutoModelForCausalLM

    from runtime.cache.seq_kv import SeqKV
    from runtime.model.model import LlamaModel, ModelConfig, Segment

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(family)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            scale = 1.5 / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.1
            p.copy_(
                1 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else torch.randn_like(p) * scale
            )
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    hf = hf.to(device=device, dtype=dtype)
    model = LlamaModel(ModelConfig.from_hf(hf.config), state, dtype, device)
    ids = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids], device=device)).logits[0].float(), -1)
    kv = SeqKV.empty(model.cfg, len(ids) + 8, model.kv_dtype, device)
    seg = Segment(kv, ids, logits_from=0)
    model.forward([seg])
    assert seg.prompt_logits is not None
    ours = torch.log_softmax(seg.prompt_logits.float(), -1)
    pick = torch.tensor(ids[1:], device=device)
    lp_ours = ours[:-1].gather(1, pick[:, None])[:, 0]
    lp_ref = ref[:-1].gather(1, pick[:, None])[:, 0]
    # decode: the last 20 tokens one at a time after a 280-token prefill
    kv2 = SeqKV.empty(model.cfg, len(ids) + 8, model.kv_dtype, device)
    model.forward([Segment(kv2, ids[:280])])
    steps = [model.forward([Segment(kv2, [t])])[0] for t in ids[280:]]
    stepped = torch.log_softmax(torch.stack(steps).float(), -1)
    return {
        "family": family,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "max_logprob_diff_vs_hf": (lp_ours - lp_ref).abs().max().item(),
        "max_decode_vs_one_pass": (stepped - ours[280:]).abs().max().item(),
        "greedy_next_equal": bool(ours[-1].argmax() == ref[-1].argmax()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    rows = [check(f, d, args.device) for f in ("qwen3", "llama3") for d in (torch.float32, torch.bfloat16)]
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
