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
    ebnf: str | None = None
    # SGLang's penalties: frequency/presence subtract per generated occurrence / once; repetition
    # divides positive (multiplies negative) logits of tokens already generated
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    #: end-of-sequence and stop_token_ids are masked until this many tokens were generated
    min_new_tokens: int = 0
    #: token id -> bias added to its logit (OpenAI's and SGLang's logit_bias; keys as strings or ints)
    logit_bias: dict | None = None
    # output shaping (SGLang's names and defaults)
    spaces_between_special_tokens: bool = True  # passed to the tokenizer's decode, as SGLang does
    no_stop_trim: bool = False  # keep the matched stop string / stop token in the text
    stream_interval: int = 1  # a streamed chunk every this many tokens
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (
                all(math.isfinite(x) for x in (self.temperature, self.top_p, self.min_p)),
                "temperature, top_p and min_p must be finite",
            ),
            (self.seed is None or -(2**63) <= self.seed < 2**64, "seed must fit in 64 bits"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (
                sum(x is not None for x in (self.json_schema, self.regex, self.ebnf, self.lark)) <= 1,
                "json_schema, regex and ebnf are mutually exclusive",
            ),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (0 < self.repetition_penalty <= 2, "repetition_penalty must be in (0, 2]"),
            (self.min_new_tokens >= 0, "min_new_tokens must be >= 0"),
            (
                len(self.logit_bias or ()) <= MAX_LOGIT_BIAS,
                f"logit_bias: {len(self.logit_bias or ())} entries; the limit is {MAX_LOGIT_BIAS}",
            ),
            (len(self.stop) <= MAX_STOP, f"stop: {len(self.stop)} strings; the limit is {MAX_STOP}"),
            (
                all(len(s) <= MAX_STOP_CHARS for s in self.stop if isinstance(s, str)),
                f"stop: a string longer than {MAX_STOP_CHARS} characters (the limit)",
            ),
            (
                _bias_ok(self.logit_bias),
                "logit_bias must map token ids (>= 0) to finite numbers in [-100, 100]",
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop must hold non-empty strings"),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids must be >= 0"),
            (self.stream_interval >= 1, "stream_interval must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        """Below SGLang's sampling epsilon a temperature is greedy (dividing by it overflows)."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @classmethod
    def from_dict(cls, params: dict | SamplingParams | None) -> SamplingParams:
        """Build from SGLang's JSON shape; unknown keys and wrong types are errors."""
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
        if "min_tokens" in params and "min_new_tokens" not in kwargs:  # vLLM's / OpenAI clients' name
            kwargs["min_new_tokens"] = params.pop("min_tokens")
        unknown = sorted(k for k in params if k not in known)  # (known keys left here are None: unset)
        if unknown:  # nothing accepted and dropped: a key this engine does not know is an error
            raise InvalidRequest(f"sampling_params: unknown key(s) {unknown} (see docs/compat.md)")
        params = {}
        try:
            return cls(**kwargs, extra=params)
        except TypeError as exc:
            raise InvalidRequest(f"bad sampling_params: {exc}") from exc


#: bounds on what a request's steps read: the bias is one index_add of at most this many entries and
#: a step searches only the new tail of the text for each stop string
MAX_LOGIT_BIAS = 1024
MAX_STOP = 64
MAX_STOP_CHARS = 1024


def _bias_ok(bias: dict | None) -> bool:
    if bias is None:
        return True
    if not isinstance(bias, dict):
        return False
    for key, value in bias.items():
        id_ok = (isinstance(key, int) and not isinstance(key, bool) and key >= 0) or (
            isinstance(key, str) and key.isascii() and key.isdigit()
        )  # "²".isdigit() too, but int() fails
        value_ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (id_ok and value_ok and -100 <= value <= 100):
            return False
    return True


class Sampler:
    """Picks the next token from one row of logits. One per request (it owns the seeded RNG and
    the counts of generated tokens that the penalties read)."""

    def __init__(self, params: SamplingParams, stop_ids: set[int] | frozenset[int] = frozenset()) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.stop_ids = sorted(set(stop_ids) | set(params.stop_token_ids))  # what min_new_tokens holds back
        self.counts: torch.Tensor | None = None  # [vocab] generated occurrences, for penalties
        self.generated = 0
        self._bias_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def _bias(self, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """logit_bias as (ids, values) tensors, built once per request: a step adds them in one
        index_add (a Python loop over every entry once cost 0.48 s per step for the whole vocabulary)."""
        if self._bias_rows is None:
            pairs = [(int(k), float(v)) for k, v in (self.params.logit_bias or {}).items() if int(k) < vocab]
            ids = torch.tensor([k for k, _ in pairs], dtype=torch.long)
            self._bias_rows = ids, torch.tensor([v for _, v in pairs], dtype=torch.float32)
        return self._bias_rows

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """SGLang's order: logit_bias, then penalties, then min_new_tokens' mask. Returns a new row
        (or `logits` itself when nothing applies); this is the distribution logprobs report."""
        p = self.params
        if not (p.logit_bias or p.penalized or self.generated < p.min_new_tokens):
            return logits
        logits = logits.clone()
        vocab = logits.shape[-1]
        if p.logit_bias:
            ids, biases = self._bias(vocab)
            logits.index_add_(0, ids, biases.to(logits.dtype))
        if p.penalized and self.counts is not None:
            seen = self.counts > 0
            if p.repetition_penalty != 1.0:
                scaled = torch.where(logits < 0, logits * p.repetition_penalty, logits / p.repetition_penalty)
                logits = torch.where(seen, scaled, logits)
            logits -= p.frequency_penalty * self.counts + p.presence_penalty * seen.float()
        if self.generated < p.min_new_tokens:
            held = [t for t in self.stop_ids if t < vocab]
            logits[held] = float("-inf")
        return logits

    def observe(self, token: int, vocab: int) -> None:
        """Count one generated token (penalties and min_new_tokens read the counts)."""
        self.generated += 1
        if self.params.penalized:
            if self.counts is None:
                self.counts = torch.zeros(vocab)
            self.counts[token] += 1

    def logprobs(self, adjusted: torch.Tensor) -> torch.Tensor:
        """What an output token's logprob is taken from, as SGLang by default: the adjusted logits,
        divided by the temperature unless greedy; before top-k / top-p / min-p and grammar masks."""
        p = self.params
        return torch.log_softmax(adjusted if p.greedy else adjusted / p.temperature, dim=-1)

    def __call__(
        self, logits: torch.Tensor, mask: torch.Tensor | None = None, argmax: int | None = None
    ) -> int:
        """logits: [vocab] float32; mask: [vocab] bool of allowed tokens (grammar), or None;
        argmax: torch.argmax(logits) where the caller has it (a step takes every row's at once)."""
        p = self.params
        if p.greedy and mask is None and argmax is not None:
            return argmax
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
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
