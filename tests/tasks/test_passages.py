"""Sentence search with paragraph ids, odd queries, and the QA answer constraint (no model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.documents import load_document
from tasks.passages import SentenceIndex, number_paragraphs, paragraph_spans, sentence_of
from tasks.qa import answer_schema, judge, qa_examples, search_tool

DOC = (
    "The harbour town wakes early. The boats leave before dawn.\n"
    "Fishermen mend their nets on the quay.\n"
    "\n"
    "The secret code of the green door is 5120. Nobody else knows it.\n"
    "\n"
    "Dmitri's sister is Hana. She paints boats.\n"
    "Markets open at noon.\n"
    "\n"
    "Hana lives in Porto, near the river."
)


@pytest.fixture()
def doc(tmp_path: Path):
    path = tmp_path / "doc.txt"
    path.write_text(DOC, encoding="utf-8")
    return load_document(path)


def test_paragraph_ids_number_blank_line_separated_blocks(doc):
    assert paragraph_spans(doc.lines) == [(1, 2), (4, 4), (6, 7), (9, 9)]
    numbered = number_paragraphs(doc.text).split("\n")
    assert numbered[0].startswith("[P1] The harbour") and numbered[3].startswith("[P2] The secret")
    assert numbered[1] == "Fishermen mend their nets on the quay."  # only first lines carry the id


@pytest.mark.parametrize("query", ["secret code green door", "", "search_document", "the of and", "zzz qqq"])
def test_odd_queries_still_find_the_question_sentence(doc, query):
    found = SentenceIndex(doc).search(query, "What is the secret code of the green door?")
    assert found[0].render() == "[P2] The secret code of the green door is 5120."


def test_no_match_at_all_is_said_plainly(doc):
    result = search_tool(doc).invoke({"query": "volcano eruption"})
    assert result.ok and result.result.startswith("No sentence of the document matches")


def test_two_hop_question_gets_the_bridge_sentence(doc):
    found = SentenceIndex(doc).search("Dmitri sister city", "In which city does Dmitri's sister live?")
    texts = [s.render() for s in found]
    assert texts[0] == "[P3] Dmitri's sister is Hana."
    assert "[P4] Hana lives in Porto, near the river." in texts


def test_answer_is_a_span_of_the_evidence_and_not_found_only_when_uncovered(doc):
    index = SentenceIndex(doc)
    evidence = index.search("", "What is the secret code of the green door?")
    pattern = answer_schema(evidence, "What is the secret code of the green door?")["pattern"].strip("^$")
    assert re.fullmatch(pattern, "5120") and re.fullmatch(pattern, "the green door is 5120")
    assert not re.fullmatch(pattern, "not found") and not re.fullmatch(pattern, "6120")
    loose = answer_schema(evidence, "What colour is the captain's horse?")["pattern"].strip("^$")
    assert re.fullmatch(loose, "not found")


def test_judge_cites_the_paragraph_of_the_span(doc):
    evidence = SentenceIndex(doc).search("", "In which city does Dmitri's sister live?")
    verdict = judge(doc, "In which city does Dmitri's sister live?", "Porto", evidence)
    assert verdict.ok and verdict.paragraphs == (4,) and verdict.cited_by == "evidence"
    assert sentence_of("Porto near the river", evidence).paragraph == 4
    assert judge(doc, "Who is it?", "not found", evidence).ok


def test_examples_answers_are_spans_of_their_observations():
    for example in qa_examples():
        (call,) = example.calls
        texts = [line.split("] ", 1)[1] for line in call.result.split("\n")]
        pattern = answer_schema_from(texts)
        assert re.fullmatch(pattern, example.answer), example.answer


def answer_schema_from(texts: list[str]) -> str:
    from agent.constraints import span_pattern

    return span_pattern(texts, extra=["not found"]).strip("^$")


@pytest.mark.parametrize(
    ("span", "sentence", "question", "expanded"),
    [
        (
            "the red bridge at dusk",
            "The best thing to do in Lisbon is walk across the red bridge at dusk.",
            "What is the best thing to do in Lisbon?",
            "walk across the red bridge at dusk",
        ),
        (
            "loose brick",
            "Bruno hid the spare key under the loose brick by the gate.",
            "Where did Bruno hide the spare key?",
            "under the loose brick by the gate",
        ),
        (
            "2965",
            "The secret code of the orange door is 2965.",
            "What is the secret code of the orange door?",
            "2965",
        ),
        ("1975", "Omar was born in 1975, in a small town.", "In what year was Omar born?", "in 1975"),
        (
            "secret code",
            "The secret code of the orange door is 2965.",
            "What is the code of the orange door?",
            "secret code",
        ),
    ],
)
def test_expand_answer_widens_a_tail_to_the_answering_phrase(span, sentence, question, expanded):
    from tasks.passages import Sentence, expand_answer

    assert expand_answer(span, Sentence(1, 1, 1, sentence), question) == expanded


def test_a_sentence_ends_before_a_closing_quote_too(tmp_path: Path):
    path = tmp_path / "quoted.txt"
    path.write_text('He said "a problem well put is half solved." Amara\'s tortoise is named Pixel.\n')
    index = SentenceIndex(load_document(path))
    assert [s.text for s in index.sentences] == [
        'He said "a problem well put is half solved."',
        "Amara's tortoise is named Pixel.",
    ]
    assert index.search("Amara tortoise name")[0].text == "Amara's tortoise is named Pixel."


def test_an_answer_that_only_names_the_link_of_a_two_hop_question_is_rejected(doc):
    question = "In which city does Dmitri's sister live?"
    evidence = SentenceIndex(doc).search("Dmitri sister city", question)
    verdict = judge(doc, question, "Dmitri's sister is Hana", evidence)
    assert not verdict.ok and "[P4]" in verdict.reason
    assert judge(doc, question, "Hana lives in Porto", evidence).ok
    assert judge(doc, "Who is Dmitri's sister?", "Hana", evidence).ok  # the link is the answer here
