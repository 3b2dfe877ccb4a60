"""Check an answer against the document lines it cites (the QA agent's `verify` step).

An answer is supported when most of its content words occur on the cited lines (each widened by one
line on either side: a sentence wraps over line ends) and those lines are about the question (they
share at least half of the question's content words). An answer that cites no lines, or the wrong
ones, is grounded: the best passage containing its words is searched for, and cited instead when it
supports the answer. Pure functions, no model: the runner turns a verdict into accept / backtrack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.documents import Document, parse_line_refs, search_document, search_terms

#: fraction of the answer's content words that the cited lines must contain
MIN_ANSWER_SUPPORT = 0.5
#: fraction of the question's content words that the cited lines must contain
MIN_QUESTION_OVERLAP = 0.5

_REFS = re.compile(r"\(?\[?\s*(?:lines?\s*)?\bL\d+(?:\s*[-\u2013,]\s*L?\d+)*\s*\]?\)?\.?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`ok`: supported. `citations`: the supporting lines (1-based). `cited_by`: "model" when the
    model's own citations held, "verifier" when the lines were found by grounding, "evidence" when the
    answer is a span of a search result, None when rejected."""

    ok: bool
    reason: str
    claim: str
    citations: tuple[int, ...] = ()
    cited_by: str | None = None
    paragraphs: tuple[int, ...] = ()  # paragraph ids ("[Pn]") of the evidence, where known


def strip_refs(answer: str) -> str:
    """The answer without its line references ("4269 (L6-L7)" -> "4269")."""
    return " ".join(_REFS.sub(" ", answer).split()).strip(" ,;:")


def _window_terms(doc_lines: list[str], lines: list[int]) -> set[str]:
    wide = {n + d for n in lines for d in (-1, 0, 1)}
    return {t for n in sorted(wide) if 1 <= n <= len(doc_lines) for t in search_terms(doc_lines[n - 1])}


def _fraction(terms: set[str], pool: set[str]) -> float:
    return len(terms & pool) / len(terms) if terms else 1.0


def _supports(doc_lines: list[str], lines: list[int], claim: set[str], question: set[str]) -> bool:
    pool = _window_terms(doc_lines, lines)
    return _fraction(claim, pool) >= MIN_ANSWER_SUPPORT and _fraction(question, pool) >= MIN_QUESTION_OVERLAP


def _ground(
    doc: Document, claim_text: str, claim: set[str], question: set[str], question_text: str
) -> list[int]:
    """Lines of the best passage that supports the claim and is about the question ([] if none)."""
    doc_lines = doc.lines
    for query in (f"{claim_text} {question_text}", claim_text):
        for passage in search_document(doc.text, query, k=3, window=3):
            span = list(range(passage.first_line, passage.last_line + 1))
            if not _supports(doc_lines, span, claim, question):
                continue
            wanted = claim | question
            hit = [n for n in span if wanted & set(search_terms(doc_lines[n - 1]))]
            return hit or span
    return []


def check_answer(doc: Document, question: str, answer: str) -> Verdict:
    """Verify `answer` (which may cite lines as "L12", "L12-L14") against the document."""
    claim_text = strip_refs(answer)
    claim, asked = set(search_terms(claim_text)), set(search_terms(question))
    if not claim:
        return Verdict(False, "the answer is empty; give the words of the document that answer", claim_text)
    doc_lines = doc.lines
    cited = [n for n in parse_line_refs(answer) if 1 <= n <= len(doc_lines)]
    if cited and _supports(doc_lines, cited, claim, asked):
        return Verdict(True, "supported by the cited lines", claim_text, tuple(cited), "model")
    found = _ground(doc, claim_text, claim, asked, question)
    if found:
        return Verdict(True, "supported by the document", claim_text, tuple(found), "verifier")
    missing = sorted(claim - {t for line in doc_lines for t in search_terms(line)})
    if missing:
        reason = f"the document never says {' '.join(missing[:6])!r}"
    else:
        reason = "no lines of the document about the question say this"
    return Verdict(False, reason + "; search the document for the question's key words", claim_text)
