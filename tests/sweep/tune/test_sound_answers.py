"""The tuner's answers are sound: every trial measures the same requests (no max_model_len below the workload's
longest request, whatever the workload kind), and a configuration pays for the devices it occupies."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import typer
from typer.testing import CliRunner

import workloads
from sweep.point.prompts import workload_specs
from sweep.point.runner import WorkloadConfig
from sweep.tune.backend import EngineBackend, TrialWorkload
from sweep.tune.commands import tune
from sweep.tune.space import DeviceInfo
from sweep.tune.workload_lengths import longest_request, prompt_counts

SEED, NUM_PROMPTS = 3, 6


class RecordingBackend:
    """Stands in for `EngineBackend`: each trial records the requests its points send (the sweep's own
    `workload_specs`, fitted to the trial's max_model_len as `EngineBackend` configures the sweep); all meet the SLO."""

    made: list[RecordingBackend] = []

    def __init__(self, workload: TrialWorkload, **_: Any) -> None:
        self.workload = workload
        self.requests: list[tuple[dict[str, Any], list[tuple[int, int]]]] = []
        RecordingBackend.made.append(self)

    @contextlib.contextmanager
    def launch(self, knobs: dict[str, Any], trial_dir: Path) -> Iterator[Callable[[int], Any]]:
        w = self.workload

        def for_repeat(repeat: int) -> Callable[[float], dict[str, Any]]:
            def measure(load: float) -> dict[str, Any]:
                n = max(w.num_prompts, int(load))
                fitted = WorkloadConfig(workload=w.workload, input_len=w.input_len, output_len=w.output_len,
                                        seed=w.seed, max_model_len=knobs.get("max_model_len"))
                specs, _ = workload_specs(fitted, n, w.seed)
                self.requests.append((knobs, [(s.input_len, s.output_len) for s in specs]))
                return {"label": f"c{int(load):04d}", "max_concurrency": int(load), "slo_attainment": 1.0,
                        "request_goodput": 1.0, "p90_ttft_ms": 1.0, "completed": n}
            return measure

        yield for_repeat


def run_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, space: dict[str, Any], *flags: str) -> Any:
    RecordingBackend.made.clear()
    monkeypatch.setattr("sweep.tune.backend.EngineBackend", RecordingBackend)
    # Neither the machine nor the model's heads matter here (and reading them imports torch), nor the plots.
    monkeypatch.setattr(DeviceInfo, "detect", classmethod(lambda cls, **known: cls(device="cpu", **known)))
    monkeypatch.setattr("sweep.tune.commands._model_tensor_parallel_sizes", lambda model: None)
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")
    (tmp_path / "space.json").write_text(json.dumps(space))
    app = typer.Typer()
    app.command()(tune)
    return CliRunner().invoke(app, [
        "--model", "mock", "--slo", "ttft=500", "--objective", "goodput", "--concurrency", "2", "--grid",
        "--space", str(tmp_path / "space.json"), "--output-dir", str(tmp_path / "study"), "--seed", str(SEED),
        "--num-prompts", str(NUM_PROMPTS), "--launch-command", "engine --port {port} {knob_flags}", *flags,
    ], env={"COLUMNS": "250"})  # fmt: skip


def lmsys_longest() -> int:
    specs = workloads.load("lmsys", num_requests=NUM_PROMPTS, seed=SEED)
    return max(s.input_len + s.output_len for s in specs)


PINNED = {"max_num_batched_tokens": None, "enable_chunked_prefill": None, "enable_prefix_caching": None,
          "block_size": None, "tensor_parallel_size": None, "speculative_config": None}


def test_a_shipped_mix_study_never_clips_a_trial_s_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    longest = lmsys_longest()
    short, exact, long = longest - 1, longest, 2 * longest  # `short` would clip the longest request
    space = {**PINNED, "max_num_seqs": {"choices": [1, 2]}, "max_model_len": {"choices": [short, exact, long]}}
    done = run_tune(tmp_path, monkeypatch, space, "--workload", "lmsys")
    assert done.exit_code == 0, done.output
    (backend,) = RecordingBackend.made
    lengths = {k["max_model_len"] for k, _ in backend.requests}
    assert lengths == {exact, long} and len(backend.requests) == 4  # the grid, less the clipping choice
    measured = [requests for _, requests in backend.requests]
    assert all(requests == measured[0] for requests in measured)  # every trial measured the same requests
    assert measured[0] == [(s.input_len, s.output_len)
                           for s in workloads.load("lmsys", num_requests=NUM_PROMPTS, seed=SEED)]  # unclipped
    said = " ".join(done.output.split())
    assert f"max_model_len: excluded [{short}] (shorter than the workload's longest request, {longest} tokens" in said
    page = (tmp_path / "study" / "tune_report.html").read_text()
    assert "Search space: left out" in page and f"excluded [{short}]" in page
    (name,) = optuna.get_all_study_names(f"sqlite:///{tmp_path / 'study' / 'tune.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study' / 'tune.db'}")
    assert study.user_attrs["longest_request"] == longest


def test_no_context_long_enough_is_a_usage_error_before_any_trial(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    longest = lmsys_longest()
    space = {**PINNED, "max_num_seqs": {"fixed": 1}, "max_model_len": {"choices": [longest // 2, longest - 1]}}
    done = run_tune(tmp_path, monkeypatch, space, "--workload", "lmsys")
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert f"max_model_len: no choice of [{longest // 2}, {longest - 1}] fits the workload's longest request" in said
    assert not RecordingBackend.made and not (tmp_path / "study").exists()


def test_a_pinned_short_context_is_allowed_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    longest = lmsys_longest()
    space = {**PINNED, "max_num_seqs": {"choices": [1, 2]}, "max_model_len": longest - 1}
    done = run_tune(tmp_path, monkeypatch, space, "--workload", "lmsys")
    assert done.exit_code == 0, done.output
    measured = [requests for _, requests in RecordingBackend.made[0].requests]
    assert len(measured) == 2 and measured[0] == measured[1]  # clipped alike in every trial
    assert f"pinned to {longest - 1}, shorter than the workload's longest request" in " ".join(done.output.split())


def test_a_trace_file_s_longest_request_is_of_the_requests_each_point_draws(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [{"input_len": 10 * (i + 1), "output_len": 5} for i in range(40)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    counts = prompt_counts(4, "concurrency", 1, 8)
    assert counts == [4, 5, 6, 7, 8]  # at least one prompt per stream
    assert prompt_counts(4, "rate", 1, 8) == [4]
    drawn = [workloads.load(trace, num_requests=n, seed=1) for n in counts]
    expected = max(s.input_len + s.output_len for specs in drawn for s in specs)
    assert longest_request(str(trace), None, None, 1, counts, "tiny-random") == expected
    assert longest_request(str(trace), None, None, 1, [40], "tiny-random") == 405  # every row: the longest one
    assert longest_request("fixed", 100, 20, 0, [4], "tiny-random") == 120
    counts = prompt_counts(NUM_PROMPTS, "concurrency", 1, 200)  # drawn largest first, stopped at the mix's longest
    exhaustive = max(s.input_len + s.output_len for n in counts for s in workloads.load("lmsys", num_requests=n,
                                                                                         seed=SEED))
    assert longest_request("lmsys", None, None, SEED, counts, "tiny-random") == exhaustive


@pytest.mark.slow
def test_a_tensor_parallel_2_trial_costs_twice_a_tensor_parallel_1_trial(tmp_path: Path) -> None:
    """Through the tuner's own backend (the sweep against an engine it launched): same engine, same throughput
    figures, and the trial on two GPUs pays for two of the instance's eight."""
    template = f"{sys.executable} -m sweep.mock.server --port {{port}} --ttft-ms 1 --itl-ms 1"
    workload = TrialWorkload(model="mock", tokenizer="tiny-random", workload="fixed", input_len=16, output_len=4,
                             num_prompts=4, num_warmups=0, cost_per_hour=8.0, gpus_per_instance=8)
    backend = EngineBackend(workload, launch_command=template, startup_timeout_s=60)
    points = {}
    for tp in (1, 2):
        with backend.launch({"device": "cuda", "tensor_parallel_size": tp}, tmp_path / f"tp{tp}") as for_repeat:
            points[tp] = for_repeat(0)(1)
    one, two = points[1], points[2]
    assert (one["devices_used"], two["devices_used"]) == (1, 2)
    assert (one["configuration_cost_per_hour"], two["configuration_cost_per_hour"]) == (1.0, 2.0)
    for point in (one, two):  # the cost of a million tokens at the point's own goodput, from that price
        assert point["cost_per_million_output_tokens"] == pytest.approx(
            point["configuration_cost_per_hour"] / (3600 * point["goodput_output_throughput"]) * 1e6)
    stored = json.loads(next((tmp_path / "tp2" / "repeat0" / "points").glob("*.json")).read_text())
    assert stored["devices_used"] == 2 and stored["instances_used"] == 0.25

