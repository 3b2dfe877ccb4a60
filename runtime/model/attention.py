"""Batch-invariant attention in torch ops: `--enable-deterministic-inference` where the native
kernel is not used (no C compiler, `attention_backend="torch_native"`, float16 activations).
With the kernel, the exact path (runtime/model/decode_kernel.py `prefill_attention`) replaces it.

Why: the CPU kernels pick their blocking from the shapes of a call, so one token's attention
output depends on how many tokens share its call. Measured on this CPU (torch 2.13, MKL):
SDPA's flash kernel gives a different last bit for a decode token (1 query) than for the same
token inside a prefill chunk, and for suffixes of 2, 3, 33 or 513 tokens; MKL's fp32 matmuls
differ for 1-3 rows, and their reduction over keys changes with the number of keys. A few
ulps at one token are enough to flip a later greedy choice (bf16 activations amplify them:
int4wo-32 gave 0% identical cached-vs-cold decodes at 512-4000 tokens of context).

How: every query token at position p runs the same arithmetic whatever batch, chunk or cache
hit it comes in. Positions are grouped in blocks of `BLOCK` aligned at absolute multiples of
BLOCK; a token of block [f, f + BLOCK) attends to the keys [0, f + BLOCK) in one matmul for
the scores and one for the values (fixed shapes per position; keys past p are masked, and
the storage past the sequence holds finite values: the pool is zero-filled and padded by
BLOCK rows, scratches likewise), with at least 4 query rows per call (the smallest count
MKL's batched matmul treats like any other: measured for 1..199 rows). The cost, measured
in `evals/benchmarks/kv_attention.py`-style runs: ~1 ms per decode step (30 layers) at 512-4000 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: positions per attention block: keys are read up to the end of the query's block
BLOCK = 64
#: fewest query rows per matmul: MKL's small-matrix paths (1-3 rows) reduce differently
MIN_ROWS = 4


def padded_length(length: int) -> int:
    """How many key rows attention reads for a sequence of `length` positions."""
    return -(-length // BLOCK) * BLOCK


@dataclass(frozen=True, slots=True)
class InvariantAttention:
    """Causal GQA attention in float32 whose result for a position does not depend on the
    other positions of the call. Rows of a kv head's query matrix are (token, head of the
    group) pairs, token-major, so one mask row per token serves its G heads."""

    heads: int
    kv_heads: int
    head_dim: int
    #: bool [BLOCK * G, BLOCK]: row t*G + h hides key j > t of the same block
    hidden: torch.Tensor

    @classmethod
    def build(cls, heads: int, kv_heads: int, head_dim: int, device: str) -> InvariantAttention:
        g = heads // kv_heads
        tri = torch.ones(BLOCK, BLOCK, dtype=torch.bool, device=device).triu_(1)
        return cls(heads, kv_heads, head_dim, tri.repeat_interleave(g, 0))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
        """q: [n, heads, hd] for positions start..start+n-1 (float32); k, v: [kv_heads, >=
        padded_length(start + n), hd], finite past the sequence. Returns [n, heads * hd]."""
        n, kvh, hd = q.shape[0], self.kv_heads, self.head_dim
        g = self.heads // kvh
        qs = (q * hd**-0.5).view(n, kvh, g, hd).transpose(0, 1).reshape(kvh, n * g, hd)
        if n == 1:  # a decode step: one block, no loop
            return self._block(qs, k, v, start, start + 1).reshape(1, -1)
        out = torch.empty(kvh, n * g, hd, dtype=q.dtype, device=q.device)
        p = start
        while p < start + n:
            end = min(start + n, (p // BLOCK + 1) * BLOCK)
            rows = slice((p - start) * g, (end - start) * g)
            out[:, rows] = self._block(qs[:, rows], k, v, p, end)
            p = end
        return out.view(kvh, n, g, hd).transpose(0, 1).reshape(n, -1)

    def _block(self, qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int, end: int) -> torch.Tensor:
        """Positions p..end-1, all within one block: [kv_heads, rows, hd] of outputs."""
        first = p // BLOCK * BLOCK
        keys = first + BLOCK
        rows = qs.shape[1]
        if rows < MIN_ROWS:
            qs = torch.cat([qs, qs.new_zeros(qs.shape[0], MIN_ROWS - rows, qs.shape[2])], 1)
        g = self.heads // self.kv_heads
        scores = torch.bmm(qs, k[:, :keys].transpose(1, 2))
        scores[:, :rows, first:].masked_fill_(self.hidden[(p - first) * g : (end - first) * g], float("-inf"))
        out = torch.bmm(torch.softmax(scores, -1), v[:, :keys])
        return out[:, :rows]
