"""Answer scoring against gold answers: exact match, contains, token F1 (LongBench / SQuAD).

`normalize_answer` and `qa_f1_score` reproduce LongBench's metrics.py (itself SQuAD's evaluation
script) exactly: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace,
then F1 over the multiset of whitespace tokens. With several acceptable golds, a prediction gets the
best score over them, as LongBench's eval.py does.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

Metric = Callable[[str, str], float]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class Score(NamedTuple):
    """Scores of one prediction, each the best over the acceptable golds (1.0 / 0.0 for the booleans)."""

    exact: float
    contains: float
    f1: float


def normalize_answer(text: str) -> str:
    """SQuAD/LongBench normalization: lower, remove punctuation, remove articles, fix whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """F1 of two token multisets (LongBench's f1_score): 0 when nothing is shared."""
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, gold: str) -> float:
    """LongBench's qa_f1_score: token F1 of the normalized strings."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized strings are equal (SQuAD's exact_match_score)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def contains_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized gold occurs in the normalized prediction on word boundaries.

    Word boundaries keep "417" from matching inside "4172"; an empty normalized gold never matches.
    """
    needle = normalize_answer(gold)
    if not needle:
        return 0.0
    return float(f" {needle} " in f" {normalize_answer(prediction)} ")


def best_over(metric: Metric, prediction: str, golds: Sequence[str]) -> float:
    """The best score of `prediction` over the acceptable golds (0.0 when there are none)."""
    return max((metric(prediction, gold) for gold in golds), default=0.0)


def score_answer(prediction: str, golds: str | Sequence[str]) -> Score:
    """Exact, contains and F1 of one prediction, each the best over the golds."""
    gold_list = [golds] if isinstance(golds, str) else list(golds)
    return Score(
        exact=best_over(exact_match, prediction, gold_list),
        contains=best_over(contains_match, prediction, gold_list),
        f1=best_over(qa_f1_score, prediction, gold_list),
    )


def contains_all(prediction: str, items: Sequence[str]) -> float:
    """Fraction of `items` contained in the prediction (RULER's string_match_all, on normalized text).

    For answers that are sets (e.g. "every variable assigned 12345"), where order must not matter.
    """
    if not items:
        return 0.0
    return sum(contains_match(prediction, item) for item in items) / len(items)


def extract_number(text: str) -> float | None:
    """The last number written in `text` ("1,024" -> 1024.0), or None: how a worked answer ends."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", ""))


def numeric_match(prediction: str, gold: str) -> float:
    """1.0 when the last number in the prediction equals the gold number (within 1e-6)."""
    got, want = extract_number(prediction), extract_number(gold)
    if got is None or want is None:
        return 0.0
    return float(abs(got - want) <= 1e-6 * max(1.0, abs(want)))
