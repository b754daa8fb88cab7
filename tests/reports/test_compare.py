"""`bench compare`'s report on synthetic runs: ratios to the first run at each load, the files, the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic_runs import synthetic_run, synthetic_run_dir

from reports.compare import GateOptions, check_gate_options, compare_rows, gate_targets, to_markdown, write_compare


def test_ratios_are_to_the_baseline_at_the_same_load() -> None:
    base = synthetic_run("base", seed=1, loads=[1, 2])
    slow = synthetic_run("slow", seed=1, loads=[1, 2, 4], tpot_scale=2.0)
    rows = compare_rows([base, slow])
    assert [(r.target, r.load) for r in rows] == [("base", 1), ("slow", 1), ("base", 2), ("slow", 2), ("slow", 4)]
    assert rows[0].ratios["median_tpot_ms"] == pytest.approx(1.0)
    assert rows[1].ratios["median_tpot_ms"] == pytest.approx(rows[1].median_tpot_ms / rows[0].median_tpot_ms)
    assert rows[1].ratios["median_tpot_ms"] > 1.5
    assert rows[4].ratios == dict.fromkeys(rows[4].ratios)  # no baseline point at load 4
    table = to_markdown(rows, "base", "concurrency")
    assert "ratios to `base`" in table and "| slow | 4 |" in table and "| – |" in table
    with pytest.raises(ValueError, match="at least two"):
        compare_rows([base])


def test_the_report_files(tmp_path: Path) -> None:
    runs = {name: synthetic_run_dir(tmp_path / name, seed=seed, loads=[1, 2], tpot_scale=scale)
            for name, seed, scale in (("a", 1, 1.0), ("b", 2, 1.0), ("c", 3, 1.5))}  # fmt: skip
    path = write_compare(runs, tmp_path)
    assert path == tmp_path / "compare.html"
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["baseline"] == "a" and len(data["rows"]) == 6 and data["gate"] == {}
    assert (tmp_path / "compare.png").stat().st_size > 1000
    page = path.read_text()
    assert "data:image/png;base64," in page and page.count("<td>a</td>") == 2 and page.count("<td>c</td>") == 2
    assert "| c | 2 |" in (tmp_path / "compare.md").read_text()


def test_the_gate_of_the_baseline_against_each_target(tmp_path: Path) -> None:
    runs = {name: synthetic_run_dir(tmp_path / name, seed=seed, tpot_scale=scale)
            for name, seed, scale in (("a", 1, 1.0), ("same", 2, 1.0), ("slow", 3, 1.5))}  # fmt: skip
    verdicts = gate_targets(runs, GateOptions(metric="tpot_p50", noise_floor="2%"))
    assert [(v.target, v.passed) for v in verdicts] == [("same", True), ("slow", False)]
    assert "regression" in verdicts[1].table
    write_compare(runs, tmp_path / "report", verdicts)
    assert "bench gate: FAIL" in (tmp_path / "report" / "compare.md").read_text()
    for bad in (GateOptions(metric="goodput_p50"), GateOptions(metric=""), GateOptions(alpha=2.0)):
        with pytest.raises(ValueError):
            check_gate_options(bad)
