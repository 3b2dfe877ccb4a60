"""evals/benchmarks/step_phases.py: where a decode step's time goes, beside each phase's roof."""

from __future__ import annotations

import pytest

from evals.benchmarks.step_phases import PHASES, NoNativeStep, PhasesConfig, markdown, measure


def _row(int4: float, attention: float, head: float, forward: float, period: float, roofs: tuple) -> dict:
    phases = {"int4 matmuls": int4, "attention": attention, "lm_head": head}
    return {
        "forward_s": forward,
        "period_s": period,
        "phases_s": {
            **phases,
            "rest of the forward": forward - sum(phases.values()),
            "outside the forward": period - forward,
        },
        "roofs_s": dict(zip(PHASES, roofs, strict=True)),
        "context_tokens": [300],
    }


def test_report_gives_each_phase_its_roof_and_both_ratios():
    results = {
        "probes": {"bandwidth_gb_s": 50.0, "int4_gflops": 700.0, "lm_head_gflops": 330.0},
        "rows": {
            "1": _row(0.002, 0.0003, 0.0006, 0.003, 0.004, (0.0013, 0.0001, 0.0006)),
            "4": _row(0.0024, 0.0009, 0.0008, 0.0045, 0.005, (0.0013, 0.0004, 0.0007)),
        },
    }
    text = markdown(results, "AMD EPYC, 2 cores")
    assert "| int4 matmuls | 2.00 (1.30, 65%) | 2.40 (1.30, 54%) |" in text
    assert "| outside the forward | 1.00 | 0.50 |" in text
    assert "| sum of the roofs | 2.00 | 2.40 |" in text
    # measured 4 x 4.0 / 5.0; at the roofs 4 x 2.0 / 2.4
    assert "Summary: aggregate decode over 1 request, measured (step periods): 3.20x at 4; with every" in text
    assert "nothing else costing time: 3.33x at 4." in text
    assert "float32 rows" not in text  # a report from before the comparison: no row for it
    for n, ms in (("1", 0.0009), ("4", 0.0012)):
        results["rows"][n]["lm_head_float32_rows_s"] = ms
    assert (
        "| lm_head, float32 rows (the float32-FMA kernel bf16 rows took before) | 0.90 | 1.20 |"
        in markdown(results, "AMD EPYC, 2 cores")
    )


def test_config_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="counts"):
        PhasesConfig(counts=())
    with pytest.raises(ValueError, match="repeats"):
        PhasesConfig(repeats=0)


@pytest.mark.slow
def test_real_step_phases_add_up_to_the_step():
    """The default engine, 1 and 2 requests: every phase measured, none longer than the step."""
    try:
        results = measure(PhasesConfig(counts=(1, 2), doc_tokens=32, repeats=2, new_tokens=8))
    except NoNativeStep as e:
        pytest.skip(str(e))
    for n, row in results["rows"].items():
        phases = row["phases_s"]
        assert all(phases[name] > 0 for name in PHASES), (n, phases)
        assert row["period_s"] > 0 and row["forward_s"] > 0
        assert all(0 < roof < 1 for roof in row["roofs_s"].values())
        assert len(row["context_tokens"]) == int(n)
        assert row["lm_head_float32_rows_s"] > 0
    assert results["probes"]["bandwidth_gb_s"] > 1
    assert "| attention |" in markdown(results, "this machine")
