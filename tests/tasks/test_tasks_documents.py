"""Document loading (text, Markdown, PDF), normalization, line numbers and passage search."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks import data_path
from tasks.documents import (
    check_fits,
    load_document,
    normalize_text,
    number_lines,
    parse_line_refs,
    search_document,
)
from tasks.errors import TaskInputError
from tasks.questions import load_questions


def tiny_pdf(lines: list[str]) -> bytes:
    """A minimal valid one-page PDF (Helvetica text, correct xref offsets), built by hand."""
    body = " ".join(f"({line}) Tj T*" for line in lines)
    content = f"BT /F1 12 Tf 72 720 Td 14 TL {body} ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        "/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{obj}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_normalize_is_canonical_and_idempotent() -> None:
    raw = "\ufeff\n\nTitle\t here  \r\n\r\n\r\n\r\n  - item   one \u00a0\rlast\x00 line\n\n"
    text = normalize_text(raw)
    assert text == "Title here\n\n  - item one\nlast line"
    assert normalize_text(text) == text


def test_load_text_and_markdown(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo  words\r\n")
    (tmp_path / "b.md").write_text("# Head\n\n\n\nbody\n", encoding="utf-8")
    doc = load_document(tmp_path / "a.txt")
    assert (doc.text, doc.kind, doc.lines) == ("one\ntwo words", "text", ["one", "two words"])
    md = load_document(tmp_path / "b.md")
    assert (md.text, md.kind) == ("# Head\n\nbody", "markdown")


@pytest.mark.parametrize("content", [b"", b"  \n\t\r\n  \n"])
def test_empty_document_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(TaskInputError, match="empty document") as info:
        load_document(path)
    assert info.value.path == str(path) and info.value.line is None


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TaskInputError, match="file not found") as info:
        load_document(tmp_path / "nope.txt")
    assert str(info.value).startswith(str(tmp_path / "nope.txt"))
    with pytest.raises(TaskInputError, match="not a regular file"):
        load_document(tmp_path)
    assert isinstance(info.value, ValueError)


def test_undecodable_text_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"fine\nstill fine\ncaf\xe9\n")
    with pytest.raises(TaskInputError) as info:
        load_document(path)
    assert info.value.line == 3
    assert f"{path}:3:" in str(info.value)


def test_pdf_text_is_extracted(tmp_path: Path) -> None:
    path = tmp_path / "tiny.pdf"
    path.write_bytes(tiny_pdf(["The secret code of the blue door is 4172.", "Second line here."]))
    doc = load_document(path)
    assert doc.kind == "pdf"
    assert "The secret code of the blue door is 4172." in doc.text
    assert "Second line here." in doc.text
    assert normalize_text(doc.text) == doc.text


def test_pdf_detected_by_magic_bytes(tmp_path: Path) -> None:
    path = tmp_path / "report.bin"
    path.write_bytes(tiny_pdf(["Magic bytes decide."]))
    assert load_document(path).kind == "pdf"


def test_unreadable_and_blank_pdf(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not really a pdf\n")
    with pytest.raises(TaskInputError, match="unreadable PDF"):
        load_document(broken)
    from pypdf import PdfWriter

    blank = tmp_path / "blank.pdf"
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    with blank.open("wb") as handle:
        writer.write(handle)
    with pytest.raises(TaskInputError, match="empty document.*OCR"):
        load_document(blank)


def test_number_lines_and_refs() -> None:
    text = "alpha\n\ngamma\ndelta"
    assert number_lines(text) == "L1: alpha\nL2:\nL3: gamma\nL4: delta"
    assert number_lines(text, 3, 9) == "L3: gamma\nL4: delta"
    assert parse_line_refs("See L3 and L12-L14, also L7-8; L3 again, not XL5") == [3, 7, 8, 12, 13, 14]
    assert parse_line_refs("L9-L2") == [9]


def test_search_finds_the_needle_line() -> None:
    filler = [f"Paragraph {i} talks about startups, essays and programming languages." for i in range(60)]
    filler.insert(41, "The secret code of the blue door is 4172.")
    text = "\n".join(filler)
    hits = search_document(text, "What is the secret code of the blue door?", k=3)
    assert hits[0].first_line <= 42 <= hits[0].last_line
    assert "L42: The secret code of the blue door is 4172." in hits[0].text
    assert len(hits) <= 3
    assert all(
        a.last_line < b.first_line or b.last_line < a.first_line for a in hits for b in hits if a is not b
    )
    assert search_document(text, "What is the secret code of the blue door?", k=3) == hits
    assert search_document(text, "what is the", k=3) == []
    assert search_document(text, "zebra xylophone", k=3) == []


def test_search_finds_bundled_needles() -> None:
    """Top-1 passage covers the needle for every single-fact question of the bundled sets."""
    folder = data_path("needle")
    checked = 0
    for questions_file in sorted(folder.glob("questions_*.jsonl")):
        text = load_document(
            folder / questions_file.name.replace("questions_", "doc_").replace(".jsonl", ".txt")
        ).text
        for q in load_questions(questions_file):
            if q.meta["kind"] != "needle":
                continue
            top = search_document(text, q.question, k=1)[0]
            assert set(range(top.first_line, top.last_line + 1)) & set(q.meta["lines"]), (q.id, top)
            checked += 1
    assert checked >= 24


def test_check_fits_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("word " * 50, encoding="utf-8")
    doc = load_document(path)
    check_fits(doc, 50, 50)
    with pytest.raises(TaskInputError, match="51 tokens; at most 50") as info:
        check_fits(doc, 51, 50)
    assert info.value.path == str(path)
