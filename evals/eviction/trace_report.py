"""Markdown tables and a chart (block hit rate vs capacity per policy) for trace replays."""

from __future__ import annotations

from pathlib import Path

ONLINE = ("lru", "lfu", "fifo", "slru", "priority", "session")


def _cap(c: int | None) -> str:
    return "inf" if c is None else f"{c:,}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def best_rows(rows: list[dict]) -> list[dict]:
    """Per workload x mode x finite capacity: LRU, the best online policy, the oracle."""
    out = []
    cells = sorted({(r["workload"], r["mode"], r["capacity_blocks"]) for r in rows if r["capacity_blocks"]})
    for w, mode, cap in cells:
        cell = {
            r["policy"]: r for r in rows if (r["workload"], r["mode"], r["capacity_blocks"]) == (w, mode, cap)
        }
        online = [cell[p] for p in ONLINE if p in cell]
        if "lru" not in cell or not online:
            continue
        best = min(online, key=lambda r: (r["recomputed_tokens"], r["policy"] != "lru"))
        out.append(
            {
                "workload": w,
                "mode": mode,
                "capacity_blocks": cap,
                "lru": cell["lru"],
                "best": best,
                "oracle": cell.get("oracle"),
                "session": cell.get("session"),
            }
        )
    return out


def summary_table(rows: list[dict]) -> list[str]:
    lines = [
        "| trace | mode | capacity (blocks) | LRU block / token hit | best online | its block / token hit "
        "| oracle block hit | best's headroom captured | session - LRU (pt) |",
        "|---|---|---:|---|---|---|---:|---:|---:|",
    ]
    for b in best_rows(rows):
        lru, best, oracle, sess = b["lru"], b["best"], b["oracle"], b["session"]
        diff = f"{100 * (sess['block_hit_rate'] - lru['block_hit_rate']):+.2f}" if sess else "n/a"
        ora = f"{oracle['block_hit_rate']:.4f}" if oracle else "n/a"
        lines.append(
            f"| {b['workload']} | {b['mode']} | {_cap(b['capacity_blocks'])} | "
            f"{lru['block_hit_rate']:.4f} / {lru['hit_rate']:.4f} | {best['policy']} | "
            f"{best['block_hit_rate']:.4f} / {best['hit_rate']:.4f} | {ora} | "
            f"{_pct(best.get('headroom_captured'))} | {diff} |"
        )
    return lines


def rows_table(rows: list[dict]) -> list[str]:
    lines = [
        "| trace | mode | capacity | policy | block hit | token hit | recomputed tokens | headroom captured "
        "| queue wait mean s | replay s (cpu) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    listed: set[tuple] = set()  # a policy-free cell is one replay, listed once
    for r in rows:
        cell = (r["workload"], r["mode"], r["capacity_blocks"])
        if r.get("policy_free"):
            if cell in listed:
                continue
            listed.add(cell)
        policy = "any (policy-free)" if r.get("policy_free") else r["policy"]
        wait = f"{r['queue_wait_mean_s']:.1f}" if "queue_wait_mean_s" in r else "-"
        lines.append(
            f"| {r['workload']} | {r['mode']} | {_cap(r['capacity_blocks'])} | {policy} | {r['block_hit_rate']:.4f} | "
            f"{r['hit_rate']:.4f} | {r['recomputed_tokens']:,} | {_pct(r.get('headroom_captured'))} | {wait} | "
            f"{r['seconds']:.1f} ({r['cpu_seconds']:.1f}) |"
        )
    return lines


def write_trace_report(
    rows: list[dict], summaries: list[dict], out: Path, wall_s: float, definition: str
) -> list[Path]:
    plots = [write_chart(rows, s["workload"], out) for s in summaries]
    lines = ["# Eviction on replayed Mooncake traces", "", definition, ""]
    for s in summaries:
        lines.append(
            f"- {s['workload']}: {s['requests']:,} requests, {s['block_lookups']:,} block lookups, "
            f"{s['distinct_blocks']:,} distinct blocks; infinite capacity (policy-free): block hit rate "
            f"{s['infinite_block_hit_rate']:.4f}, token hit rate {s['infinite_hit_rate']:.4f}"
        )
    timed = next((r for r in rows if r["mode"] == "timed"), None)
    if timed:
        lines.append(
            f"- timed cost model: prefill {1000 * timed['prefill_s_per_token']:g} ms/token (uncached "
            f"prompt tokens), decode {1000 * timed['decode_s_per_token']:g} ms/token"
        )
    lines += [
        "",
        f"Whole run {wall_s:.1f} s.",
        "",
        "## LRU, best online policy, oracle",
        "",
        *summary_table(rows),
        "",
        "## All rows",
        "",
        *rows_table(rows),
        "",
        "Charts: " + ", ".join(p.name for p in plots),
        "",
    ]
    path = out / "report-mooncake.md"
    path.write_text("\n".join(lines))
    return [path, *plots]


def write_chart(rows: list[dict], workload: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["workload"] == workload]
    modes = sorted({r["mode"] for r in mine})
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        here = [r for r in mine if r["mode"] == mode]
        curves = {
            p: sorted(
                (r["capacity_blocks"], r["block_hit_rate"])
                for r in here
                if r["policy"] == p and r["capacity_blocks"] is not None
            )
            for p in sorted({r["policy"] for r in here})
        }
        for policy, pts in curves.items():
            same = policy != "lru" and pts == curves.get("lru")  # hidden under LRU's line: say so
            if pts:
                ax.plot(
                    [c for c, _ in pts],
                    [h for _, h in pts],
                    "--" if policy == "oracle" else "-",
                    marker="o",
                    markersize=3,
                    label=f"{policy} (= lru)" if same else policy,
                )
        inf = next((r["block_hit_rate"] for r in here if r["capacity_blocks"] is None), None)
        if inf is not None:
            ax.axhline(inf, color="grey", linestyle=":", label="infinite")
        ax.set(
            xscale="log",
            xlabel="capacity (512-token blocks)",
            ylabel="block hit rate",
            title=f"{workload}, {mode}",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    path = out / f"hit_rate_{workload}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
