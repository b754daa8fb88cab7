"""`bench compare`'s one report: every target's run side by side, as ratios to the baseline, and the gate.

The first run is the baseline. `compare_rows` gives, per target and load point, the median TPOT, TTFT and
E2EL, the output throughput and the mean output length, and each as a ratio to the baseline's at the same
load (latencies: theirs / baseline, so < 1.0 is faster; throughput: theirs / baseline, so > 1.0 is more).
`write_compare` writes compare.md, compare.json and compare.html (with compare.png: TPOT p50 and output
throughput against load, one line per target), each with the weights every target served (its config.json's
`target.weights`, which `bench compare` records). `gate_targets` runs the gate (reports.gate.run_gate) of the
baseline against every other target.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `bench --help` imports this module: pandas only when a report is written
    from reports.importers import RunData

LATENCIES = ("median_tpot_ms", "median_ttft_ms", "median_e2el_ms")
FIGURES = (*LATENCIES, "output_throughput")


@dataclass(frozen=True)
class CompareRow:
    target: str
    load: float
    label: str
    completed: int
    failed: int
    median_tpot_ms: float
    median_ttft_ms: float
    median_e2el_ms: float
    output_throughput: float
    mean_output_tokens: float
    ratios: dict[str, float | None]  # figure -> theirs / baseline's at the same load (None: no baseline point)


@dataclass(frozen=True)
class GateOptions:
    """The gate's options as `bench compare --gate` takes them (parsed by reports.gate)."""

    metric: str = "ttft_p90,tpot_p50,e2el_p90,failure_rate"
    max_regression: str = "10%"
    alpha: float = 0.05
    noise_floor: str | None = None
    slo: dict[str, float] | None = None  # ms (parse_slo): slo_attainment and request_goodput rows per point and class


@dataclass(frozen=True)
class GateVerdict:
    target: str
    passed: bool
    table: str  # the gate's Markdown table
    result: Any  # the reports.gate.GateResult (for JUnit XML)


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def _rows(run: RunData) -> dict[float, dict[str, Any]]:
    out: dict[float, dict[str, Any]] = {}
    for load, (_, point) in zip(run.load_values(), run.points.iterrows(), strict=True):
        completed = int(_number(point.get("completed")) or 0)
        out[float(load)] = {
            "label": str(point.get("label")),
            "completed": completed,
            "failed": int(_number(point.get("failed")) or 0),
            **{name: _number(point.get(name)) for name in FIGURES},
            "mean_output_tokens": _number(point.get("total_output_tokens")) / max(completed, 1),
        }
    return out


def _ratio(value: float, base: float) -> float | None:
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return None
    return value / base


def compare_rows(runs: list[RunData]) -> list[CompareRow]:
    """One row per load point and target (loads ascending, targets in the given order; the first is the baseline)."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs (the first is the baseline)")
    tables = [_rows(run) for run in runs]
    loads = sorted({load for table in tables for load in table})
    rows = []
    for load in loads:
        base = tables[0].get(load)
        for run, table in zip(runs, tables, strict=True):
            if load not in table:
                continue
            point = table[load]
            ratios = {name: None if base is None else _ratio(point[name], base[name]) for name in FIGURES}
            rows.append(CompareRow(run.name, load, **point, ratios=ratios))
    return rows


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


HEADER = ("target", "{load}", "done", "failed", "TPOT p50 ms", "vs base", "TTFT p50 ms", "vs base", "E2EL p50 ms",
          "vs base", "output tok/s", "vs base", "mean out tokens")  # fmt: skip
EXPLANATION = ("TPOT, TTFT, E2EL: the target's median / the baseline's (< 1.00x is faster); output tok/s: the "
               "target's / the baseline's (> 1.00x is more).")  # fmt: skip


def _cells(r: CompareRow) -> list[str]:
    q = r.ratios
    return [r.target, f"{r.load:g}", str(r.completed), str(r.failed), f"{r.median_tpot_ms:.2f}",
            _x(q["median_tpot_ms"]), f"{r.median_ttft_ms:.1f}", _x(q["median_ttft_ms"]), f"{r.median_e2el_ms:.1f}",
            _x(q["median_e2el_ms"]), f"{r.output_throughput:.1f}", _x(q["output_throughput"]),
            f"{r.mean_output_tokens:.0f}"]  # fmt: skip


def describe_weights(weights: dict[str, Any] | None) -> str:
    """A run's `target.weights` in words: the source, its dtype (and quantization), what it was exported from."""
    if not weights or not weights.get("source"):
        return "unknown (not recorded: a cmd or url target, or a run made outside bench compare)"
    extras = [str(weights[k]) for k in ("dtype", "quantization") if weights.get(k)]
    text = str(weights["source"]) + (f" ({', '.join(extras)})" if extras else "")
    if weights.get("exported_from"):
        text += f", exported from {weights['exported_from']}"
    return text


def run_weights(runs: list[RunData]) -> dict[str, dict[str, Any] | None]:
    """Each run's recorded weights (None where its config.json has none)."""
    return {run.name: (run.config.get("target") or {}).get("weights") for run in runs}


def to_markdown(rows: list[CompareRow], baseline: str, load_name: str,
                weights: dict[str, dict[str, Any] | None] | None = None) -> str:
    lines = [
        f"### bench compare: ratios to `{baseline}`",
        "",
        EXPLANATION,
        "",
        "| " + " | ".join(HEADER).format(load=load_name) + " |",
        "|---|" + "---:|" * (len(HEADER) - 1),
        *("| " + " | ".join(_cells(r)) + " |" for r in rows),
    ]
    if weights:
        lines += ["", "weights each target served:", *(f"- `{n}`: {describe_weights(w)}" for n, w in weights.items())]
    return "\n".join(lines) + "\n"


def plot(runs: list[RunData], path: Path) -> Path:
    """TPOT p50 and output throughput against load, one line per run."""
    import matplotlib.pyplot as plt

    from reports.plots import colour, load_label, save, use_log_x, xy

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, column, title in zip(axes, ("median_tpot_ms", "output_throughput"),
                                 ("TPOT p50 (ms)", "output throughput (tok/s)"), strict=True):  # fmt: skip
        for i, run in enumerate(runs):
            x, y = xy(run, column)
            ax.plot(x, y, "-", marker="o", ms=3, color=colour(i), label=run.name)
        use_log_x(ax, runs)
        ax.set(title=title, xlabel=load_label(runs), ylabel=title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


def _html(rows: list[CompareRow], baseline: str, load_name: str, image: Path, verdicts: list[GateVerdict],
          weights: dict[str, dict[str, Any] | None]) -> str:
    data = base64.b64encode(image.read_bytes()).decode("ascii")
    head = "".join(f"<th>{html.escape(h.format(load=load_name))}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    gates = "".join(
        f"<h2>gate: {html.escape(v.target)}: {'PASS' if v.passed else 'FAIL'}</h2><pre>{html.escape(v.table)}</pre>"
        for v in verdicts
    )
    served = "".join(f"<li>{html.escape(n)}: {html.escape(describe_weights(w))}</li>" for n, w in weights.items())
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>bench compare</title></head><body>"
        f"<h1>bench compare: ratios to {html.escape(baseline)}</h1><p>{html.escape(EXPLANATION)}</p>"
        f"<img alt='TPOT and throughput vs load' src='data:image/png;base64,{data}'>"
        f"<table border='1'><tr>{head}</tr>{body}</table><p>weights each target served:</p><ul>{served}</ul>"
        f"{gates}</body></html>"
    )


def write_compare(runs: dict[str, Path], out_dir: Path, verdicts: list[GateVerdict] | None = None) -> Path:
    """compare.md, compare.json, compare.png and compare.html in `out_dir` for the named runs (the first is the
    baseline); returns compare.html's path."""
    from reports.importers import load_run

    data = [load_run(path, name=name) for name, path in runs.items()]
    rows = compare_rows(data)
    baseline = data[0].name
    load_name = "concurrency" if data[0].mode == "concurrency" else "req/s"
    weights = run_weights(data)
    table = to_markdown(rows, baseline, load_name, weights)
    verdicts = verdicts or []
    markdown = table + "".join(f"\n{v.table}" for v in verdicts)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.md").write_text(markdown)
    (out_dir / "compare.json").write_text(json.dumps({
        "baseline": baseline,
        "runs": {name: str(path) for name, path in runs.items()},
        "weights": weights,
        "rows": [asdict(r) for r in rows],
        "gate": {v.target: v.passed for v in verdicts},
    }, indent=2) + "\n")  # fmt: skip
    image = plot(data, out_dir / "compare.png")
    path = out_dir / "compare.html"
    path.write_text(_html(rows, baseline, load_name, image, verdicts, weights))
    return path


def check_gate_options(options: GateOptions) -> None:
    """Parse the gate's options (a ValueError names a bad one) before anything is measured."""
    _gate_config(options)


def _gate_config(options: GateOptions) -> Any:
    from reports.gate import GateConfig, parse_metric, parse_threshold
    from reports.recompute import normalize_slo

    config = GateConfig(
        metrics=tuple(m.strip() for m in options.metric.split(",") if m.strip()),
        max_regression=parse_threshold(options.max_regression),
        max_goodput_drop=parse_threshold(options.max_regression),  # goodput rows: the same relative threshold
        alpha=options.alpha,
        noise_floor=parse_threshold(options.noise_floor) if options.noise_floor is not None else None,
        slo=normalize_slo(options.slo),
    )
    if not config.metrics:
        raise ValueError("--metric is empty")
    if not 0 < config.alpha < 1:
        raise ValueError("--alpha must be between 0 and 1")
    for spec in config.metrics:
        parse_metric(spec)
    return config


def gate_targets(runs: dict[str, Path], options: GateOptions) -> list[GateVerdict]:
    """The gate of the first run (the baseline) against each other one."""
    from reports.gate import run_gate
    from reports.gate_output import to_markdown as gate_markdown
    from reports.importers import load_run

    config = _gate_config(options)
    (base_name, base_path), *others = runs.items()
    baseline = load_run(base_path)
    verdicts = []
    for name, path in others:
        result = run_gate(baseline, load_run(path), config)
        verdicts.append(GateVerdict(name, result.passed, gate_markdown(result, str(base_path), str(path)), result))
    return verdicts


def write_junit(verdict: GateVerdict, path: Path) -> Path:
    from reports.gate_output import write_junit as write

    return write(verdict.result, path)
