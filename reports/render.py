"""`bench report`: a self-contained report.html (plots embedded as base64 PNG) and report.md (+ PNGs)."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from reports.cost import cost_vs_load, with_cost
from reports.importers import RunData, RunInputError, load_runs
from reports.recompute import format_slo, normalize_slo, with_slo
from reports.tables import fidelity_table, point_table, to_html, to_markdown, ttft_table, window_note
from sweep.mock.machine_speed import host_warnings
from sweep.point.saturation import is_saturated


@dataclass
class Section:
    title: str
    text: str = ""
    tables: list[tuple[str, object]] | None = None  # (caption, DataFrame)
    image: Path | None = None


def render_report(
    run_dirs: list[Path],
    out_dir: Path,
    slo: Mapping[str, float] | None = None,
    timeline_point: str | None = None,
    progress=None,
    cost=None,
) -> Path:
    """Render the report for one or more runs (overlaid, each labelled); returns the report.html path.

    `slo` (ms; `{"ttft_ms": 200, ...}` or `{"ttft": 200}`) re-evaluates goodput and attainment from the
    stored per-request rows; without it the first run's own SLO is used, if it had one. `cost`
    (`sweep.run.cost.CostConfig`) prices every point; without it, points priced by their sweep keep their price.
    """
    if not run_dirs:
        raise RunInputError("no run given")
    runs = load_runs(list(run_dirs))
    slo = normalize_slo(slo) or next((r.slo for r in runs if r.slo), None)
    for run in runs:
        run.points = with_slo(run.points, run.requests, slo)
        run.points = with_cost(run.points, run.requests, slo, cost, simulated=bool(run.config.get("simulated")))
    out_dir = Path(out_dir)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    sections = _sections(runs, slo, plot_dir, timeline_point, progress)
    title = "servelab report: " + " vs ".join(r.name for r in runs)
    (out_dir / "report.md").write_text(_markdown(title, runs, slo, sections, out_dir))
    html_path = out_dir / "report.html"
    html_path.write_text(_html(title, runs, slo, sections))
    return html_path


def _sections(runs: list[RunData], slo, plot_dir: Path, timeline_point: str | None, progress) -> list[Section]:
    from reports import plots, server_plots

    first = runs[0]
    label = timeline_point or str(first.points["label"].iloc[-1])
    if label not in set(first.points["label"]):
        raise RunInputError(f"--timeline-point {label!r} is not a point of {first.name}: {list(first.points['label'])}")
    figures = [
        ("latency", "Latency percentiles against load",
         "TTFT, TPOT (excluding the first token) and E2EL percentiles per point; dashed red: the SLO.",
         lambda: plots.latency_vs_load(runs, slo)),
        ("throughput_latency", "Throughput against latency",
         "Output tokens/s against TTFT and TPOT (p50 solid, p99 dashed).", lambda: plots.throughput_vs_latency(runs)),
        ("goodput", "Goodput and SLO attainment against load",
         f"Recomputed from the stored requests under the SLO: {format_slo(slo)}. vLLM's request_goodput "
         "(good requests / duration) and attainment (good / all, failures count as misses).",
         lambda: plots.goodput_vs_load(runs, slo)),
        ("cost", "Cost against load",
         "USD per million output tokens of good requests (the SLO's goodput) at the instance price; filled markers "
         "meet the 90 % attainment goal, dotted lines mark the largest load that does.",
         lambda: cost_vs_load(runs, slo)),
        ("pareto", "Pareto: tokens/s per user against tokens/s",
         "Per-user speed = output throughput / concurrency (rate sweeps: mean in-flight requests). "
         "Lines join each run's non-dominated points.", lambda: plots.pareto(runs)),
        ("cdf", "CDFs of TTFT and TPOT", "One curve per point; darker = higher load.", lambda: plots.cdfs(runs)),
        ("timeline", f"Request timeline ({first.name} {label})",
         "Grey: client queue (intended to actual send); orange: waiting for the first token; blue: streaming.",
         lambda: plots.timeline(first, label)),
        ("ttft_decomposition", "TTFT decomposition",
         "Mean server queue, prefill and the rest (network + client) from the server's timing field.",
         lambda: plots.ttft_breakdown(runs)),
        ("server_metrics", "Server-side metrics against load",
         "From the target's Prometheus /metrics, scraped over each point: counter deltas (prefix-cache hit rate, "
         "preemptions, speculative acceptance) and gauges sampled while it ran, beside the client's TTFT.",
         lambda: server_plots.server_metrics_vs_load(runs)),
        ("fidelity", "Workload fidelity", "Requested against realised token counts (server usage), per request.",
         lambda: plots.fidelity(runs)),
    ]
    notes = " ".join(note for note in [saturation_note(runs), *(window_note(r) for r in runs)] if note)
    sections = [Section("Points", text=notes, tables=[(r.name, point_table(r)) for r in runs])]
    for key, title, text, make in figures:
        if progress is not None:
            progress(key)
        fig = make()
        if fig is None:
            sections.append(Section(title, text="Not available: the runs carry no data for it."))
            continue
        section = Section(title, text=text, image=plots.save(fig, plot_dir / f"{key}.png"))
        if key == "ttft_decomposition":
            section.tables = [(r.name, t) for r in runs if (t := ttft_table(r)) is not None]
        if key == "fidelity":
            section.tables = [(r.name, fidelity_table(r)) for r in runs]
        sections.append(section)
    return sections


def saturation_note(runs: list[RunData]) -> str:
    """Which points over-saturated (they fail the SLO whatever their attainment) and which loads were skipped."""
    lines = []
    for run in runs:
        saturated = [str(p["label"]) for p in run.points.to_dict("records") if is_saturated(p)]
        if saturated:
            lines.append(f"{run.name}: over-saturated (the completions fell behind the offered rate while the "
                         f"in-flight count rose; counted as failing the SLO): {', '.join(saturated)}.")
        if run.skipped:
            skipped = ", ".join(f"{entry.get('label')} ({entry.get('reason')})" for entry in run.skipped)
            lines.append(f"{run.name}: not measured: {skipped}.")
    return " ".join(lines)


def _run_rows(runs: list[RunData]) -> list[tuple[str, str]]:
    rows = []
    for run in runs:
        target = run.config.get("target") or {}
        workload = {k: v for k, v in (run.config.get("workload") or {}).items() if v is not None}
        rows.append((run.name, f"source {run.source}; model {target.get('model')}; backend {target.get('backend')}; "
                               f"url {target.get('url')}; sweep {run.mode}; workload {json.dumps(workload)}; "
                               f"command {run.config.get('command')}"))
    return rows


def _host_warnings(runs: list[RunData]) -> list[str]:
    """The machine-speed check's warnings (busy or slow host), one line per run and warning."""
    return [f"{run.name}: {warning}" for run in runs for warning in host_warnings(run.config.get("calibration"))]


def _markdown(title: str, runs: list[RunData], slo, sections: list[Section], out_dir: Path) -> str:
    stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}"
    lines = [f"# {title}", "", f"Generated {stamp}. SLO: {format_slo(slo)}.", ""]
    lines += [f"> **Warning** ({warning})" for warning in _host_warnings(runs)]
    lines += [""] if _host_warnings(runs) else []
    lines += [f"- **{name}**: {desc}" for name, desc in _run_rows(runs)]
    for section in sections:
        lines += ["", f"## {section.title}", ""]
        if section.text:
            lines += [section.text, ""]
        if section.image is not None:
            lines += [f"![{section.title}]({section.image.relative_to(out_dir).as_posix()})", ""]
        for caption, table in section.tables or []:
            if len(runs) > 1:
                lines += [f"**{caption}**", ""]
            lines += [to_markdown(table), ""]
    return "\n".join(lines) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 6px;
text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}
code{font-size:12px}h2{border-bottom:1px solid #ddd;padding-bottom:4px}"""


def _no_links(text: str) -> str:
    """Escape text and break `scheme://` so nothing in the page reads as an external reference."""
    return html.escape(text).replace("://", "&#58;//")


def _html(title: str, runs: list[RunData], slo, sections: list[Section]) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_no_links(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{_no_links(title)}</h1>",
             f"<p>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}. "
             f"SLO: {_no_links(format_slo(slo))}.</p>"]
    parts += [f"<p style='color:#a60'><b>Warning</b> ({_no_links(w)})</p>" for w in _host_warnings(runs)]
    parts.append("<ul>")
    parts += [f"<li><b>{_no_links(name)}</b>: <code>{_no_links(desc)}</code></li>" for name, desc in _run_rows(runs)]
    parts.append("</ul>")
    for section in sections:
        parts.append(f"<h2>{_no_links(section.title)}</h2>")
        if section.text:
            parts.append(f"<p>{_no_links(section.text)}</p>")
        if section.image is not None:
            data = base64.b64encode(section.image.read_bytes()).decode("ascii")
            parts.append(f"<img alt='{_no_links(section.title)}' src='data:image/png;base64,{data}'>")
        for caption, table in section.tables or []:
            if len(runs) > 1:
                parts.append(f"<h3>{_no_links(caption)}</h3>")
            parts.append(to_html(table).replace("://", "&#58;//"))
    parts.append("</body></html>")
    return "\n".join(parts)
