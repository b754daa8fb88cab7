"""Per-class SLOs: the syntax, each request judged by its own class's SLO, per-class figures, and where classes come
from (a trace's class column, a mixture's components) through a sweep against the mock."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import workloads
from reports.recompute import format_slo, normalize_slo, records_from_rows, with_slo
from sweep.point.benchmark_metrics import calculate_metrics, is_good, parse_slo, slo_classes, slo_for
from sweep.point.records import RequestRecord
from workloads.spec import WorkloadFormatError

SLO_TEXT = "e2el=1000;interactive:ttft=100,tpot=50;batch:e2el=20000"


def record(index: int, request_class: str | None, ttft: float, e2el: float, ok: bool = True) -> RequestRecord:
    """A 5-chunk output sent at 0: TTFT `ttft`, last chunk at `e2el` (TPOT = (e2el - ttft) / 4)."""
    r = RequestRecord(index=index, requested_input_len=8, requested_output_len=5, intended_send_time=0.0)
    r.request_class, r.success = request_class, ok
    if ok:
        r.chunk_times = [ttft + (e2el - ttft) * k / 4 for k in range(5)]
        r.chunk_tokens = [1] * 5
        r.first_token_time, r.last_token_time, r.end_time = ttft, e2el, e2el
        r.output_tokens, r.prompt_tokens = 5, 8
    else:
        r.error, r.end_time = "HTTPStatus 500: boom", 0.1
    return r


def test_the_syntax() -> None:
    slo = parse_slo(SLO_TEXT)
    assert slo == {"e2el_ms": 1000.0, "interactive:ttft_ms": 100.0, "interactive:tpot_ms": 50.0,
                   "batch:e2el_ms": 20000.0}  # fmt: skip
    assert slo_classes(slo) == ["interactive", "batch"]
    assert slo_for(slo, "interactive") == {"e2el_ms": 1000.0, "ttft_ms": 100.0, "tpot_ms": 50.0}
    assert slo_for(slo, "batch") == {"e2el_ms": 20000.0}  # the class's own limit overrides the shared one
    assert slo_for(slo, None) == slo_for(slo, "other") == {"e2el_ms": 1000.0}
    assert parse_slo("ttft:500 tpot:50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}  # vLLM's colons are no class
    assert parse_slo("a-1:max_stall=300,valid=1") == {"a-1:max_stall_ms": 300.0, "a-1:valid": 1.0}
    assert normalize_slo(slo) == slo and normalize_slo({"batch:e2el": 5}) == {"batch:e2el_ms": 5.0}
    assert format_slo(slo) == "E2EL <= 1000 ms; interactive: TTFT <= 100 ms, TPOT <= 50 ms; batch: E2EL <= 20000 ms"


@pytest.mark.parametrize(("text", "message"), [
    ("interactive:ttft=100;interactive:tpot=5", "class 'interactive' is given twice"),
    ("ttft=100;ttft=200", "SLO ttft is given twice"),
    ("interactive:ttfx=100", "bad SLO item 'ttfx=100'"),
    ("interactive:ttft=soon", "milliseconds must be a number"),
    ("interactive:ttft:100", "bad SLO item 'interactive:ttft:100'"),
    ("interactive:,=", "bad SLO item '='"),
])
def test_syntax_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_slo(text)


def test_each_request_meets_its_own_class_slo() -> None:
    records = [
        record(0, "interactive", 0.05, 0.2),  # TTFT 50, TPOT 37.5, E2EL 200: good
        record(1, "interactive", 0.15, 0.3),  # TTFT 150 > 100: miss
        record(2, "interactive", 0.05, 0.5),  # TPOT 112.5 > 50: miss
        record(3, "batch", 3.0, 15.0),  # E2EL 15 s: within batch's own 20 s (not the shared 1 s)
        record(4, "batch", 3.0, 25.0),  # 25 s: miss
        record(5, "batch", 0.0, 0.0, ok=False),  # a failure misses
        record(6, None, 0.5, 0.9),  # unclassed: the shared E2EL 1 s only
    ]
    slo = parse_slo(SLO_TEXT)
    assert [is_good(r, slo) for r in records] == [True, False, False, True, False, False, True]
    m = calculate_metrics(records, duration=10.0, slo=slo)
    assert m["slo_attainment"] == pytest.approx(3 / 7) and m["request_goodput"] == pytest.approx(0.3)
    assert m["classes"] == {
        "interactive": {"requests": 3, "completed": 3, "request_goodput": pytest.approx(0.1),
                        "slo_attainment": pytest.approx(1 / 3)},
        "batch": {"requests": 3, "completed": 2, "request_goodput": pytest.approx(0.1),
                  "slo_attainment": pytest.approx(1 / 3)},
    }  # fmt: skip
    assert "classes" not in calculate_metrics(records, duration=10.0)  # no SLO: nothing to attain
    # the reports rebuild the classes from the stored rows and re-evaluate them under another SLO
    rows = pd.DataFrame([r.to_row("c0001") for r in records])
    assert [r.request_class for r in records_from_rows(rows)] == [r.request_class for r in records]
    points = pd.DataFrame([{"label": "c0001", "duration": 10.0}])
    again = with_slo(points, rows, parse_slo("batch:e2el=30000"))
    assert again["classes"][0]["batch"]["slo_attainment"] == pytest.approx(2 / 3)
    assert again["classes"][0]["interactive"]["slo_attainment"] == pytest.approx(1.0)  # no limit: success is good


def test_classes_from_a_trace_column_and_from_a_mixture(tmp_path: Path) -> None:
    trace = tmp_path / "classed.csv"
    trace.write_text("input_len,output_len,class\n10,5,interactive\n20,6,batch\n30,7,\n")
    assert [s.request_class for s in workloads.load(trace)] == ["interactive", "batch", None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_len": 10, "output_len": 5, "class": "two words"}) + "\n")
    with pytest.raises(WorkloadFormatError, match="row 1: class is 'two words'"):
        workloads.load(bad)
    mixed = workloads.load(f"mixture:fixed=1,{trace}=1", num_requests=40, seed=2)
    assert {s.request_class for s in mixed} == {"fixed", "interactive", "batch", "classed"}  # own class first
    # the classes reach the records through synthesis and the client: the sweep test below


def test_a_sweep_records_per_class_attainment_and_refuses_an_unknown_class(tmp_path: Path) -> None:
    from reports.importers import load_run
    from reports.tables import point_table
    from sweep.mock.calibrate import start_mock
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweeper import SweepConfig, run_sweep

    trace = tmp_path / "classed.csv"
    trace.write_text("input_len,output_len,class\n" + "".join(f"12,4,{c}\n" for c in ["interactive", "batch"] * 3))

    def config(slo: str, out: str) -> SweepConfig:
        return SweepConfig(output_dir=tmp_path / out, values=[2], url="http://127.0.0.1:9/v1", model="mock",
                           tokenizer="tiny-random", workload=WorkloadConfig(workload=str(trace)), num_prompts=6,
                           slo=parse_slo(slo), command="bench sweep (test)")  # fmt: skip

    with pytest.raises(ValueError, match=r"unknown class\(es\) \['chat'\].*classes are \['batch', 'interactive'\]"):
        run_sweep(config("interactive:ttft=100;chat:ttft=5", "refused"))
    assert not (tmp_path / "refused").exists()
    cfg = config("interactive:ttft=60000;batch:e2el=0", "run")  # batch's 0 ms E2EL cannot be met
    with start_mock(1.0, 0.5, tmp_path / "mock.log") as mock:
        cfg.url = mock.url
        run_dir = run_sweep(cfg)
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert [row["request_class"] for row in rows] == ["interactive", "batch"] * 3
    point = json.loads(next((run_dir / "points").glob("*.json")).read_text())
    assert point["slo_attainment"] == 0.5
    assert {name: c["slo_attainment"] for name, c in point["classes"].items()} == {"interactive": 1.0, "batch": 0.0}
    table = point_table(load_run(run_dir))
    assert table["attainment interactive"].tolist() == [1.0] and table["attainment batch"].tolist() == [0.0]
    goodput = point["classes"]["interactive"]["request_goodput"]  # the report shows each class's goodput too
    assert goodput > 0 and table["goodput interactive req/s"].tolist() == [goodput]
    assert table["goodput batch req/s"].tolist() == [0.0]


def test_tune_refuses_an_unknown_class_before_any_trial(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

    base = ["tune", "--model", "tiny-random", "--workload", "mixture:fixed=1,random=1", "--output-dir",
            str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, [*base, "--slo", "fixed:ttft=500;chat:ttft=100"])
    assert result.exit_code == 2 and "unknown class(es) ['chat']" in result.output, result.output
    assert "classes are ['fixed', 'random']" in result.output
    result = CliRunner().invoke(app, [*base, "--slo", "fixed:ttft=500;random:e2el=100", "--objective", "cost"])
    assert result.exit_code == 2 and "needs --cost-per-hour" in result.output  # accepted: the next check speaks
    assert not (tmp_path / "out").exists()


def test_a_simulated_point_carries_the_classes_too(tmp_path: Path) -> None:
    from sweep.simulate.simulation import load_profile
    from sweep.tune.backend import TrialWorkload
    from sweep.tune.objective import Infeasible
    from sweep.tune.simulate_first import SimulatedBackend

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "servelab-step-profile", "knobs": {"model": "tiny-random"}, "kv_cache": {"tokens": 4096},
        "cost_model": {"coefficients": {"overhead": 0.01, "tokens": 0.001}},
    }))  # fmt: skip
    trace = tmp_path / "classed.csv"
    trace.write_text("input_len,output_len,class\n" + "".join(f"12,4,{c}\n" for c in ["interactive", "batch"] * 2))
    workload = TrialWorkload(model="tiny-random", workload=str(trace), num_prompts=4,
                             slo=parse_slo("interactive:ttft=60000;batch:e2el=0"))  # fmt: skip
    with SimulatedBackend(load_profile(profile), workload).launch({"max_num_seqs": 2, "max_model_len": 128},
                                                                  tmp_path / "t0") as for_repeat:
        point = for_repeat(0)(2)
    assert point["slo_attainment"] == 0.5
    assert {name: c["slo_attainment"] for name, c in point["classes"].items()} == {"interactive": 1.0, "batch": 0.0}
    bad = TrialWorkload(model="tiny-random", workload=str(trace), num_prompts=4, slo=parse_slo("chat:ttft=5"))
    with pytest.raises(Infeasible, match=r"unknown class\(es\) \['chat'\]"):  # the Simulator's ValueError
        with SimulatedBackend(load_profile(profile), bad).launch({"max_num_seqs": 2}, tmp_path / "t1") as for_repeat:
            for_repeat(0)(2)
