"""runtime/engine/running_text.py: a running request's text decoded from a verified anchor is the
whole decode, token by token, and each step decodes a bounded number of tokens."""

from __future__ import annotations

from pathlib import Path

from runtime.engine.running_text import LAG, RunningText

MIXED = "日本語のテキスト、絵文字😀🎉と ASCII: naïve café — «quotes» ∑x² and code `f(x) -> y`\n"


def test_equals_the_whole_decode_at_every_token_and_decodes_little(engine):
    tok = engine.tokenizer
    text = Path("README.md").read_text()[:6000] + MIXED * 20
    ids = engine.tokenize(text)
    seen: list[int] = []

    def decode(part):
        seen.append(len(part))
        return tok.decode(part, skip_special_tokens=True)

    running = RunningText()
    for n in range(1, len(ids) + 1):
        assert running.update(ids[:n], decode) == tok.decode(ids[:n], skip_special_tokens=True), n
    assert len(ids) > 1500 and running.anchor >= len(ids) - 2 * LAG  # the anchor kept up
    # every decode after warm-up is a short window (longer only while a character straddles the
    # place the anchor would move to), against up to len(ids) tokens for the whole decode
    assert max(seen[4 * LAG :]) <= 4 * LAG


class Spaced:
    """A decoder that is not compositional: decode(a + b) != decode(a) + decode(b)."""

    @staticmethod
    def decode(ids):
        return " ".join(map(str, ids))


def test_a_decoder_that_does_not_split_keeps_the_anchor_at_the_start():
    running = RunningText()
    ids = list(range(100))
    for n in range(1, len(ids) + 1):
        assert running.update(ids[:n], Spaced.decode) == Spaced.decode(ids[:n])
    assert running.anchor == 0


def test_ids_that_do_not_extend_the_last_ones_start_over():
    running = RunningText()
    ids = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz" * 4]
    decode = lambda part: "".join(map(chr, part))  # noqa: E731
    running.update(ids, decode)
    assert running.anchor > 0
    assert running.update(ids[:5], decode) == "abcde" and running.anchor == 0
