"""README's table of `radixagent serve` flags is the parser's: every flag listed, none that the
parser lacks, each with the parser's default (a newcomer reads the README, not the code)."""

from __future__ import annotations

import re
from pathlib import Path

from runtime.server.args import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| ([^|]*) \|", re.M)


def _table() -> dict[str, str]:
    text = README.read_text()
    section = text[text.index("## Command line") : text.index("### Why a token was not cached")]
    return {flag: default.strip() for flag, default in ROW.findall(section)}


def _shown(action) -> str:
    if action.nargs == 0:
        return "off"
    if action.default in (None, ""):
        return "—"
    return f"`{action.default}`"


def test_every_serve_flag_is_in_the_readme_with_its_default() -> None:
    rows = _table()
    flags = {
        max(a.option_strings, key=len): a
        for a in build_parser()._actions
        if a.option_strings and a.dest != "help"
    }
    assert sorted(set(flags) - set(rows)) == [], "flags missing from README's serve table"
    assert sorted(set(rows) - set(flags)) == [], "README lists flags serve does not take"
    wrong = {f: (rows[f], _shown(a)) for f, a in flags.items() if rows[f] != _shown(a)}
    assert wrong == {}, "README's default differs from the parser's (README, parser)"
