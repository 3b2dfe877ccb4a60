"""`make stress`: the long hardening scenarios in one bounded run on loopback, with a short report.

    python -m evals.hardening.stress --out DIR [--quick]

Stages, one after the other, each bounded in time (a stage that fails or overruns is reported,
and the next still runs):
  fuzz       pytest tests/hardening/test_fuzz.py with RADIXAGENT_FUZZ_LONG=1 (--quick: the fast mode)
  requests   pytest tests/hardening/test_fuzz_requests.py (same modes) against a `radixagent serve
             --trace-dir` subprocess: grammars and schemas ($ref chains and cycles, depth, size,
             regexes) in every field that carries one (tools on chat, Responses and Messages too),
             conflicting framing headers, nested message fields, this round's endpoints (Responses,
             Messages, stored responses, aborts, weights, logprobs with n), the trace directory under
             a new session and salt per request; server alive, RSS and open fds after
  soak       evals.hardening.soak: 32 sessions for 3 minutes (--quick: 8 sessions, 20 s)
  isolation  evals.hardening.isolation against `radixagent serve --require-cache-salt` (--quick: fewer samples)
  faults     pytest tests/hardening/test_faults.py (--quick: without the SIGTERM test, which loads
             the model once more)
Every server listens on 127.0.0.1 and is stopped (SIGTERM, then kill) before the stage returns.
Writes DIR/results.json and DIR/report.md (requests tried, 4xx/5xx counts, max RSS vs KV pool,
leaked locks, isolation result); the soak's rss.png and server log land in DIR/soak.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.hardening import isolation, soak
from runtime.server.cli import serve_argv
from runtime.server.ready import wait_ready

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class StressConfig:
    quick: bool = False
    soak_sessions: int = 32
    soak_seconds: float = 180.0
    isolation_samples: int = 10
    fuzz_timeout_s: float = 1800.0
    faults_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.soak_sessions < 1 or self.soak_seconds <= 0 or self.isolation_samples < 1:
            raise ValueError("soak_sessions, soak_seconds and isolation_samples must be positive")

    @classmethod
    def quick_config(cls) -> StressConfig:
        return cls(
            quick=True,
            soak_sessions=8,
            soak_seconds=20.0,
            isolation_samples=4,
            fuzz_timeout_s=900.0,
            faults_timeout_s=300.0,
        )


# ---- stages ---------------------------------------------------------------------------------------


def _pytest(args: list[str], timeout_s: float, log: Path, env: dict[str, str]) -> tuple[int | None, str]:
    """Run pytest in a subprocess (its own process group, killed on overrun); (rc or None, output)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    log.write_text(out)
    return rc, out


def _counts(out: str) -> dict[str, int]:
    """pytest's summary line: {"passed": n, "failed": n, ...}."""
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", tail)}


def run_fuzz(cfg: StressConfig, out: Path) -> dict[str, Any]:
    env = {} if cfg.quick else {"RADIXAGENT_FUZZ_LONG": "1"}
    started = time.monotonic()
    rc, text = _pytest(["tests/hardening/test_fuzz.py"], cfg.fuzz_timeout_s, out / "fuzz.log", env)
    match = re.search(r"fuzz: (\d+) requests, statuses (\{[^}]*\})", text)
    statuses = {int(k): v for k, v in ast.literal_eval(match.group(2)).items()} if match else {}
    return {
        "mode": "fast" if cfg.quick else "long",
        "requests": int(match.group(1)) if match else 0,
        "statuses": statuses,
        "4xx": sum(v for k, v in statuses.items() if 400 <= k < 500),
        "5xx": sum(v for k, v in statuses.items() if k >= 500),
        "tests": _counts(text),
        "timed_out": rc is None,
        "seconds": round(time.monotonic() - started, 1),
        "ok": rc == 0 and match is not None,
    }


def run_requests(cfg: StressConfig, out: Path) -> dict[str, Any]:
    env = {} if cfg.quick else {"RADIXAGENT_FUZZ_LONG": "1"}
    started = time.monotonic()
    rc, text = _pytest(
        ["tests/hardening/test_fuzz_requests.py"], cfg.fuzz_timeout_s, out / "requests.log", env
    )
    match = re.search(r"fuzz-requests: (\{.*\})", text)
    found = json.loads(match.group(1)) if match else {}
    statuses = {k: int(v) for k, v in found.get("statuses", {}).items()}
    return {
        "mode": "fast" if cfg.quick else "long",
        "requests": int(found.get("requests", 0)),
        "statuses": statuses,
        "4xx": sum(v for k, v in statuses.items() if k.isdigit() and 400 <= int(k) < 500),
        "5xx": sum(v for k, v in statuses.items() if k.isdigit() and int(k) >= 500),
        "crashes": found.get("crashes"),
        "rss_before_mib": found.get("rss_before_mib"),
        "rss_after_mib": found.get("rss_after_mib"),
        "fds_before": found.get("fds_before"),
        "fds_after": found.get("fds_after"),
        "tests": _counts(text),
        "timed_out": rc is None,
        "seconds": round(time.monotonic() - started, 1),
        "ok": rc == 0 and match is not None,
    }


def run_soak(cfg: StressConfig, out: Path) -> dict[str, Any]:
    results = soak.run(soak.SoakConfig(sessions=cfg.soak_sessions, seconds=cfg.soak_seconds), out / "soak")
    keep = (
        "requests",
        "answered",
        "rejected_503",
        "disconnected",
        "other",
        "other_details",
        "wall_s",
        "throughput_rps",
        "latency_p50_s",
        "latency_p95_s",
        "rss_start_mib",
        "rss_max_mib",
        "rss_end_mib",
        "rss_growth_last_third_mib",
        "pool_capacity_mib",
        "leaked_locks",
        "server_exit_code",
    )
    return {
        **{k: results.get(k) for k in keep},
        "sessions": cfg.soak_sessions,
        "integrity_ok": bool(results["integrity"].get("ok")),
        "ok": bool(results["ok"]) and results.get("server_exit_code") == 0,
    }


def run_isolation(cfg: StressConfig, out: Path) -> dict[str, Any]:
    port = soak.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        *serve_argv(port),
        "--max-total-tokens",
        "16384",
        "--require-cache-salt",
        "--log-level",
        "warning",
    ]
    with (out / "isolation-server.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc)
            result = isolation.measure(url, samples=cfg.isolation_samples, words=150)
        finally:
            exit_code = _stop(proc)
    data = result.as_dict()
    for key in ("a_repeat_ttft_s", "b_on_a_prompt_ttft_s", "b_fresh_ttft_s"):
        data[key] = [round(t, 4) for t in data[key]]  # type: ignore[union-attr]
    isolated = result.b_on_a_prompt_cached_tokens == 0 and 0.7 <= result.ratio_b_on_a_vs_fresh <= 1.4
    return {
        **data,
        "requests": 1 + 4 * result.samples,
        "server_exit_code": exit_code,
        "ok": isolated and result.a_repeat_cached_tokens > 0,
    }


def run_faults(cfg: StressConfig, out: Path) -> dict[str, Any]:
    args = ["tests/hardening/test_faults.py"] + (["-k", "not sigterm"] if cfg.quick else [])
    started = time.monotonic()
    rc, text = _pytest(args, cfg.faults_timeout_s, out / "faults.log", {})
    counts = _counts(text)
    return {
        "tests": counts,
        "sigterm_test": not cfg.quick,
        "timed_out": rc is None,
        "seconds": round(time.monotonic() - started, 1),
        "ok": rc == 0,
    }


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM (the server drains and exits 0), then SIGKILL after 30 s; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            return None
    return proc.returncode


STAGES: dict[str, Callable[[StressConfig, Path], dict[str, Any]]] = {
    "fuzz": run_fuzz,
    "requests": run_requests,
    "soak": run_soak,
    "isolation": run_isolation,
    "faults": run_faults,
}


# ---- report ---------------------------------------------------------------------------------------


def run(cfg: StressConfig, out: Path, stages: list[str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"quick": cfg.quick, "stages": {}}
    for name in stages:
        print(f"stress: {name} ...", flush=True)
        started = time.monotonic()
        try:
            stage = STAGES[name](cfg, out)
        except Exception as exc:  # a broken stage is a finding; the others still run
            stage = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        stage.setdefault("seconds", round(time.monotonic() - started, 1))
        results["stages"][name] = stage
        print(f"stress: {name} {'ok' if stage['ok'] else 'FAILED'} in {stage['seconds']} s", flush=True)
    results["summary"] = summary(results["stages"])
    results["ok"] = all(s["ok"] for s in results["stages"].values())
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "report.md").write_text(report(results))
    return results


def summary(stages: dict[str, Any]) -> dict[str, Any]:
    fuzz, sk, iso = stages.get("fuzz", {}), stages.get("soak", {}), stages.get("isolation", {})
    req = stages.get("requests", {})
    return {
        "http_requests": sum(int(s.get("requests") or 0) for s in (fuzz, req, sk, iso)),
        "4xx": int(fuzz.get("4xx") or 0) + int(req.get("4xx") or 0),
        "5xx": int(fuzz.get("5xx") or 0) + int(req.get("5xx") or 0) + int(sk.get("rejected_503") or 0),
        "5xx_other_than_503": int(fuzz.get("5xx") or 0) + int(req.get("5xx") or 0),
        "server_crashes": req.get("crashes"),
        "soak_unexpected": int(sk.get("other") or 0),
        "rss_max_mib": sk.get("rss_max_mib"),
        "rss_start_mib": sk.get("rss_start_mib"),
        "pool_capacity_mib": sk.get("pool_capacity_mib"),
        "leaked_locks": sk.get("leaked_locks"),
        "isolated": iso.get("ok"),
        "cross_tenant_cached_tokens": iso.get("b_on_a_prompt_cached_tokens"),
        "ttft_ratio_b_on_a_vs_fresh": iso.get("ratio_b_on_a_vs_fresh"),
    }


def report(results: dict[str, Any]) -> str:
    s, st = results["summary"], results["stages"]
    mode = "quick" if results["quick"] else "full"
    lines = [
        f"# Stress report ({mode})",
        "",
        "| figure | value |",
        "|---|---|",
        f"| HTTP requests tried (fuzz + request fuzz + soak + isolation) | {s['http_requests']} |",
        f"| 4xx answers (fuzz + request fuzz, all expected) | {s['4xx']} |",
        f"| server crashes in the request fuzz | {s['server_crashes']} |",
        f"| 5xx answers: 503 overload in soak / any other | {s['5xx'] - s['5xx_other_than_503']} / {s['5xx_other_than_503']} |",
        f"| soak requests neither answered, 503, nor our own hang-up | {s['soak_unexpected']} |",
        f"| server RSS max (start) vs KV pool | {s['rss_max_mib']} MiB ({s['rss_start_mib']} MiB) vs {s['pool_capacity_mib']} MiB |",
        f"| leaked locks after soak | {s['leaked_locks']} |",
        f"| isolation: cross-tenant cached tokens, TTFT ratio B-on-A / B-fresh | {s['cross_tenant_cached_tokens']}, {_fmt(s['ttft_ratio_b_on_a_vs_fresh'])} |",
        "",
        "| stage | ok | seconds | detail |",
        "|---|---|---|---|",
    ]
    for name, stage in st.items():
        lines.append(
            f"| {name} | {'yes' if stage['ok'] else 'NO'} | {stage.get('seconds')} | {_detail(name, stage)} |"
        )
    lines += ["", f"Overall: {'PASS' if results['ok'] else 'FAIL'}. Raw figures in results.json."]
    return "\n".join(lines) + "\n"


def _detail(name: str, stage: dict[str, Any]) -> str:
    if "error" in stage:
        return stage["error"][:200]
    if name == "fuzz":
        return f"{stage['mode']} mode, statuses {stage['statuses']}, tests {stage['tests']}"
    if name == "requests":
        return (
            f"{stage['mode']} mode, statuses {stage['statuses']}, crashes {stage['crashes']}, server RSS "
            f"{stage['rss_before_mib']} -> {stage['rss_after_mib']} MiB, open fds "
            f"{stage.get('fds_before')} -> {stage.get('fds_after')}"
        )
    if name == "soak":
        return (
            f"{stage['sessions']} sessions, {stage['requests']} requests, {stage['answered']} answered, "
            f"{stage['rejected_503']} 503, {stage['disconnected']} hang-ups, p95 {stage['latency_p95_s']} s, "
            f"exit {stage['server_exit_code']}"
        )
    if name == "isolation":
        return f"{stage['samples']} samples, A repeat speedup {_fmt(stage['a_speedup'])}x"
    return f"tests {stage['tests']}" + (" (SIGTERM test skipped)" if not stage["sigterm_test"] else "")


def _fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.hardening.stress", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/stress"))
    p.add_argument("--quick", action="store_true", help="short versions of every stage (a few minutes)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ns = p.parse_args(argv)
    stages = [s for s in ns.stages.split(",") if s]
    unknown = set(stages) - STAGES.keys()
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}")
    cfg = StressConfig.quick_config() if ns.quick else StressConfig()
    results = run(cfg, ns.out, stages)
    print(json.dumps(results["summary"], indent=2))
    print(f"report: {ns.out / 'report.md'}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
