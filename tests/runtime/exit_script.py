"""A user script that ends while the engine's worker is busy (tests/runtime/test_interpreter_exit.py).

`python exit_script.py MODE`, MODE one of:
- `after-long`: one long request (~6k prompt tokens), then the script ends at once;
- `during-request`: a daemon thread's long request is still running when the script ends;
- `during-stream`: a stream has yielded a few tokens and is left open when the script ends.
It prints `ending` just before the end; the test asserts the exit code is 0.
"""

from __future__ import annotations

import sys
import threading
import time

from runtime import Engine


def long_prompt(engine: Engine, tokens: int) -> str:
    text, words = "", 0
    while len(engine.tokenize(text)) < tokens:
        words += 200
        text = " ".join(f"note{i % 97} and" for i in range(words))
    return text


def main(mode: str) -> object:
    engine = Engine(max_total_tokens=8192)
    if mode == "after-long":
        out = engine.generate(prompt=long_prompt(engine, 6000), sampling_params={"max_new_tokens": 4})
        print("served", out["meta_info"]["prompt_tokens"], flush=True)
    elif mode == "during-request":
        prompt = long_prompt(engine, 3000)
        worker = threading.Thread(
            target=engine.generate,
            kwargs={"prompt": prompt, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}},
            daemon=True,
        )
        worker.start()
        while engine.get_cache_stats()["running"] == 0:
            time.sleep(0.05)
        time.sleep(0.5)  # inside the prefill's forward
    elif mode == "during-stream":
        stream = engine.generate_stream(
            prompt=long_prompt(engine, 2000), sampling_params={"max_new_tokens": 500, "ignore_eos": True}
        )
        for _, _chunk in zip(range(3), stream, strict=False):
            pass
        print("ending", flush=True)
        return stream  # still open when the interpreter exits
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print("ending", flush=True)
    return engine


if __name__ == "__main__":
    kept = main(sys.argv[1])  # module-level: alive until the interpreter finalizes
