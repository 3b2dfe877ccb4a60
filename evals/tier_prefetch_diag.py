"""Round 2's prefetch procedure, instrumented (issue #24): `python -m evals.tier_prefetch_diag`.

The prefix is evicted (`evict_all`) before a 1 s tool wait; prints per round whether the context
was resident just before the resume, when the prefetch landed (seconds after tool_wait), the
TTFT of the next step and where its cached tokens came from; then a pool hit and a tier load
right away for reference. This is what showed why round 2 measured no gain (docs/tier.md).
"""

import tempfile
import time

from evals.bench_tier import GREEDY, _evict_all, _landing, _prompt, _resident, _ttft
from runtime import Engine
from runtime.env import offline_hub


def main() -> None:
    offline_hub()
    engine = Engine(max_total_tokens=1024)
    tokens = 2048
    with tempfile.TemporaryDirectory() as tmp:
        ids = _prompt(engine, tokens)
        engines = {
            m: engine.sibling(
                enable_hierarchical_cache=True,
                hicache_storage_dir=tmp,
                hicache_prefetch=m == "on",
                radix_eviction_policy="session",
                max_total_tokens=4 * tokens,
            )
            for m in ("on", "off")
        }
        for eng in engines.values():
            first = eng.generate(input_ids=ids, sampling_params=GREEDY, session_id="s")
            _evict_all(eng)
            eng.tier.tier.flush(120)
        step = ids + first["output_ids"] + engine.tokenize(" ok")
        for rnd in range(3):
            for mode, eng in engines.items():
                _evict_all(eng)
                t0 = time.monotonic()
                eng.session_event("s", "tool_wait", expected_s=1.0)
                landed = _landing(eng, step, t0, 1.2, 0, 0.02)
                res = _resident(eng, step)
                eng.session_event("s", "resume")
                t, r = _ttft(eng, step, session_id="s")
                m = r["meta_info"]
                print(
                    f"round {rnd} {mode}: resident before resume {res} landed {landed} ttft {t:.3f} e2e {m['e2e_latency']:.3f} "
                    f"cached {m['cached_tokens']} of {len(step)} details {m['cached_tokens_details']}",
                    flush=True,
                )
        # reference: pool hit right away, and tier load right away
        eng = engines["off"]
        t, r = _ttft(eng, step, session_id="s")
        print("pool hit now", round(t, 3), r["meta_info"]["cached_tokens_details"])
        _evict_all(eng)
        t, r = _ttft(eng, step, session_id="s")
        print("tier load now", round(t, 3), r["meta_info"]["cached_tokens_details"])
        t, r = _ttft(eng, step, session_id="s")
        print("pool hit now", round(t, 3), r["meta_info"]["cached_tokens_details"])
        for e in engines.values():
            e.shutdown()
    engine.shutdown()


if __name__ == "__main__":
    main()
