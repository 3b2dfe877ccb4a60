"""Token logprobs of one request, in SGLang's shapes.

What is reported (as SGLang does by default, see docs/flow.md):
- prompt ("input") logprobs: log_softmax of the raw logits at the previous position, for the prompt
  tokens from `logprob_start_len` on. The first of them has logprob None (SGLang never computes the
  position before `logprob_start_len`), so `logprob_start_len=0` scores the whole prompt but its
  first token. The default (-1) returns no prompt logprobs.
- output logprobs: log_softmax of the logits the sampler draws from after logit_bias, penalties and
  min_new_tokens, divided by the temperature unless greedy; top-k / top-p / min-p and grammar masks
  are not applied (they only narrow what can be drawn).

Logprobs and the prefix cache: positions served from the cache have no logits, and SGLang limits
a logprob request's match to `logprob_start_len`. Here a logprob request reads nothing from the
cache (it still publishes its prompt for later requests): the CPU kernels round a row differently
depending on how many rows and keys its step has (measured: MKL's float32 matmul for 1-3, 5-7 and
9-11 rows, SDPA at query-block boundaries such as 33-35 queries, ~1e-6 in a logprob), so numbers
computed after a cache hit would differ from an uncached run's in the sixth digit. Computing the
whole prompt makes them bit-identical to a `prefix_cache=False` run, which is what evals compare.
With `enable_deterministic_inference` (runtime/model/attention.py) rows do not depend on their step, so
a logprob request is served from the cache up to `logprob_start_len`, as in SGLang.

Twins: logprob requests with the same prompt (the choices of n > 1, a client retrying) still share
its prefill. The first one computes the whole prompt and publishes it; `PrefillMemo` keeps what the
KV alone cannot give back (the last prompt position's logits and the prompt logprobs) with the tree
node its publish ended at, when the tree took that request's own KV (not an older copy computed in
other chunks). While that node stays in the tree, the tree's path for the prompt is the very KV the
logits were computed beside: a twin takes the whole prompt from it and adopts the rest, so its
numbers are the first one's bits. Otherwise it computes its prompt as above.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from runtime.errors import InvalidRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from runtime.cache.radix import TreeNode
    from runtime.engine.generation import LogprobArgs

#: SGLang returns at most this many top logprobs per position (OpenAI's top_logprobs max is 20)
MAX_TOP_LOGPROBS = 20

Top = list[tuple[float, int]]


@dataclass(frozen=True, slots=True)
class LogprobSpec:
    """What one request asks for (SGLang's `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
    `return_text_in_logprobs`). `start` is resolved: the first prompt position reported."""

    start: int
    top_n: int = 0
    with_text: bool = False

    @classmethod
    def resolve(cls, prompt_len: int, start: int | None, top_n: int | None, with_text: bool) -> LogprobSpec:
        start = -1 if start is None else start
        top_n = top_n or 0
        if start < -1:
            raise InvalidRequest("logprob_start_len must be >= -1 (-1: output logprobs only)")
        if start > prompt_len:
            raise InvalidRequest(
                f"logprob_start_len={start} is higher than the number of input tokens ({prompt_len})"
            )
        if not 0 <= top_n <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
        return cls(prompt_len if start == -1 else start, top_n, bool(with_text))


@dataclass(slots=True)
class LogprobState:
    spec: LogprobSpec
    prompt_len: int
    input_vals: list[float | None] = field(default_factory=list)
    input_top: list[Top | None] = field(default_factory=list)
    output_vals: list[float] = field(default_factory=list)
    output_top: list[Top] = field(default_factory=list)
    #: the SGLang rows meta_info already built, by field: a stream asks for them at every step,
    #: and building them all again (a tokenizer decode per token and per top entry) made each
    #: step O(length)
    _rows: dict[str, list] = field(default_factory=dict)
    _texts: dict[int, str | None] = field(default_factory=dict)  # token id -> its text

    @classmethod
    def requested(cls, args: LogprobArgs, prompt_len: int) -> LogprobState | None:
        """The state a request's logprob arguments ask for; None without `return_logprob` (as
        SGLang: the other logprob arguments mean nothing without it)."""
        if not args.return_logprob:
            return None
        with_text = bool(args.return_text_in_logprobs)
        spec = LogprobSpec.resolve(prompt_len, args.logprob_start_len, args.top_logprobs_num, with_text)
        return cls(spec, prompt_len)

    def __post_init__(self) -> None:
        if self.spec.start < self.prompt_len:  # SGLang's first reported prompt token has no logprob
            self.input_vals.append(None)
            self.input_top.append(None)

    @property
    def wants_prompt(self) -> bool:
        """True when logits of prompt positions other than the last are needed."""
        return self.spec.start < self.prompt_len - 1

    def match_limit(self, deterministic: bool) -> int:
        """Prompt tokens the cache may serve a logprob request: none (see the module docstring),
        unless the engine is deterministic (the same bits either way): those before
        `logprob_start_len`, whose logits are not reported."""
        return min(self.spec.start, self.prompt_len - 1) if deterministic else 0

    def logits_from(self, chunk_start: int, chunk_len: int) -> int:
        """Index within a prefill chunk from which every row's logits are needed (-1: only the last)."""
        if not self.wants_prompt or chunk_start + chunk_len <= self.spec.start:
            return -1
        return max(self.spec.start - chunk_start, 0)

    def record_prompt(self, logits: torch.Tensor, first_pos: int, input_ids: list[int]) -> None:
        """logits: [n, vocab] for prompt positions first_pos .. first_pos+n-1 (the last prompt position
        included, when in the chunk). Position p's row scores token p+1."""
        upto = min(first_pos + logits.shape[0], self.prompt_len - 1)  # the last row samples
        if upto <= first_pos:
            return
        rows = torch.log_softmax(logits[: upto - first_pos].float(), dim=-1)
        targets = torch.tensor(input_ids[first_pos + 1 : upto + 1])
        self.input_vals += rows.gather(1, targets[:, None])[:, 0].tolist()
        self.input_top += _top(rows, self.spec.top_n) if self.spec.top_n else [None] * len(targets)

    def covered_by(self, spec: LogprobSpec) -> bool:
        """Whether a twin computed under `spec` reported every prompt logprob this state reports
        (the same top-k: a longer top list cut short could order ties differently)."""
        return spec.start <= self.spec.start and spec.top_n == self.spec.top_n

    def adopt(self, twin: PrefillRecord) -> None:
        """Take the prompt logprobs a twin computed (`covered_by(twin.spec)` holds)."""
        if self.spec.start >= self.prompt_len:
            return  # no prompt position reported
        skip = self.spec.start - twin.spec.start + 1  # this state's first position has no logprob
        self.input_vals[1:] = twin.input_vals[skip:]
        self.input_top[1:] = twin.input_top[skip:]
        self._rows.pop("input_token_logprobs", None)  # rows built before now scored other values
        self._rows.pop("input_top_logprobs", None)

    def record_output(self, logprobs: torch.Tensor, token: int) -> None:
        """logprobs: [vocab] of the distribution the token was drawn from (Sampler.logprobs)."""
        self.output_vals.append(float(logprobs[token]))
        if self.spec.top_n:
            self.output_top.append(_top(logprobs[None], self.spec.top_n)[0])

    def meta_info(
        self, input_ids: list[int], output_ids: list[int], tokenizer: PreTrainedTokenizerBase | None
    ) -> dict[str, object]:
        """SGLang's meta_info fields: lists of (logprob, token_id, text-or-None) per position. Rows
        are built once and kept (only the new positions cost a step); each call returns new lists."""
        decode = self._decoder(tokenizer)
        reported = len(self.input_vals)
        ins = self._grow(
            "input_token_logprobs",
            reported,
            lambda i: self._triple(self.input_vals[i], input_ids[self.spec.start + i], decode),
        )
        outs = self._grow(
            "output_token_logprobs",
            len(self.output_vals),
            lambda i: self._triple(self.output_vals[i], output_ids[i], decode),
        )
        out: dict[str, object] = {
            "input_token_logprobs": ins,
            "output_token_logprobs": outs,
            "output_token_logprobs_length": len(outs),
        }
        if self.spec.top_n:
            out["input_top_logprobs"] = self._grow(
                "input_top_logprobs", reported, lambda i: _triples(self.input_top[i], decode)
            )
            out["output_top_logprobs"] = self._grow(
                "output_top_logprobs", len(self.output_top), lambda i: _triples(self.output_top[i], decode)
            )
        return out

    def _grow(self, name: str, count: int, build: Callable[[int], object]) -> list:
        rows = self._rows.setdefault(name, [])
        rows.extend(build(i) for i in range(len(rows), count))
        return list(rows)

    @staticmethod
    def _triple(value: float | None, token: int, decode: Callable[[int], str | None]) -> tuple:
        return (value, token, decode(token))

    def _decoder(self, tokenizer: PreTrainedTokenizerBase | None) -> Callable[[int], str | None]:
        if not self.spec.with_text or tokenizer is None:
            return lambda _token_id: None
        texts = self._texts

        def decode(token_id: int) -> str | None:
            if token_id not in texts:
                texts[token_id] = str(tokenizer.decode([token_id]))  # one id list: one string
            return texts[token_id]

        return decode


@dataclass(frozen=True, slots=True)
class PrefillRecord:
    """What a logprob request's prefill left beside its KV (see the module docstring)."""

    logits: torch.Tensor  # [vocab]: the last prompt position's raw logits
    spec: LogprobSpec
    input_vals: tuple[float | None, ...]
    input_top: tuple[Top | None, ...]
    node: TreeNode  # where the prompt's path ended in the tree when published (evicted: no twin)
    weights_version: int


#: prompts whose prefill results are kept (each holds one vocabulary-sized logits row)
PREFILL_MEMO_SIZE = 16


class PrefillMemo:
    """Recent logprob prefills by (namespace, prompt), least recently used dropped first."""

    def __init__(self, size: int = PREFILL_MEMO_SIZE) -> None:
        self.size = size
        self._records: OrderedDict[tuple[str, tuple[int, ...]], PrefillRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def remember(self, namespace: str, prompt: Sequence[int], record: PrefillRecord) -> None:
        key = (namespace, tuple(prompt))
        self._records[key] = record
        self._records.move_to_end(key)
        while len(self._records) > self.size:
            self._records.popitem(last=False)

    def find(
        self, namespace: str, prompt: Sequence[int], state: LogprobState, weights_version: int
    ) -> PrefillRecord | None:
        """A record a request with this prompt and logprob state may adopt, if one is kept."""
        key = (namespace, tuple(prompt))
        record = self._records.get(key)
        if record is None or record.weights_version != weights_version or not state.covered_by(record.spec):
            return None
        self._records.move_to_end(key)
        return record

    def forget(self, namespace: str, prompt: Sequence[int]) -> None:
        self._records.pop((namespace, tuple(prompt)), None)

    def clear(self) -> None:
        self._records.clear()


def _top(rows: torch.Tensor, k: int) -> list[Top]:
    values, ids = torch.topk(rows, k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]


def _triples(top: Top | None, decode: Callable[[int], str | None]) -> list[tuple] | None:
    return None if top is None else [(lp, tid, decode(tid)) for lp, tid in top]
