"""What a scripted engine tells the server about itself (`Engine.info()`), for HTTP-layer tests
whose engine is a fake."""

from __future__ import annotations

from runtime.config import EngineConfig
from runtime.engine.stats import EngineInfo


def fake_info(model_path: str, context_length: int, vocab_size: int) -> EngineInfo:
    return EngineInfo(
        model_path=model_path,
        served_model_name=model_path,
        context_length=context_length,
        vocab_size=vocab_size,
        eos_token_ids=(),
        architecture="fake",
        weight_bytes=0,
        config=EngineConfig(),
    )
