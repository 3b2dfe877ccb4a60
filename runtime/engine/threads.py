"""Which threads run torch work, and why it matters on a CPU.

torch's CPU build parallelises each op with OpenMP (libgomp), and libgomp keeps one worker pool
per thread that ever ran a parallel op, alive until that thread exits. Once the process holds more
pool threads than CPU cores, libgomp stops letting idle workers spin and every parallel op pays a
futex wake-up: a 2k-context decode step measured 17 ms with one pool and 25-28 ms with two
(the scheduler's and the main thread's, the latter created just by loading the model there).

So the engine keeps its torch work off the caller's thread: weights are loaded and the KV pool
allocated in a short-lived thread (its pool goes when it exits), and the scheduler thread exits
50 ms after its last step (scheduler.py's IDLE_EXIT_S), so engines that take turns (cached and
uncached siblings, a float32 and an int4 engine in one benchmark) hold two pools only that long.
The same holds for the caller's own torch work: on a long-lived thread it throttles every engine
step after it (the default engine's decode at 2k, ~200 -> ~66 tok/s on 2 cores after one 1024^2
matmul on the main thread); `in_fresh_thread` runs it where its pool goes with the thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_fresh_thread(fn: Callable[[], T], name: str = "radixagent-load") -> T:
    """fn() in a new thread that exits before this returns; exceptions propagate."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as pool:
        return pool.submit(fn).result()
