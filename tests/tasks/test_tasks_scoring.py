"""Scoring must reproduce LongBench's qa_f1_score (SQuAD normalization) exactly."""

from __future__ import annotations

import re
import string
from collections import Counter

import pytest

from tasks.scoring import (
    Score,
    contains_all,
    contains_match,
    exact_match,
    extract_number,
    normalize_answer,
    numeric_match,
    qa_f1_score,
    score_answer,
    token_f1,
)


# ---- LongBench metrics.py, verbatim (the reference our implementation must agree with) ----
def _lb_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _lb_f1_score(prediction, ground_truth, **kwargs):
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def _lb_qa_f1_score(prediction, ground_truth, **kwargs):
    normalized_prediction = _lb_normalize_answer(prediction)
    normalized_ground_truth = _lb_normalize_answer(ground_truth)
    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    return _lb_f1_score(prediction_tokens, ground_truth_tokens)


CASES = [
    ("Denver Broncos", "Denver Broncos"),
    ("the Broncos", "Denver Broncos"),
    ("Paris is the capital of France.", "Paris"),
    ("The secret code is 4172.", "4172"),
    ("  An apple, a pear & THE plum!! ", "apple pear plum"),
    ("", "anything"),
    ("no overlap here", "completely different"),
    ("the the the", "a an the"),
    ("Under the doormat.", "under the doormat"),
    ("1,024 tokens", "1024 tokens"),
    ("Theatre and anthem", "the atre an them"),
    ("eat eat a sandwich", "eat a sandwich in Dolores Park"),
]


@pytest.mark.parametrize(("prediction", "gold"), CASES)
def test_matches_longbench_reference(prediction: str, gold: str) -> None:
    assert normalize_answer(prediction) == _lb_normalize_answer(prediction)
    assert qa_f1_score(prediction, gold) == pytest.approx(_lb_qa_f1_score(prediction, gold), abs=0)


def test_known_values() -> None:
    assert normalize_answer("The Cat, a Dog!") == "cat dog"
    assert qa_f1_score("Denver Broncos", "Denver Broncos") == 1.0
    assert qa_f1_score("the Broncos", "Denver Broncos") == pytest.approx(2 / 3)
    assert qa_f1_score("Paris is the capital", "Paris") == pytest.approx(0.5)  # P=1/3, R=1
    assert token_f1([], ["x"]) == 0.0


def test_exact_and_contains() -> None:
    assert exact_match("Under the Doormat.", "under the doormat") == 1.0
    assert exact_match("the doormat, I think", "doormat") == 0.0
    assert contains_match("I think the code is 4172.", "4172") == 1.0
    # Word boundaries: a gold number never matches inside a longer one.
    assert contains_match("41720", "4172") == 0.0
    assert contains_match("anything", "the") == 0.0  # normalizes to empty: never a match


def test_best_over_multiple_golds() -> None:
    score = score_answer("Sofia hid it under the doormat.", ["under the doormat", "doormat"])
    assert score.contains == 1.0
    assert score.exact == 0.0
    assert score.f1 == pytest.approx(
        max(
            qa_f1_score(score_p, g)
            for score_p in ["Sofia hid it under the doormat."]
            for g in ["under the doormat", "doormat"]
        )
    )
    assert score_answer("Doormat", ["under the doormat", "doormat"]) == Score(1.0, 1.0, 1.0)
    assert score_answer("x", "y") == Score(0.0, 0.0, 0.0)
    assert score_answer("x", []) == Score(0.0, 0.0, 0.0)


def test_contains_all_is_order_free() -> None:
    assert contains_all("ZGQPG, DHVZP and VZNMB", ["DHVZP", "ZGQPG", "VZNMB"]) == 1.0
    assert contains_all("DHVZP only", ["DHVZP", "ZGQPG"]) == 0.5
    assert contains_all("anything", []) == 0.0


def test_numbers() -> None:
    assert extract_number("First 3 apples, so the answer is 1,024.") == 1024.0
    assert extract_number("no digits") is None
    assert numeric_match("The total is 120 cookies.", "120") == 1.0
    assert numeric_match("120.0", "120") == 1.0
    assert numeric_match("121", "120") == 0.0
    assert numeric_match("no idea", "120") == 0.0
