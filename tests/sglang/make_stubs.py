"""Test-only stand-ins written into the SGLang test venv (never into the repository's packages).

- `torchvision`: the PyPI wheel does not load beside the CPU torch build; SGLang imports it only for
  multimodal preprocessing, so an import stub whose attributes are inert placeholders is enough.
- `sgl_kernel`: SGLang's CPU engine imports the CPU build of sgl_kernel (not on PyPI) at module load;
  for a llama model on the torch_native backend no native op is called, so an import-only stand-in
  is enough. Any op that *is* called raises, naming itself.

Usage: python make_stubs.py SITE_PACKAGES_DIR  (writes SITE/_radixagent_stubs/ and a .pth file)
"""

from __future__ import annotations

import sys
from pathlib import Path

STUB = '''"""Test-only stand-in (radixagent tests/sglang/make_stubs.py); not the real package."""
import sys as _sys


class _Inert:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise NotImplementedError(f"{__name__} stand-in called")

    def __getattr__(self, name):
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert()
'''

PACKAGES = {
    "torchvision": [
        "transforms",
        "transforms.functional",
        "transforms.v2",
        "transforms.v2.functional",
        "io",
        "ops",
        "utils",
        "models",
        "datasets",
        "transforms.InterpolationMode",
    ],
    "sgl_kernel": [
        "common_ops",
        "allreduce",
        "elementwise",
        "gemm",
        "moe",
        "sampling",
        "attention",
        "utils",
        "kvcacheio",
        "memory",
        "quantization",
        "speculative",
        "top_k",
        "cpu",
    ],
}
VERSIONS = {"torchvision": "0.28.0", "sgl_kernel": "0.0.0+stub"}


def write(site: Path) -> Path:
    root = site / "_radixagent_stubs"
    for pkg, subs in PACKAGES.items():
        for mod in ["", *subs]:
            path = root / pkg / Path(*mod.split(".")) if mod else root / pkg
            path.mkdir(parents=True, exist_ok=True)
            text = STUB + f"__version__ = {VERSIONS[pkg]!r}\n"
            (path / "__init__.py").write_text(text)
    (site / "_radixagent_stubs.pth").write_text(str(root) + "\n")
    return root


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
