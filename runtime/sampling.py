"""Sampling parameters (SGLang's names) and the sampler that turns logits into a token."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from runtime.errors import InvalidRequest

#: temperatures below this sample greedily, as in SGLang (logits / 1e-320 would be inf)
SAMPLING_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What SGLang's `sampling_params` carries. Defaults follow SGLang (temperature 1.0)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    json_schema: str | None = None
    regex: str | None = None
    #: an llguidance Lark grammar (internal: the tool-calling grammar; not a request field)
    lark: str | None = None
    seed: int | None = None
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (all(math.isfinite(x) for x in (self.temperature, self.top_p, self.min_p)),
             "temperature, top_p and min_p must be finite"),
            (self.seed is None or -(2**63) <= self.seed < 2**64, "seed must fit in 64 bits"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (sum(bool(x) for x in (self.json_schema, self.regex, self.lark)) <= 1,
             "json_schema and regex are mutually exclusive"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must hold non-empty strings"),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def greedy(self) -> bool:
        """Below SGLang's sampling epsilon a temperature is greedy (dividing by it overflows)."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @classmethod
    def from_dict(cls, params: dict | SamplingParams | None) -> SamplingParams:
        """Build from SGLang's JSON shape; unknown keys are kept in `extra`, wrong types are errors."""
        if isinstance(params, SamplingParams):
            return params
        params = dict(params or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: params.pop(k) for k in list(params) if k in known and params[k] is not None}
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = (kwargs["stop"],)
        for key in ("stop", "stop_token_ids"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        try:
            return cls(**kwargs, extra=params)
        except TypeError as exc:
            raise InvalidRequest(f"bad sampling_params: {exc}") from exc


class Sampler:
    """Picks the next token from one row of logits. One per request (it owns the seeded RNG)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> int:
        """logits: [vocab] float32; mask: [vocab] bool of allowed tokens (grammar), or None."""
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        p = self.params
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p > 0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0)
        if p.top_p < 1:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            drop = cumulative - sorted_probs > p.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))
