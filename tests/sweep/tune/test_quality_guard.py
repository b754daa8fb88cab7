"""`bench tune --max-quality-loss`: quality measured once per weight setting and cached in the study, a setting over
the bound infeasible (cause quality) without a launch, one under it launched, the report's quality column."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from tune_fakes import FakeBackend
from typer.testing import CliRunner

from cli import app
from engine import LLM
from sweep.tune.objective import Infeasible, ObjectiveSpec
from sweep.tune.quality_guard import QualityGuard, QualityGuardConfig, measure_in_process, parse_max_quality_loss
from sweep.tune.report import write_report
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import TuneObjective, feasible, open_study, run_study, storage_url

NOT_SEARCHED = dict.fromkeys(["enable_prefix_caching", "max_num_batched_tokens", "enable_chunked_prefill",
                              "max_model_len", "block_size", "tensor_parallel_size", "speculative_config"])  # fmt: skip
LOSS = {"int8": 0.01, "int4": 0.05}
SPEC = ObjectiveSpec(kind="goodput", attainment=0.5, load=2)


class CountingMeasure:
    def __init__(self) -> None:
        self.settings: list[dict[str, Any]] = []

    def __call__(self, setting: dict[str, Any]) -> dict[str, Any]:
        self.settings.append(setting)
        return {"perplexity_increase": LOSS[setting["quantization"]], "perplexity": 10.0}


def never_measured(setting: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError(f"measured {setting} again")


def guard(measure: Any) -> QualityGuard:
    return QualityGuard(QualityGuardConfig("tiny-random", 0.02, window=32, num_tokens=64), measure=measure)


def run(tmp_path: Path, objective_guard: QualityGuard | None, storage: bool = False
        ) -> tuple[optuna.Study, FakeBackend]:
    """A 3-trial grid over quantization, in memory (or in the SQLite storage a resume reopens)."""
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps({"max_num_seqs": {"choices": [2]},
                                      "quantization": {"choices": ["none", "int8", "int4"]}, **NOT_SEARCHED}))
    space = build_space(DeviceInfo(), space_file)
    backend = FakeBackend(capacity=lambda knobs: knobs["max_num_seqs"])
    study = (open_study(storage_url(None, tmp_path), "quality", SPEC, seed=0, info={}, grid=space.grid()) if storage
             else optuna.create_study(sampler=optuna.samplers.GridSampler(space.grid(), seed=0),
                                      directions=SPEC.directions))  # fmt: skip
    objective = TuneObjective(space, SPEC, backend, tmp_path, quality_guard=objective_guard)
    run_study(study, objective, 3, None, show_progress=False)
    return study, backend


@pytest.mark.parametrize(("text", "value"), [("2%", 0.02), (" 0.5 % ", 0.005), ("0.02", 0.02), ("0", 0.0)])
def test_the_bound_reads_as_a_percentage_or_a_fraction(text: str, value: float) -> None:
    assert math.isclose(parse_max_quality_loss(text), value)


@pytest.mark.parametrize(("text", "words"), [("-2%", "must be >= 0"), ("two", "percentage like 2%"),
                                             ("2", "write 2%")])  # fmt: skip
def test_a_bad_bound_is_an_error_naming_the_flag(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="--max-quality-loss") as err:
        parse_max_quality_loss(text)
    assert words in str(err.value)


def test_a_negative_bound_stops_bench_tune_before_any_trial(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["tune", "--model", "tiny-random", "--slo", "ttft=500", "--output-dir",
                                      str(tmp_path / "out"), "--max-quality-loss", "-2%"])  # fmt: skip
    assert result.exit_code == 2 and "--max-quality-loss must be >= 0" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sweep.tune.report.plots", lambda study: "")


def test_quality_is_measured_once_per_setting_and_a_setting_over_the_bound_never_launches(tmp_path: Path) -> None:
    measure = CountingMeasure()
    study, backend = run(tmp_path, guard(measure))
    assert sorted(s["quantization"] for s in measure.settings) == ["int4", "int8"]  # none is the reference
    assert all(t.state == TrialState.COMPLETE for t in study.trials) and len(study.trials) == 3
    assert {k["quantization"] for k in backend.launched} == {"none", "int8"}
    for trial in study.trials:
        quantization = trial.params["quantization"]
        assert trial.user_attrs["perplexity_increase"] == LOSS.get(quantization, 0.0)
        if quantization == "int4":
            assert trial.user_attrs["status"] == "infeasible" and trial.user_attrs["cause"] == "quality"
            assert not feasible(trial) and trial.values == [0.0]
            assert "+5.00 %" in trial.user_attrs["error"] and "--max-quality-loss 2.00 %" in trial.user_attrs["error"]
        else:
            assert trial.user_attrs["status"] == "ok" and feasible(trial)

    page = write_report(study, tmp_path, []).read_text()
    assert "quality (perplexity vs unquantized)" in page and "+5.00 %" in page and "+1.00 %" in page
    assert "infeasible (quality)" in page and "quality:{" not in page  # the cache stays out of the info table


def test_a_resumed_study_reads_the_cached_quality(tmp_path: Path) -> None:
    run(tmp_path, guard(CountingMeasure()), storage=True)
    study = open_study(storage_url(None, tmp_path), "quality", SPEC, seed=0, info={})
    study.enqueue_trial({"max_num_seqs": 2, "quantization": "int4"})
    study.enqueue_trial({"max_num_seqs": 2, "quantization": "int8"})
    space = build_space(DeviceInfo(), tmp_path / "space.json")
    backend = FakeBackend(capacity=lambda knobs: knobs["max_num_seqs"])
    run_study(study, TuneObjective(space, SPEC, backend, tmp_path, quality_guard=guard(never_measured)), 5, None,
              show_progress=False)
    resumed = study.trials[3:]
    assert [t.user_attrs["cause"] if t.user_attrs["status"] == "infeasible" else "ok" for t in resumed] == [
        "quality", "ok"]  # fmt: skip
    assert [k["quantization"] for k in backend.launched] == ["int8"]


def test_without_the_flag_nothing_is_measured_and_the_report_has_no_quality_column(tmp_path: Path) -> None:
    study, backend = run(tmp_path, None)
    assert len(backend.launched) == 3 and all("perplexity_increase" not in t.user_attrs for t in study.trials)
    assert "quality (perplexity" not in write_report(study, tmp_path, []).read_text()


def test_the_measurement_is_bench_quality_on_tiny_random(tmp_path: Path) -> None:
    study = optuna.create_study(storage=storage_url(None, tmp_path))
    config = QualityGuardConfig("tiny-random", 1.0, window=16, num_tokens=32)
    record = QualityGuard(config, measure_in_process(config)).quality(study, {"quantization": "int8", "dtype":
                                                                              "float32", "max_num_seqs": 4})
    assert record["setting"] == {"dtype": "float32", "quantization": "int8", "kv_cache_dtype": "auto"}
    assert record["num_scored_tokens"] == 30
    assert math.isclose(record["perplexity_increase"], record["perplexity"] / record["reference_perplexity"] - 1)
    assert not any(isinstance(o, LLM) for o in gc.get_objects())  # both engines' memory is released
    (key,) = study.user_attrs
    assert json.loads(key.removeprefix("quality:"))["window"] == 16 and study.user_attrs[key] == record
    assert json.loads(key.removeprefix("quality:"))["chunk_tokens"] == 64
    with pytest.raises(Infeasible, match="fp8") as err:  # the engine refuses fp8 (not implemented): so would the trial
        QualityGuard(config, measure_in_process(config)).quality(study, {"quantization": "fp8"})
    assert err.value.cause == "start"


def test_the_kv_cache_dtype_is_part_of_the_setting_measured_and_cached() -> None:
    measure = CountingMeasure()
    LOSS["none"] = 0.001  # the bfloat16 KV cache's cost, as if measured
    try:
        quality_guard, study = guard(measure), optuna.create_study()
        assert quality_guard.quality(study, {"quantization": "none", "kv_cache_dtype": "auto"})[
            "perplexity_increase"] == 0.0  # the reference itself: never measured
        for knobs in ({"quantization": "none", "kv_cache_dtype": "bfloat16"}, {"quantization": "int8"},
                      {"quantization": "int8", "kv_cache_dtype": "bfloat16"}, {"quantization": "int8",
                                                                               "kv_cache_dtype": "auto"}):
            quality_guard.quality(study, knobs)
    finally:
        del LOSS["none"]
    assert measure.settings == [{"quantization": "none", "kv_cache_dtype": "bfloat16"},
                                {"quantization": "int8", "kv_cache_dtype": "auto"},
                                {"quantization": "int8", "kv_cache_dtype": "bfloat16"}]  # int8+auto: cached
    assert len(study.user_attrs) == 3


def test_the_measurement_reads_the_kv_cache_so_a_bfloat16_cache_costs_something(tmp_path: Path) -> None:
    """Chunks below the window: later chunks attend over the bfloat16 cache (with one chunk per window they would
    not, and the loss would be exactly 0)."""
    study = optuna.create_study()
    config = QualityGuardConfig("tiny-random", 1.0, window=16, num_tokens=32, chunk_tokens=4)
    record = QualityGuard(config, measure_in_process(config)).quality(
        study, {"quantization": "none", "kv_cache_dtype": "bfloat16", "dtype": "float32"})
    assert record["setting"] == {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "bfloat16"}
    assert record["kv_cache_dtype"] == "bfloat16" and record["perplexity_increase"] != 0.0
