"""Documents for long-document QA: load (text, Markdown, PDF), normalize, number lines, search.

The normalized text is what the prompt embeds, so normalization happens exactly once, here, and is
deterministic and idempotent: the same file always yields the same bytes, which keeps the document
head of every prompt byte-stable (and therefore cacheable).
"""

from __future__ import annotations

import io
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from tasks.errors import TaskInputError

DocumentKind = Literal["text", "markdown", "pdf"]

_MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
# Characters that only ever mean "a space" or "a line break"; everything else in C0/C1 is noise.
_TRANSLATE = str.maketrans(
    {
        "\u00a0": " ",
        "\u2007": " ",
        "\u202f": " ",
        "\f": "\n",
        "\v": "\n",
        "\u2028": "\n",
        "\u2029": "\n",
        "\u200b": None,
        "\ufeff": None,
        "\u00ad": None,
    }
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INNER_SPACES = re.compile(r"(?<=\S) {2,}")
_BLANK_RUNS = re.compile(r"\n{3,}")


@dataclass(frozen=True, slots=True)
class Document:
    """A loaded document: `text` is normalized (LF line ends, no trailing spaces, no outer blank lines)."""

    path: str
    text: str
    kind: DocumentKind

    @property
    def lines(self) -> list[str]:
        """The text's lines; line n (1-based, as cited "Ln") is lines[n - 1]."""
        return self.text.split("\n")


class Passage(NamedTuple):
    """A search hit: lines first_line..last_line (1-based, inclusive), rendered with line numbers."""

    first_line: int
    last_line: int
    score: float
    text: str


def normalize_text(text: str) -> str:
    """Canonical form of a document's text; normalize_text(normalize_text(t)) == normalize_text(t).

    NFC unicode, LF line ends, tabs expanded, odd spaces and control characters removed, runs of
    inner spaces collapsed (leading indentation kept: Markdown lists and code depend on it), trailing
    spaces stripped, at most one blank line in a row, no blank lines at either end.
    """
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").translate(_TRANSLATE)
    lines = []
    for line in text.split("\n"):
        line = _CONTROL.sub("", line.expandtabs(4)).rstrip()
        lines.append(_INNER_SPACES.sub(" ", line))
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def load_document(path: str | Path) -> Document:
    """Load a plain-text, Markdown or PDF file as a normalized Document.

    PDF is recognized by its magic bytes (or a .pdf suffix). Raises TaskInputError for a missing
    file, an undecodable text file (naming the line), an unreadable PDF, or an empty document.
    """
    path = Path(path)
    if not path.exists():
        raise TaskInputError(path, None, "file not found")
    if not path.is_file():
        raise TaskInputError(path, None, "not a regular file")
    data = path.read_bytes()
    if data.startswith(b"%PDF-") or path.suffix.lower() == ".pdf":
        kind: DocumentKind = "pdf"
        raw = _pdf_text(path, data)
    else:
        kind = "markdown" if path.suffix.lower() in _MARKDOWN_SUFFIXES else "text"
        raw = _decode_text(path, data)
    text = normalize_text(raw)
    if not text.strip():
        hint = " (no extractable text: a scanned PDF needs OCR first)" if kind == "pdf" else ""
        raise TaskInputError(path, None, f"empty document{hint}")
    return Document(path=str(path), text=text, kind=kind)


def check_fits(doc: Document, num_tokens: int, max_tokens: int) -> None:
    """Raise TaskInputError naming the file when the document alone needs more than `max_tokens`.

    The caller measures `num_tokens` with its model's tokenizer and passes what the context leaves
    for the document (context window minus system prompt, question and answer room).
    """
    if num_tokens > max_tokens:
        raise TaskInputError(
            doc.path,
            None,
            f"document is {num_tokens} tokens; at most {max_tokens} fit in the model's context",
        )


def _decode_text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TaskInputError(path, line, f"not UTF-8 text (byte 0x{data[exc.start]:02x})") from exc


def _pdf_text(path: Path, data: bytes) -> str:
    from pypdf import PdfReader  # imported here: only PDF inputs pay for it

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise TaskInputError(path, None, "unreadable PDF: encrypted with a password")
        pages = [page.extract_text() or "" for page in reader.pages]
    except TaskInputError:
        raise
    except Exception as exc:  # pypdf raises many types (PdfReadError, ValueError, KeyError...) on bad files
        raise TaskInputError(path, None, f"unreadable PDF: {type(exc).__name__}: {exc}") from exc
    # A blank line between pages keeps the last line of one page from merging into the next.
    return "\n\n".join(page.strip("\n") for page in pages)


def number_lines(text: str, first: int = 1, last: int | None = None) -> str:
    """Lines first..last (1-based, inclusive; default all) prefixed "L<n>: " for citation."""
    lines = text.split("\n")
    last = len(lines) if last is None else min(last, len(lines))
    first = max(first, 1)
    return "\n".join(f"L{n}: {lines[n - 1]}".rstrip() for n in range(first, last + 1))


_LINE_REF = re.compile(r"\bL(\d+)(?:\s*[-\u2013]\s*L?(\d+))?\b")


def parse_line_refs(text: str) -> list[int]:
    """Line numbers cited in `text` as "L12", "L12-L14" or "L12-14"; sorted, without duplicates."""
    refs: set[int] = set()
    for match in _LINE_REF.finditer(text):
        start = int(match.group(1))
        end = int(match.group(2) or start)
        # A reversed or huge range is a model slip, not a request to quote the whole document.
        refs.update(range(start, min(end, start + 50) + 1) if end >= start else [start])
    return sorted(refs)


# ---- search ---------------------------------------------------------------------------------

# Question words and glue: they match everywhere and would drown the terms that locate a passage.
_STOPWORD_TEXT = (
    "a an the and or but if of to in on at by for with from as is are was were be been being do does did "
    "what which who whom whose when where why how that this these those it its i you he she we they "
    "me him her us them my your his our their there here not no yes so than then too very can could "
    "would should will shall may might must has have had about into over under according document text "
    "tell please say said"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+")


def search_terms(text: str) -> list[str]:
    """Lowercased word tokens without stopwords, with a crude plural strip (same for query and text)."""
    terms = []
    for word in _WORD.findall(text.lower()):
        if word in _STOPWORDS or (len(word) == 1 and not word.isdigit()):
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        terms.append(word)
    return terms


def search_document(text: str, query: str, k: int = 3, window: int = 3) -> list[Passage]:
    """The k best non-overlapping passages of `window` lines for `query`, best first (BM25).

    Every window of `window` consecutive lines starting at a non-blank line is a candidate; ties go
    to the earlier window, so results are deterministic. Only windows sharing a term with the query
    are returned (possibly fewer than k, or none).
    """
    if k < 1 or window < 1:
        raise ValueError(f"k and window must be >= 1 (got k={k}, window={window})")
    lines = text.split("\n")
    # Sorted, so float sums run in one fixed order whatever the hash seed: ties stay ties.
    query_terms = sorted(set(search_terms(query)))
    if not query_terms:
        return []
    line_terms = [search_terms(line) for line in lines]
    starts = [i for i, line in enumerate(lines) if line.strip()]
    windows = [Counter(t for terms in line_terms[i : i + window] for t in terms) for i in starts]
    scores = _bm25(windows, query_terms)
    ranked = sorted(range(len(starts)), key=lambda j: (-scores[j], starts[j]))
    taken: list[Passage] = []
    for j in ranked:
        if scores[j] <= 0 or len(taken) == k:
            break
        first, last = starts[j] + 1, min(starts[j] + window, len(lines))
        if any(first <= p.last_line and p.first_line <= last for p in taken):
            continue
        taken.append(Passage(first, last, round(scores[j], 6), number_lines(text, first, last)))
    return taken


def _bm25(docs: list[Counter[str]], query_terms: list[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    n = len(docs)
    if n == 0:
        return []
    avg_len = sum(sum(d.values()) for d in docs) / n or 1.0
    idf = {}
    for term in query_terms:
        df = sum(1 for d in docs if term in d)
        idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scores = []
    for d in docs:
        length_norm = k1 * (1 - b + b * sum(d.values()) / avg_len)
        scores.append(sum(idf[t] * d[t] * (k1 + 1) / (d[t] + length_norm) for t in query_terms if t in d))
    return scores
