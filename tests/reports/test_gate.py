"""`bench gate`: passes noise, fails a real regression, few false alarms, exit 2 on unusable input."""

from __future__ import annotations

import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from synthetic_runs import synthetic_run, synthetic_run_dir
from typer.testing import CliRunner

from cli import app
from reports.gate import (
    GateConfig,
    GateInputError,
    compare_failures,
    holm,
    parse_metric,
    parse_threshold,
    run_gate,
)

METRICS = ("ttft_p90", "tpot_p50", "e2el_p90", "failure_rate")


def test_same_distribution_passes_and_tpot_regression_fails():
    config = GateConfig(metrics=METRICS, max_regression=0.05)
    baseline = synthetic_run("base", seed=11, num_prompts=80)
    same = synthetic_run("same", seed=12, num_prompts=80)
    assert run_gate(baseline, same, config).passed
    slower = synthetic_run("slower", seed=12, num_prompts=80, tpot_scale=1.2)
    result = run_gate(baseline, slower, config)
    assert not result.passed
    failed = {(c.point, c.metric) for c in result.comparisons if c.failed}
    assert {("c0001", "tpot_p50"), ("c0002", "tpot_p50"), ("c0004", "tpot_p50"), ("c0008", "tpot_p50")} <= failed
    assert not any(c.metric == "ttft_p90" for c in result.comparisons if c.failed)  # TTFT did not change
    tpot = [c for c in result.comparisons if c.metric == "tpot_p50"]
    assert all(0.1 < c.change < 0.3 and c.ci_low > 0 for c in tpot)


def test_regression_below_the_threshold_passes():
    baseline = synthetic_run("base", seed=21, num_prompts=80)
    slower = synthetic_run("slower", seed=22, num_prompts=80, tpot_scale=1.2)
    assert run_gate(baseline, slower, GateConfig(metrics=("tpot_p50",), max_regression=0.5)).passed


def test_false_alarm_rate_over_100_aa_comparisons():
    config = GateConfig(metrics=METRICS, max_regression=0.05, n_boot=400)
    alarms = 0
    for k in range(100):
        a = synthetic_run("a", seed=1000 + 2 * k, loads=[1, 4], num_prompts=40, with_metrics=False)
        b = synthetic_run("b", seed=1001 + 2 * k, loads=[1, 4], num_prompts=40, with_metrics=False)
        alarms += not run_gate(a, b, GateConfig(**{**vars(config), "seed": k})).passed
    assert alarms <= 5


def test_holm_and_parsers():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert parse_metric("tpot_p50") == ("tpot", 50.0)
    assert parse_metric("e2el_p99.9") == ("e2el", 99.9)
    assert parse_metric("itl_mean") == ("itl", "mean")
    assert parse_metric("ttft_median") == ("ttft", 50.0)
    assert parse_threshold("5%") == pytest.approx(0.05) and parse_threshold("0.1") == pytest.approx(0.1)
    for bad in ("throughput_p50", "tpot_p", "tpot_p101"):
        with pytest.raises(GateInputError):
            parse_metric(bad)
    with pytest.raises(GateInputError):
        parse_threshold("five")


def test_unusable_input_is_refused():
    base = synthetic_run("base", seed=1)
    other_workload = synthetic_run("w", seed=2, input_len=512)
    with pytest.raises(GateInputError, match="different workloads"):
        run_gate(base, other_workload, GateConfig())
    fewer_points = synthetic_run("p", seed=2, loads=[1, 2, 4])
    with pytest.raises(GateInputError, match="different points"):
        run_gate(base, fewer_points, GateConfig())
    assert run_gate(base, other_workload, GateConfig(check_workload=False)).comparisons
    salted = synthetic_run("s", seed=2)
    salted.config["workload"]["salt"] = "another-run"
    assert run_gate(base, salted, GateConfig()).comparisons  # the per-run salt may differ


def test_candidate_with_no_successes_fails():
    base = synthetic_run("base", seed=1, num_prompts=80)
    broken = synthetic_run("broken", seed=2, num_prompts=80)
    rows = broken.requests
    rows.loc[rows["label"] == "c0002", "success"] = False
    result = run_gate(base, broken, GateConfig(metrics=("tpot_p50",)))
    assert not result.passed
    assert [c.point for c in result.comparisons if c.failed] == ["c0002"]


def test_cli_exit_codes_junit_and_baseline_store(tmp_path, fixture_run):
    runner = CliRunner()
    slow = synthetic_run_dir(tmp_path / "slow", seed=5, num_prompts=60, tpot_scale=1.25)
    base = synthetic_run_dir(tmp_path / "base", seed=4, num_prompts=60)
    junit = tmp_path / "out" / "gate.xml"
    result = runner.invoke(app, ["gate", "--baseline", str(base), "--candidate", str(slow), "--metric",
                                 "tpot_p50,ttft_p90", "--max-regression", "5%", "--junit-xml", str(junit),
                                 "--markdown", str(tmp_path / "gate.md")])
    assert result.exit_code == 1, result.output
    assert "### bench gate: FAIL" in result.output and "| c0004 | tpot_p50 |" in result.output
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 8 and {c.get("name") for c in cases} == {"tpot_p50", "ttft_p90"}
    assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases) >= 4
    assert (tmp_path / "gate.md").read_text().startswith("### bench gate: FAIL")

    store = tmp_path / "store"
    result = runner.invoke(app, ["gate", "--update-baseline", "--baseline-store", str(store), "--candidate", str(base)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((store / "baseline.json").read_text())
    assert manifest["config"]["workload"]["input_len"] == 256 and manifest["points"][0] == "c0001"
    again = synthetic_run_dir(tmp_path / "again", seed=6, num_prompts=60)
    result = runner.invoke(app, ["gate", "--baseline-store", str(store), "--candidate", str(again)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["gate", "--baseline-store", str(store), "--candidate", str(slow)])
    assert result.exit_code == 1
    runner.invoke(app, ["gate", "--update-baseline", "--baseline-store", str(store), "--candidate", str(slow)])
    assert len((store / "history.jsonl").read_text().splitlines()) == 2
    assert runner.invoke(app, ["gate", "--baseline-store", str(store), "--candidate", str(slow)]).exit_code == 0


@pytest.mark.parametrize(
    "case",
    ["missing_candidate", "empty_store", "no_baseline", "mismatched_points", "mismatched_workload", "bad_metric"],
)
def test_cli_exit_2(tmp_path, fixture_run, case):
    args = ["gate", "--baseline", str(fixture_run), "--candidate", str(fixture_run)]
    if case == "missing_candidate":
        args[-1] = str(tmp_path / "missing")
    elif case == "empty_store":
        args = ["gate", "--baseline-store", str(tmp_path / "store"), "--candidate", str(fixture_run)]
    elif case == "no_baseline":
        args = ["gate", "--candidate", str(fixture_run)]
    elif case == "mismatched_points":
        other = tmp_path / "run"
        shutil.copytree(fixture_run, other)
        (other / "points" / "c0008.json").unlink()
        args[-1] = str(other)
    elif case == "mismatched_workload":
        args[-1] = str(synthetic_run_dir(tmp_path / "w", seed=3, output_len=64))
    elif case == "bad_metric":
        args += ["--metric", "goodput_p50"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error: " in result.output  # a clear message, not a traceback
    assert "Traceback" not in result.output


def test_example_workflow_uses_real_flags():
    import typer.main
    import yaml

    from reports.gate import __file__ as gate_file

    workflow = yaml.safe_load((Path(gate_file).parents[1] / "docs" / "gate-github-actions.yml").read_text())
    commands = typer.main.get_command(app).commands
    options = {name: {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]} for name, cmd in commands.items()}
    assert {f for f in workflow["env"]["AB_FLAGS"].split() if f.startswith("--")} <= options["compare"]
    runs = "\n".join(s.get("run", "") for s in workflow["jobs"]["gate"]["steps"]).replace("\\\n", " ")
    bench_lines = [line.split(".venv/bin/bench ", 1)[1].split() for line in runs.splitlines()
                   if ".venv/bin/bench " in line]
    assert [words[0] for words in bench_lines] == ["compare", "report"]
    for command, *words in bench_lines:
        assert {f for f in words if f.startswith("--")} <= options[command]


def _pr_gate_args(store: Path, candidate: Path, out: Path) -> list[str]:
    """A pull request's gate against a blessed baseline store (docs/GATE.md, "Baseline store")."""
    return ["gate", "--baseline-store", str(store), "--candidate", str(candidate), "--metric",
            "ttft_p90,tpot_p50,e2el_p90", "--max-regression", "10%", "--bless-if-missing", "--junit-xml",
            str(out / "gate.xml"), "--markdown", str(out / "gate.md")]


def test_first_pull_request_blesses_and_passes_then_later_ones_are_gated(tmp_path):
    runner = CliRunner()
    store, out = tmp_path / "perf-baseline", tmp_path / "results"
    base = synthetic_run_dir(tmp_path / "base", seed=4, num_prompts=60)
    first = runner.invoke(app, _pr_gate_args(store, base, out))
    assert first.exit_code == 0, first.output
    assert "no baseline yet" in (out / "gate.md").read_text() and "nothing was compared" in first.output
    assert json.loads((store / "baseline.json").read_text())["points"][0] == "c0001"
    slow = synthetic_run_dir(tmp_path / "slow", seed=5, num_prompts=60, tpot_scale=1.25)
    later = runner.invoke(app, _pr_gate_args(store, slow, out))
    assert later.exit_code == 1, later.output
    assert (out / "gate.md").read_text().startswith("### bench gate: FAIL") and (out / "gate.xml").exists()
    assert len((store / "history.jsonl").read_text().splitlines()) == 1  # a gated run is never blessed


@pytest.mark.parametrize("flags", [["--metric", "goodput_p50"], ["--alpha", "2"]])
def test_bless_if_missing_refuses_bad_flags_before_blessing(tmp_path, fixture_run, flags):
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["gate", "--baseline-store", str(store), "--candidate", str(fixture_run),
                                      "--bless-if-missing", *flags])
    assert result.exit_code == 2, result.output
    assert not store.exists()
    result = CliRunner().invoke(app, ["gate", "--baseline", str(fixture_run), "--candidate", str(fixture_run),
                                      "--bless-if-missing"])
    assert result.exit_code == 2 and "needs --baseline-store" in result.output


def test_failure_rate():
    base_rate, cand_rate, diff, low, high, p = compare_failures(0, 20, 5, 20, alpha=0.05)
    assert (base_rate, cand_rate, diff) == (0.0, 0.25, 0.25)
    assert p == pytest.approx(math.comb(35, 15) / math.comb(40, 20))  # Fisher: all 5 failures in the candidate
    assert low < diff < high
    assert compare_failures(3, 50, 0, 50, 0.05)[-1] == pytest.approx(1.0)
    baseline = synthetic_run("base", seed=31, num_prompts=80)
    failing = synthetic_run("failing", seed=32, num_prompts=80)
    rows = failing.requests
    flaky = rows.index[(rows["label"] == "c0004") & (rows["index"] % 3 == 0)]
    rows.loc[flaky, "success"] = False  # a third of c0004 fails; the rest is as fast as before
    result = run_gate(baseline, failing, GateConfig(metrics=("tpot_p50", "failure_rate")))
    assert [(c.point, c.metric) for c in result.comparisons if c.failed] == [("c0004", "failure_rate")]
    lenient = run_gate(baseline, failing, GateConfig(metrics=("failure_rate",), max_failure_increase=0.5))
    assert lenient.passed


def test_gate_on_imported_vllm_results(tmp_path, fixtures_dir):
    for name in ("vllm_c0002.json", "vllm_c0004.json"):
        shutil.copy(fixtures_dir / name, tmp_path / name)
    result = CliRunner().invoke(app, ["gate", "--baseline", str(tmp_path), "--candidate", str(tmp_path),
                                      "--metric", "ttft_p90,tpot_p50,itl_p50,e2el_mean,failure_rate"])
    assert result.exit_code == 0, result.output
    assert "| c0004 | itl_p50 |" in result.output


def test_cancelled_requests_are_not_failures_in_the_gate():
    """`bench sweep --cancel-rate`: a third of c0004 aborted by the client is not a failure-rate regression."""
    baseline = synthetic_run("base", seed=31, num_prompts=80)
    cancelling = synthetic_run("cancelling", seed=32, num_prompts=80)
    rows = cancelling.requests
    aborted = rows.index[(rows["label"] == "c0004") & (rows["index"] % 3 == 0)]
    rows["cancelled"] = False
    rows.loc[aborted, "success"] = False
    rows.loc[aborted, "cancelled"] = True
    result = run_gate(baseline, cancelling, GateConfig(metrics=("failure_rate",)))
    assert result.passed
    (comparison,) = [c for c in result.comparisons if c.point == "c0004"]
    assert comparison.n_candidate == (rows["label"] == "c0004").sum() - len(aborted)
