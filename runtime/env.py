"""The one module that reads or sets environment variables. Imports nothing heavy, so callers
can pin the environment before torch or transformers load."""

from __future__ import annotations

import os


def env_str(name: str) -> str | None:
    return os.environ.get(name) or None


def offline_hub() -> None:
    """Nothing may download weights at run time: pin the HF hub offline before transformers loads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers' GGUF loader draws a tqdm bar per tensor; our CLIs draw their own (rich).
    os.environ.setdefault("TQDM_DISABLE", "1")
