"""`bench throughput --vary`: parsing, the grid, each point's engine knobs, the ratio table, and runs on
tiny-random (figures are measured, never asserted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from engine.benchmarks.throughput_run import ThroughputResult
from engine.benchmarks.vary import (
    Vary,
    VaryError,
    VaryPoint,
    compare,
    expand_grid,
    parse_varies,
    parse_vary,
    point_knobs,
    ratio_table,
)

SMALL = ["--model", "tiny-random", "--num-prompts", "2", "--input-len", "8", "--output-len", "4"]
SMALL += ["--max-model-len", "64"]


def test_values_take_the_knobs_types() -> None:
    assert parse_vary("tensor_parallel_size=1, 2") == Vary("tensor_parallel_size", (1, 2))
    assert parse_vary("dtype=float32,bfloat16") == Vary("dtype", ("float32", "bfloat16"))
    assert parse_vary("gpu_memory_utilization=0.5,0.9") == Vary("gpu_memory_utilization", (0.5, 0.9))
    assert parse_vary("enable_prefix_caching=true,False") == Vary("enable_prefix_caching", (True, False))
    assert parse_vary("cpu_threads=default,1") == Vary("cpu_threads", (None, 1))
    assert parse_vary("num_speculative_tokens=0,4") == Vary("num_speculative_tokens", (0, 4))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dtype", "KNOB=V1,V2"),
        ("=1,2", "KNOB=V1,V2"),
        ("no_such_knob=1", "no_such_knob: not an engine knob; the knobs are"),
        ("max_num_seqs=", "comma-separated values, none empty"),
        ("max_num_seqs=1,,2", "none empty"),
        ("max_num_seqs=1,x", "'x' is not an integer"),
        ("gpu_memory_utilization=half", "is not a number"),
        ("enable_prefix_caching=yes", "true or false"),
        ("num_speculative_tokens=-1", "integers >= 0"),
        ("dtype=float32,float32", "appears twice"),
        ("speculative_config=x", "vary num_speculative_tokens"),
        ("model=a,b", "bench compare"),
    ],
)
def test_bad_vary_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(VaryError, match=re.escape(message)):
        parse_vary(text)


def test_a_knob_is_varied_once_and_not_also_set() -> None:
    with pytest.raises(VaryError, match="given twice"):
        parse_varies(["dtype=float32", "dtype=bfloat16"], {})
    with pytest.raises(VaryError, match="--vary dtype and --dtype both set it"):
        parse_varies(["dtype=float32,bfloat16"], {"dtype": "float32"})


def test_the_grid_is_the_product_with_the_first_vary_outermost() -> None:
    varies = parse_varies(["dtype=float32,bfloat16", "quantization=none,int8,int4"], {})
    grid = expand_grid(varies)
    assert [tuple(c.values()) for c in grid] == [("float32", "none"), ("float32", "int8"), ("float32", "int4"),
                                                 ("bfloat16", "none"), ("bfloat16", "int8"), ("bfloat16", "int4")]
    assert expand_grid([]) == [{}]


def test_speculative_depth_sets_an_ngram_config_or_replaces_the_given_ones_depth() -> None:
    assert point_knobs({"seed": 0}, {"num_speculative_tokens": 0}) == {"seed": 0}
    assert json.loads(point_knobs({}, {"num_speculative_tokens": 3})["speculative_config"]) == {
        "method": "ngram", "num_speculative_tokens": 3}  # fmt: skip
    base = {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2}'}
    assert json.loads(point_knobs(base, {"num_speculative_tokens": 5})["speculative_config"]) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2}  # fmt: skip
    assert point_knobs({"cpu_threads": 2}, {"cpu_threads": None}) == {}  # default: the knob is left unset


def _result(output_tok_s: float, digest: str | None = None, **extra: object) -> ThroughputResult:
    result = ThroughputResult("engine", "m", "float32", 2, 1.0, 24, 8, 2.0, 3 * output_tok_s, output_tok_s)
    result.greedy_output_sha256 = digest
    for name, value in extra.items():
        setattr(result, name, value)
    return result


def test_ratios_against_the_first_combination_and_the_first_value_of_the_first_vary() -> None:
    varies = parse_varies(["num_speculative_tokens=0,2", "max_num_seqs=1,8"], {})
    speeds = [10.0, 40.0, 15.0, 80.0]
    points: list[VaryPoint] = []
    for combination, speed in zip(expand_grid(varies), speeds, strict=True):
        spec = {"acceptance_rate": 0.5, "mean_acceptance_length": 2.0, "acceptance_rate_per_position": [0.6, 0.4]}
        extra = spec if combination["num_speculative_tokens"] else {}
        points.append(compare(VaryPoint(combination, _result(speed, "same", **extra)), points, varies))
    assert [p.ratio for p in points] == [1.0, 4.0, 1.5, 8.0]
    assert [p.ratio_vs_first_value for p in points] == [1.0, 1.0, 1.5, 2.0]  # K=2 against K=0 at the same seqs
    assert all(p.outputs_match for p in points)
    lines = ratio_table(points, varies).splitlines()
    assert lines[0].startswith("| num_speculative_tokens | max_num_seqs | elapsed s | total tok/s | output tok/s |")
    assert "| vs first | vs num_speculative_tokens=0 |" in lines[0] and "| acceptance |" in lines[0]
    assert "step ms" not in lines[0]  # no point has tensor parallelism
    assert lines[5] == ("| 2 | 8 | 1.0 | 240.0 | 80.0 | 8.00× | 2.00× | — | — | yes | 0.50 | 2.00 | 0.60 0.40 |")
    assert lines[2].endswith("| yes | — | — | — |")


def test_outputs_match_only_for_greedy_runs() -> None:
    varies = [parse_vary("dtype=float32,bfloat16")]
    first = compare(VaryPoint({"dtype": "float32"}, _result(1.0, "a")), [], varies)
    assert compare(VaryPoint({"dtype": "bfloat16"}, _result(1.0, "b")), [first], varies).outputs_match is False
    sampled = compare(VaryPoint({"dtype": "float32"}, _result(1.0)), [], varies)
    assert sampled.outputs_match is None and sampled.ratio_vs_first_value is None
    assert "same tokens" not in ratio_table([sampled], varies)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vary", "no_such_knob=1"], "not an engine knob"),
        (["--vary", "max_num_seqs=1,x"], "is not an integer"),
        (["--vary", "dtype="], "none empty"),
        (["--vary", "max_num_seqs=2", "--max-num-seqs", "2"], "both set it"),
        (["--vary", "dtype=float32", "--backend", "hf"], "engine backend only"),
    ],
)
def test_bad_vary_fails_before_any_engine_loads(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.benchmarks import throughput

    monkeypatch.setattr(throughput, "run_engine", lambda *a, **k: pytest.fail("an engine ran"))
    result = CliRunner().invoke(app, ["throughput", *SMALL, *args])
    assert result.exit_code == 2 and message in result.output


def test_every_points_configuration_is_checked_before_the_first_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.benchmarks import throughput

    monkeypatch.setattr(throughput, "run_engine", lambda *a, **k: pytest.fail("an engine ran"))
    # A value no knob takes is a usage error from the knob's own parser, before any configuration is built.
    result = CliRunner().invoke(app, ["throughput", *SMALL, "--vary", "quantization=none,fp8"])
    assert result.exit_code == 2 and "'fp8' is not one of none, int8, int4" in result.output
    result = CliRunner().invoke(app, ["throughput", *SMALL, "--vary", "tensor_parallel_size=1,3"])
    assert result.exit_code == 1 and "tensor_parallel_size=3 does not split" in result.output


def test_a_greedy_grid_on_tiny_random_writes_every_point(tmp_path: Path) -> None:
    out = tmp_path / "vary.json"
    args = ["throughput", *SMALL, "--temperature", "0", "--vary", "max_num_seqs=2,1", "--output-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["varied"] == {"max_num_seqs": [2, 1]}
    first, second = document["points"]
    assert (first["settings"], second["settings"]) == ({"max_num_seqs": 2}, {"max_num_seqs": 1})
    assert first["ratio"] == 1.0 and second["ratio"] == pytest.approx(
        second["output_tokens_per_second"] / first["output_tokens_per_second"])  # fmt: skip
    assert first["total_num_tokens"] == second["total_num_tokens"] == 24
    assert second["outputs_match"] is True and second["median_tpot_ms"] > 0  # the batch changes no greedy token
    assert "| max_num_seqs | elapsed s |" in result.output and "| 1 |" in result.output
    assert "max_num_seqs=1: 2 requests" in result.output


@pytest.mark.slow  # four engines, speculation on a text workload: ~30 s on 2 cores
def test_speculative_depth_against_none_at_two_batch_sizes(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    args = ["throughput", "--model", "tiny-random", "--workload", "copy-heavy", "--num-prompts", "2",
            "--output-len", "6", "--max-model-len", "512", "--temperature", "0", "--vary",
            "num_speculative_tokens=0,2", "--vary", "max_num_seqs=1,2", "--output-json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())["points"]
    assert [(p["settings"]["num_speculative_tokens"], p["settings"]["max_num_seqs"]) for p in points] == [
        (0, 1), (0, 2), (2, 1), (2, 2)]  # fmt: skip
    for point in points:
        assert point["outputs_match"] is True and 0 < point["total_output_tokens"] <= 12
        speculating = point["settings"]["num_speculative_tokens"] > 0
        assert (point["acceptance_rate"] is not None) == speculating
        assert len(point["acceptance_rate_per_position"] or []) == (2 if speculating else 0)
    assert "| vs num_speculative_tokens=0 |" in result.output and "| acceptance |" in result.output
