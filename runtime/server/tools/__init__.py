"""Tool calls: formats, prompts, grammars, parsing and streaming."""
