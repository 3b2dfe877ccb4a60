"""Paragraph ids and sentence search for the QA agent's `search_document` tool.

A paragraph is a run of non-blank lines; paragraph n (1-based) is cited "[Pn]". The search ranks
sentences (BM25 over the same terms as `tasks.documents.search_terms`) and answers with the best
ones, each prefixed by its paragraph id: short evidence that a small model can copy from.

Odd queries are defined, not guessed at: the query is searched together with the question being
answered, so an empty query, the tool's own name or a query of stopwords still finds the
question's passages; a query with no matching sentence at all gets `NO_MATCH`. A bridge step
follows a two-hop question: a name that the best sentence introduces (capitalized, not in the
query) is searched for too, and its best sentence is added.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from agent.constraints import span_words
from tasks.documents import Document, _bm25, search_terms

#: a sentence ends at . ! or ?, also when a closing quote or bracket follows it ('... solution." Amara')
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)]))\s+(?=[A-Z0-9\"'(\u201c\u2018])")
NAME = re.compile(r"\b[A-Z][a-z]{2,}\b")
MAX_SENTENCE_WORDS = 48
#: a runner-up sentence is returned only when it scores at least this fraction of the best
RUNNER_UP = 0.6


@dataclass(frozen=True, slots=True)
class Sentence:
    paragraph: int  # 1-based paragraph id
    first_line: int  # 1-based document line where the paragraph starts
    last_line: int
    text: str

    def render(self) -> str:
        return f"[P{self.paragraph}] {self.text}"


def paragraph_spans(lines: list[str]) -> list[tuple[int, int]]:
    """(first_line, last_line), 1-based inclusive, of each paragraph (non-blank line runs)."""
    spans: list[tuple[int, int]] = []
    start = None
    for n, line in enumerate(lines, start=1):
        if line.strip() and start is None:
            start = n
        elif not line.strip() and start is not None:
            spans.append((start, n - 1))
            start = None
    if start is not None:
        spans.append((start, len(lines)))
    return spans


def number_paragraphs(text: str) -> str:
    """The document with "[Pn] " before the first line of each paragraph (lines otherwise as is)."""
    lines = text.split("\n")
    for index, (first, _) in enumerate(paragraph_spans(lines), start=1):
        lines[first - 1] = f"[P{index}] {lines[first - 1]}"
    return "\n".join(lines)


def _clip(sentence: str) -> str:
    words = sentence.split()
    return sentence if len(words) <= MAX_SENTENCE_WORDS else " ".join(words[:MAX_SENTENCE_WORDS]) + " ..."


@dataclass(frozen=True)
class SentenceIndex:
    """Every sentence of a document, with its paragraph; built once per document."""

    doc: Document

    @cached_property
    def sentences(self) -> list[Sentence]:
        lines = self.doc.lines
        out = []
        for index, (first, last) in enumerate(paragraph_spans(lines), start=1):
            joined = " ".join(line.strip() for line in lines[first - 1 : last])
            out += [Sentence(index, first, last, _clip(s)) for s in _SENTENCE_END.split(joined) if s.strip()]
        return out

    @cached_property
    def _terms(self) -> list[list[str]]:
        return [search_terms(s.text) for s in self.sentences]

    def rank(self, query: str) -> list[tuple[float, Sentence]]:
        from collections import Counter

        terms = sorted(set(search_terms(query)))
        if not terms:
            return []
        scores = _bm25([Counter(t) for t in self._terms], terms)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(scores[i], self.sentences[i]) for i in order if scores[i] > 0]

    def search(self, query: str, question: str = "", k: int = 2) -> list[Sentence]:
        """The k best sentences for query + question, plus one bridge sentence (see module doc)."""
        ranked = self.rank(f"{query} {question}")[:k]
        # A runner-up far below the best match is noise a small model might copy from.
        found = [s for score, s in ranked if score >= RUNNER_UP * ranked[0][0]]
        if found:
            asked = {w.lower() for w in NAME.findall(f"{query} {question}")}
            bridge = [n for n in NAME.findall(found[0].text) if n.lower() not in asked and search_terms(n)]
            for name in bridge[:1]:
                extra = [s for _, s in self.rank(f"{name} {question}") if s not in found and name in s.text]
                found += extra[:1]
        return found


def sentence_of(span: str, sentences: list[Sentence]) -> Sentence | None:
    """The first of `sentences` that contains `span` (the evidence an extractive answer came from)."""
    needle = " ".join(span_words(span)).lower()
    for sentence in sentences:
        if needle and f" {needle} " in f" {' '.join(span_words(sentence.text)).lower()} ":
            return sentence
    return None


#: verbs that only link the question's subject to its answer ("The code of X is 2965")
_LINKS = frozenset({"is", "are", "was", "were"})
_CLAUSE_END = (",", ";", ":")


def _tokens(text: str) -> tuple[list[str], list[str]]:
    """(raw tokens, span words): the same tokenization as `span_words`, with the raw forms kept."""
    raw = [w for w in re.findall(r"[^\s\"\\]+", text) if span_words(w)]
    return raw, [span_words(w)[0] for w in raw]


def expand_answer(span: str, sentence: Sentence, question: str) -> str:
    """Widen an extractive answer to the whole answering phrase of its sentence.

    The answering phrase is what the sentence says after the question's last content word (and a
    linking "is"/"was"), up to the end of its clause: "The best thing to do in Lisbon is walk
    across the red bridge at dusk." answers with "walk across the red bridge at dusk". A small model
    often copies only the tail of that phrase ("the red bridge at dusk"); a span inside the phrase
    becomes the phrase. A span elsewhere in the sentence is returned as it is.
    """
    raw, words = _tokens(sentence.text)
    asked = set(search_terms(question))
    hits = [i for i, w in enumerate(words) if asked & set(search_terms(w))]
    wanted = span_words(span)
    if not hits or not wanted:
        return span
    start = hits[-1] + 1
    while start < len(words) and words[start].lower() in _LINKS:
        start += 1
    end = next((i + 1 for i in range(start, len(raw)) if raw[i].endswith(_CLAUSE_END)), len(raw))
    lowered = [w.lower() for w in words]
    target = [w.lower() for w in wanted]
    for i in range(len(words) - len(target) + 1):
        if lowered[i : i + len(target)] == target:
            inside = start <= i and i + len(target) <= end
            return " ".join(words[start:end]) if inside and end > start else span
    return span
