"""Reports and `bench gate` treat an over-saturated point (sweep.point.saturation) as failing."""

from __future__ import annotations

import math

import numpy as np
from synthetic_runs import synthetic_run

from reports.cost import cost_vs_load
from reports.gate import SATURATED, GateConfig, run_gate
from reports.gate_output import to_markdown
from reports.render import saturation_note
from reports.tables import point_table

LOADS = [2, 4, 8, 16]  # the synthetic rate runs need rates >= 1.25


def rate_run(name: str, seed: int, saturated: dict[str, float] | None = None):
    run = synthetic_run(name, seed=seed, loads=LOADS, mode="rate", num_prompts=40)
    marks = saturated or {}
    run.points["saturated"] = [label in marks for label in run.points["label"]]
    run.points["saturated_at_s"] = [marks.get(label, math.nan) for label in run.points["label"]]
    return run


def test_the_gate_fails_a_point_only_the_candidate_saturated() -> None:
    config = GateConfig(metrics=("tpot_p50",))
    baseline = rate_run("base", 1)
    labels = list(baseline.points["label"])
    assert run_gate(baseline, rate_run("same", 2), config).passed  # nothing saturated: no saturation rows
    assert not [c for c in run_gate(baseline, rate_run("same", 2), config).comparisons if c.metric == SATURATED]
    result = run_gate(baseline, rate_run("cand", 2, {labels[3]: 4.5}), config)
    assert not result.passed
    assert [(c.point, c.metric) for c in result.comparisons if c.failed] == [(labels[3], SATURATED)]
    assert "candidate saturated, baseline did not" in to_markdown(result, "base", "cand")
    both = run_gate(rate_run("base", 1, {labels[3]: 6.0}), rate_run("cand", 2, {labels[3]: 4.5}), config)
    assert both.passed and "saturated in both runs" in to_markdown(both, "base", "cand")


def test_the_gate_fails_a_load_the_candidate_skipped_above_a_saturated_one() -> None:
    baseline = rate_run("base", 1)
    labels = list(baseline.points["label"])
    candidate = rate_run("cand", 2, {labels[2]: 4.0})
    candidate.points = candidate.points[candidate.points["label"] != labels[3]].reset_index(drop=True)
    candidate.requests = candidate.requests[candidate.requests["label"] != labels[3]]
    candidate.skipped = [{"label": labels[3], "request_rate": 8, "reason": "skipped: a lower load saturated"}]
    result = run_gate(baseline, candidate, GateConfig(metrics=("tpot_p50",)))  # not "different points" (exit 2)
    failed = {(c.point, c.note) for c in result.comparisons if c.failed}
    assert failed == {
        (labels[2], "candidate saturated, baseline did not"),
        (labels[3], "candidate skipped it: a lower load saturated"),
    }
    assert "| skipped |" in to_markdown(result, "base", "cand")


def test_the_report_shows_saturated_and_skipped_points() -> None:
    run = rate_run("run", 3, {"r0016.00": 3.25})
    run.skipped = [{"label": "r0032.00", "request_rate": 32, "reason": "skipped: a lower load (r0016.00) saturated"}]
    assert list(point_table(run)["saturated"]) == ["no", "no", "no", "at 3.2 s"]
    note = saturation_note([run])
    assert "over-saturated" in note and "r0016.00" in note and "not measured: r0032.00" in note
    assert saturation_note([rate_run("clean", 4)]) == ""


def test_the_cost_plot_does_not_count_a_saturated_point_as_meeting_the_slo() -> None:
    run = rate_run("run", 3, {"r0016.00": 3.25})
    run.points["cost_per_million_output_tokens"] = [1.0, 1.0, 1.0, 1.0]
    run.points["slo_attainment"] = 1.0  # every point meets the attainment goal on its numbers
    fig = cost_vs_load([run], {"ttft_ms": 1e9})
    boundary = [line.get_xdata()[0] for line in fig.axes[0].lines if line.get_linestyle() == ":"]
    assert boundary == [8.0]  # the largest load meeting the SLO is the one below the saturated point
    assert np.isfinite(boundary).all()
