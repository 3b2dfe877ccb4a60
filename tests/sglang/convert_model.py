"""Re-save the bundled GGUF model as an HF folder (config + safetensors + tokenizer) for SGLang,
which cannot load the GGUF path itself. Usage: python convert_model.py OUT_DIR"""

from __future__ import annotations

import sys
from pathlib import Path

from runtime.model.files import default_model_path


def convert(out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    gguf = Path(default_model_path())
    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype="float32", **kwargs)
    # The weights are already de-quantized to float32; drop the GGUF quantizer so that
    # save_pretrained accepts the model ("quantized with gguf and is not serializable").
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(convert(Path(sys.argv[1])))
