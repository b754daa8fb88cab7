"""`bench report`: every plot rendered, a self-contained HTML, SLO re-evaluation, A/B overlays."""

from __future__ import annotations

import re

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


def test_report_for_the_fixture_run(tmp_path, fixture_run):
    html_path = reports.render_report([fixture_run], tmp_path)
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
    assert "| c0008 |" in markdown and "SLO attainment" in markdown


def test_slo_is_reevaluated_from_stored_requests(tmp_path, fixture_run):
    reports.render_report([fixture_run], tmp_path / "strict", slo={"ttft_ms": 0.001})
    reports.render_report([fixture_run], tmp_path / "loose", slo={"ttft": 1e6})
    strict = (tmp_path / "strict" / "report.md").read_text()
    loose = (tmp_path / "loose" / "report.md").read_text()
    assert "TTFT <= 0.001 ms" in strict and "TTFT <= 1e+06 ms" in loose
    row = next(line for line in strict.splitlines() if line.startswith("| c0002 |"))
    assert row.rstrip(" |").endswith("| 0 | 0")  # goodput and attainment both 0 under an impossible SLO
    row = next(line for line in loose.splitlines() if line.startswith("| c0002 |"))
    assert row.rstrip(" |").endswith("| 1")  # c0002 had no failure: everything is good


def test_ab_overlay_and_imported_runs(tmp_path, fixture_run, fixture_run_b, fixtures_dir):
    reports.render_report([fixture_run, fixture_run_b], tmp_path / "ab")
    markdown = (tmp_path / "ab" / "report.md").read_text()
    assert "**sweep_a**" in markdown and "**sweep_b**" in markdown
    _assert_self_contained((tmp_path / "ab" / "report.html").read_text())
    reports.render_report([fixtures_dir / "vllm_c0002.json", fixtures_dir / "guidellm_report.json"], tmp_path / "x")
    markdown = (tmp_path / "x" / "report.md").read_text()
    assert "## TTFT decomposition" in markdown and "Not available" in markdown  # no server timing in imports


def test_cli(tmp_path, fixture_run):
    result = CliRunner().invoke(app, ["report", str(fixture_run), "--slo", "ttft=30,tpot=11", "--out", str(tmp_path),
                                      "--timeline-point", "c0002"])
    assert result.exit_code == 0, result.output
    assert "TTFT <= 30 ms, TPOT <= 11 ms" in (tmp_path / "report.md").read_text()
    bad = CliRunner().invoke(app, ["report", str(fixture_run), "--slo", "itl=5", "--out", str(tmp_path)])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert bad.exit_code == 2


@pytest.mark.parametrize("point", ["c0099"])
def test_unknown_timeline_point(tmp_path, fixture_run, point):
    from reports.importers import RunInputError
    from reports.render import render_report

    with pytest.raises(RunInputError, match="timeline-point"):
        render_report([fixture_run], tmp_path, timeline_point=point)
