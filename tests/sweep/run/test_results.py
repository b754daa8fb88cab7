"""The run-directory writer and reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sweep.run.results import concurrency_label, load_results, open_run, rate_label

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sweep_a"


def test_labels() -> None:
    assert concurrency_label(16) == "c0016" and rate_label(2.0) == "r0002.00" and rate_label(math.inf) == "rinf"
    assert rate_label(0.25) == "r0000.25"


def test_write_resume_and_read_back(tmp_path: Path) -> None:
    config = {"target": {"url": "u", "backend": "openai"}, "workload": {"seed": 1}, "slo": None, "percentiles": [50]}
    writer = open_run(tmp_path / "run", config, resume=False)
    point = {"label": "r0002.00", "request_rate": 2.0, "max_concurrency": None, "completed": 1, "fidelity": {"a": 1}}
    writer.write_point(point, [{"label": "r0002.00", "index": 0, "itl": [0.1]}])
    writer.write_point({**point, "label": "rinf", "request_rate": math.inf}, [{"label": "rinf", "index": 0}])
    stored = json.loads((tmp_path / "run" / "points" / "rinf.json").read_text())
    assert stored["request_rate"] == "inf"  # vLLM's spelling
    summary = (tmp_path / "run" / "summary.csv").read_text().splitlines()
    assert summary[0].split(",") == ["label", "request_rate", "max_concurrency", "completed"]  # no nested fields
    assert [line.split(",")[0] for line in summary[1:]] == ["r0002.00", "rinf"]  # rate order
    assert not list((tmp_path / "run").glob(".*tmp*"))  # no temporary files left behind

    with pytest.raises(FileExistsError):
        open_run(tmp_path / "run", config, resume=False)
    with pytest.raises(ValueError, match="slo"):
        open_run(tmp_path / "run", {**config, "slo": {"ttft_ms": 1.0}}, resume=True)
    again = open_run(tmp_path / "run", config, resume=True)
    assert again.finished_labels() == {"r0002.00", "rinf"}
    results = load_results(tmp_path / "run")
    assert len(results.points) == 2 and results.requests["itl"].iloc[0] == [0.1]
    with pytest.raises(FileNotFoundError, match="not a sweep run directory"):
        load_results(tmp_path)


def test_reads_the_reports_fixture() -> None:
    """The reports helper's synthetic run follows the same contract; our reader must take it."""
    results = load_results(FIXTURE)
    assert set(results.points["label"]) == {"c0001", "c0002", "c0004", "c0008"}
    assert {"ttft", "e2el", "itl", "chunk_times", "server_timing", "run"} <= set(results.requests.columns)
    assert (results.requests["run"] == "sweep_a").all()
