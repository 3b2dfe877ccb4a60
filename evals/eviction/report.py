"""report.md, the target checks and PNG plots (hit rate vs budget per policy) from results."""

from __future__ import annotations

from pathlib import Path

BUILTINS = ("lru", "lfu", "fifo", "slru", "priority")


def _index(rows: list[dict]) -> dict[tuple[str, int, float, str], dict]:
    return {(r["workload"], r["sessions"], r["budget_fraction"], r["policy"]): r for r in rows}


def comparisons(rows: list[dict]) -> list[dict]:
    """Per workload x sessions x budget: session vs the best built-in and the oracle."""
    idx, out = _index(rows), []
    cells = sorted({(r["workload"], r["sessions"], r["budget_fraction"]) for r in rows})
    for w, n, b in cells:
        builtins = [idx[(w, n, b, p)] for p in BUILTINS if (w, n, b, p) in idx]
        sess, oracle, lru = (
            idx.get((w, n, b, "session")),
            idx.get((w, n, b, "oracle")),
            idx.get((w, n, b, "lru")),
        )
        if not builtins or sess is None:
            continue
        best = min(builtins, key=lambda r: r["recomputed_tokens"])
        cmp = {
            "workload": w,
            "sessions": n,
            "budget_fraction": b,
            "best_builtin": best["policy"],
            "best_recomputed": best["recomputed_tokens"],
            "session_recomputed": sess["recomputed_tokens"],
        }
        cmp["saving"] = (
            1 - sess["recomputed_tokens"] / best["recomputed_tokens"] if best["recomputed_tokens"] else 0.0
        )
        if oracle is not None:
            head = best["recomputed_tokens"] - oracle["recomputed_tokens"]
            cmp["oracle_saving"] = (
                1 - oracle["recomputed_tokens"] / best["recomputed_tokens"]
                if best["recomputed_tokens"]
                else 0.0
            )
            cmp["headroom_captured"] = (
                (best["recomputed_tokens"] - sess["recomputed_tokens"]) / head if head > 0 else None
            )
        if lru is not None:
            cmp["hit_rate_minus_lru_pt"] = 100 * (sess["hit_rate"] - lru["hit_rate"])
        out.append(cmp)
    return out


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:,.0f}"


def write_report(results: dict, out: Path, wall_s: float) -> list[Path]:
    rows = results["rows"]
    plots = write_plots(rows, out)
    lines = [
        "# Eviction policy comparison (`radixagent eval-eviction`)",
        "",
        f"Budget definition: {results['budget_definition']}",
        "",
        f"Seeds per cell: {results['seeds']}; whole run {wall_s:.1f} s.",
        "",
        "## Session policy vs the best built-in (recomputed prefill tokens)",
        "",
        "| workload | sessions | budget | best built-in | its recompute | session | saving | oracle saving "
        "| headroom captured | hit rate - LRU (pt) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons(rows):
        lines.append(
            f"| {c['workload']} | {c['sessions']} | {c['budget_fraction']:.0%} | {c['best_builtin']} | "
            f"{_fmt(c['best_recomputed'], False)} | {_fmt(c['session_recomputed'], False)} | {_fmt(c['saving'])} | "
            f"{_fmt(c.get('oracle_saving'))} | {_fmt(c.get('headroom_captured'))} | "
            f"{c.get('hit_rate_minus_lru_pt', 0.0):+.2f} |"
        )
    lines += [
        "",
        "## All rows",
        "",
        "| workload | sessions | budget | policy | hit rate | recomputed | per-session mean / p95 | "
        "queue wait mean s | replay s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['sessions']} | {r['budget_fraction']:.0%} | {r['policy']} | {r['hit_rate']:.3f} | "
            f"{r['recomputed_tokens']:,.0f} | {r['recomputed_per_session_mean']:,.0f} / "
            f"{r['recomputed_per_session_p95']:,.0f} | {r['queue_wait_mean_s']:.1f} | {r['seconds']:.2f} |"
        )
    lines += ["", "Plots: " + ", ".join(p.name for p in plots), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return [path, *plots]


def write_plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for w, n in sorted({(r["workload"], r["sessions"]) for r in rows}):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for policy in sorted({r["policy"] for r in rows}):
            pts = sorted(
                (r["budget_fraction"], r["hit_rate"])
                for r in rows
                if (r["workload"], r["sessions"], r["policy"]) == (w, n, policy)
            )
            style = "--" if policy == "oracle" else "-"
            ax.plot([100 * b for b, _ in pts], [h for _, h in pts], style, marker="o", label=policy)
        ax.set(xlabel="budget (% of peak working set)", ylabel="hit rate", title=f"{w}, {n} sessions")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        path = out / f"hit_rate_{w}_{n}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
