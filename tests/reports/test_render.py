"""`bench report`: every plot rendered, a self-contained HTML, SLO re-evaluation, A/B overlays."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

import reports
from cli import app

PLOTS = ("latency", "throughput_latency", "goodput", "pareto", "cdf", "timeline", "ttft_decomposition", "fidelity")


def _assert_self_contained(html: str) -> None:
    assert "http://" not in html and "https://" not in html
    sources = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", html, flags=re.IGNORECASE)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources), sources[:3]
    assert "<link" not in html.lower() and "url(" not in html.lower() and "<script" not in html.lower()


def _row(markdown: str, label: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip(" |").split("|")]


def test_report_for_the_fixture_run(tmp_path, fixture_run):
    html_path = reports.render_report([fixture_run], tmp_path, slo={"ttft_ms": 0.001})
    assert html_path == tmp_path / "report.html"
    for name in PLOTS:
        png = tmp_path / "plots" / f"{name}.png"
        assert png.exists() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = html_path.read_text()
    _assert_self_contained(html)
    assert html.count("data:image/png;base64,") == len(PLOTS)
    markdown = (tmp_path / "report.md").read_text()
    for name in PLOTS:
        assert f"(plots/{name}.png)" in markdown
    assert "TTFT <= 0.001 ms" in markdown
    assert _row(markdown, "c0002")[-2:] == ["0", "0"]  # goodput and attainment under an impossible SLO


def test_cli_on_a_real_sweep_reevaluates_the_slo(tmp_path, fixtures_dir):
    mock_sweep = fixtures_dir / "mock_sweep"  # `bench sweep` against `bench lab mock-server` (TTFT 20 ms, gap 5 ms)
    result = CliRunner().invoke(app, ["report", str(mock_sweep), "--slo", "ttft=1,tpot=1000", "--out", str(tmp_path),
                                      "--timeline-point", "c0001"])
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report.md").read_text()
    assert "TTFT <= 1 ms, TPOT <= 1000 ms" in markdown
    assert _row(markdown, "c0004")[-1] == "0"  # the stored run met its own SLO (TTFT <= 40 ms); this one cannot
    for name in PLOTS:
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000
    _assert_self_contained((tmp_path / "report.html").read_text())
    bad = CliRunner().invoke(app, ["report", str(mock_sweep), "--slo", "itl=5", "--out", str(tmp_path)])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert bad.exit_code == 2


def test_ab_overlay_across_tools(tmp_path, fixture_run, fixture_run_b, fixtures_dir):
    runs = [fixture_run, fixture_run_b, fixtures_dir / "vllm_c0002.json", fixtures_dir / "guidellm_report.json"]
    reports.render_report(runs, tmp_path)
    markdown = (tmp_path / "report.md").read_text()
    for name in ("sweep_a", "sweep_b", "vllm_c0002", "guidellm_report"):
        assert f"**{name}**" in markdown
    _assert_self_contained((tmp_path / "report.html").read_text())
    decomposition = markdown.split("## TTFT decomposition")[1].split("## Workload fidelity")[0]
    assert "**sweep_a**" in decomposition and "vllm_c0002" not in decomposition  # imports carry no server timing


@pytest.mark.parametrize("point", ["c0099"])
def test_unknown_timeline_point(tmp_path, fixture_run, point):
    from reports.importers import RunInputError
    from reports.render import render_report

    with pytest.raises(RunInputError, match="timeline-point"):
        render_report([fixture_run], tmp_path, timeline_point=point)


def test_report_warns_when_the_host_was_busy_or_slow(tmp_path, fixture_run):
    run = tmp_path / "run"
    shutil.copytree(fixture_run, run)
    config = json.loads((run / "config.json").read_text())
    config["calibration"] = {"host": {"busy_cores": 1.4, "cpu_count": 2, "load_average_1m": 2.0},
                             "speed": {"cpu_matmul_gflops": 60.0}}
    (run / "config.json").write_text(json.dumps(config))
    html = reports.render_report([run], tmp_path / "report").read_text()
    markdown = (tmp_path / "report" / "report.md").read_text()
    for text in (markdown, html):
        assert "host busy: other processes kept 1.40 of 2 cores busy" in text
        assert "host slow: the machine-speed check measured 60 GFLOP/s" in text
    quiet = reports.render_report([fixture_run], tmp_path / "quiet")
    assert "host busy" not in quiet.read_text() and "Warning" not in (tmp_path / "quiet" / "report.md").read_text()


def test_the_point_table_and_the_window_line_say_what_the_figures_cover():
    from synthetic_runs import synthetic_run

    from reports.tables import point_table, window_note

    run = synthetic_run("steady", seed=5, num_prompts=20)
    assert window_note(run) == "" and "cancelled" not in point_table(run)
    labels = list(run.points["label"])
    run.points["window"] = ["steady"] + ["full"] * (len(labels) - 1)
    run.points["window_rule"] = ["auto"] + [None] * (len(labels) - 1)
    run.points["window_start_s"] = [1.0] + [None] * (len(labels) - 1)
    run.points["window_end_s"] = [9.5] + [None] * (len(labels) - 1)
    run.points["cancelled"] = [3] + [0] * (len(labels) - 1)
    note = window_note(run)
    assert f"{labels[0]} 1.0-9.5 s (auto)" in note and f"{labels[1]} whole point" in note
    assert point_table(run)["cancelled"].tolist() == [3] + [0] * (len(labels) - 1)
