"""`tune_report.html`: Optuna's matplotlib plots (embedded PNGs), the trial table and the best configuration;
`best_commands`: the best trials as runnable commands (best.json)."""

from __future__ import annotations

import base64
import html
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.run.results import ReportRenderer, write_atomic
from sweep.tune.quality_guard import CACHE_PREFIX as QUALITY_CACHE_PREFIX
from sweep.tune.study import best_trials, feasible

SPACE_NOTES = "space_notes"  # the study attribute `bench tune` stores the space's notes in

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
tr.infeasible{background:#fde}tr.pruned{background:#eee}code,pre{background:#f4f4f4;padding:2px 4px}
img{max-width:100%}"""


def _png(plot: Callable[[], Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = plot()
    panels = 1
    if hasattr(result, "flat"):  # an array of Axes (slice plots): one panel per parameter
        panels = len(result.flat)
        result = result.flat[0]
    figure = result.figure if hasattr(result, "figure") else result
    figure.set_size_inches(max(9.0, 4.0 * panels + 1.5), 5)
    if panels == 1:  # slice plots place their shared colour bar themselves; tight_layout would overlap it
        figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _section(title: str, plot: Callable[[], Any]) -> str:
    try:
        body = f'<img src="data:image/png;base64,{_png(plot)}" alt="{html.escape(title)}">'
    except Exception as err:  # a plot Optuna cannot draw yet (e.g. importances with one distinct trial)
        body = f"<p><em>Not available: {html.escape(str(err) or type(err).__name__)}</em></p>"
    return f"<h2>{html.escape(title)}</h2>\n{body}\n"


def plots(study: optuna.Study) -> str:
    from optuna.visualization import matplotlib as ovm

    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    sections = []
    if len(study.directions) == 1:
        sections.append(_section("Optimisation history", lambda: ovm.plot_optimization_history(study)))
        sections.append(_section("Parameter importances", lambda: ovm.plot_param_importances(study)))
        sections.append(_section("Slice plots", lambda: ovm.plot_slice(study)))
    else:
        sections.append(_section("Pareto front", lambda: ovm.plot_pareto_front(study, target_names=names)))
        for i, name in enumerate(names):

            def target(t: FrozenTrial, i: int = i) -> float:
                return t.values[i]

            sections.append(
                _section(
                    f"Optimisation history: {name}",
                    lambda target=target, name=name: ovm.plot_optimization_history(
                        study, target=target, target_name=name
                    ),
                )
            )
            sections.append(
                _section(
                    f"Parameter importances: {name}",
                    lambda target=target, name=name: ovm.plot_param_importances(study, target=target, target_name=name),
                )
            )
        sections.append(
            _section(
                f"Slice plots: {names[0]}",
                lambda: ovm.plot_slice(study, target=lambda t: t.values[0], target_name=names[0]),
            )
        )
    return "".join(sections)


def _quality_cell(trial: FrozenTrial) -> str:
    loss = trial.user_attrs.get("perplexity_increase")
    return "" if loss is None else f"{100 * loss:+.2f} %"


def _prediction_cell(trial: FrozenTrial) -> str:
    """The prediction and, with --simulate-first, what the launch-or-prune decision was based on."""
    text = ", ".join(f"{v:.4g}" for v in trial.user_attrs.get("predicted_values") or [])
    decision = trial.user_attrs.get("prune_decision")
    if not decision or "predicted" not in decision:
        return text
    parts = [decision["decision"]]
    if decision.get("optimistic") is not None:
        parts.append(f"optimistic {decision['optimistic']:.4g} (steps {decision['step_error']:.0%} faster)")
    if ref := decision.get("reference"):
        predicted = "-" if ref["predicted"] is None else f"{ref['predicted']:.4g}"
        parts.append(f"reference {ref['value']:.4g} = #{ref['trial']} (measured {ref['measured']:.4g}, predicted "
                     f"{predicted}), margin {decision['margin']:.0%}")
    return f"{text}: {'; '.join(parts)}"


def _trial_row(trial: FrozenTrial, param_names: list[str], quality: bool) -> str:
    status = trial.user_attrs.get("status", trial.state.name.lower())
    css = "infeasible" if status == "infeasible" else "pruned" if trial.state == TrialState.PRUNED else ""
    values = ", ".join(f"{v:.4g}" for v in trial.values) if trial.values else ""
    spread = trial.user_attrs.get("spread")
    cause = trial.user_attrs.get("cause")
    cells = [
        str(trial.number),
        trial.state.name,
        f"{status} ({cause})" if cause else status,
        values,
        ", ".join(f"{s:.3g}" for s in spread) if spread else "",
        _prediction_cell(trial),
        *([_quality_cell(trial)] if quality else []),
    ]
    cells += [str(trial.params.get(p, "")) for p in param_names]
    cells += [trial.user_attrs.get("error") or "", trial.user_attrs.get("run_dir", "")]
    row = "".join(f"<td>{html.escape(c[-300:])}</td>" for c in cells)
    return f'<tr class="{css}">{row}</tr>'


def trial_table(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    param_names = sorted({p for t in trials for p in t.params})
    quality = any("perplexity_increase" in t.user_attrs for t in trials)  # only with --max-quality-loss
    head = ["#", "state", "status", "values", "spread", "predicted", *(["quality (perplexity vs unquantized)"]
            if quality else []), *param_names, "error", "run dir"]
    rows = "\n".join(_trial_row(t, param_names, quality) for t in trials)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>\n{rows}</table>"


def best_section(study: optuna.Study, commands: list[dict[str, Any]]) -> str:
    if not commands:
        return "<p><strong>No feasible trial</strong>: no configuration met the SLO.</p>"
    parts = []
    for best in commands:
        parts.append(f"<h3>Trial {best['number']}: {html.escape(json.dumps(best['values']))}</h3>")
        parts.append(f"<pre>{html.escape(best['serve_command'])}</pre>")
        if best.get("launch_command"):
            parts.append(f"<pre>{html.escape(best['launch_command'])}</pre>")
        if best.get("sweep_report"):
            parts.append(
                f'<p>Sweep report: <a href="{html.escape(best["sweep_report"])}">'
                f"{html.escape(best['sweep_report'])}</a></p>"
            )
        parts.append(f"<p>Run directory: <code>{html.escape(best.get('run_dir') or '')}</code></p>")
    return "".join(parts)


def space_section(study: optuna.Study) -> str:
    """What the search space left out and why (`bench tune` prints the same `space:` lines), when anything was."""
    notes = study.user_attrs.get(SPACE_NOTES) or []
    if not notes:
        return ""
    items = "".join(f"<li>{html.escape(str(note))}</li>" for note in notes)
    return f"<h2>Search space: left out</h2>\n<ul>{items}</ul>\n"


def render_best_sweep_report(
    render_report: ReportRenderer, run_dir: str | None, slo: dict[str, float] | None = None
) -> str | None:
    """The best trial's sweep report, rendered into `<run_dir>/report`; its report.html's path, None without a run."""
    if not run_dir or not Path(run_dir).is_dir():
        return None
    return str(render_report([Path(run_dir)], Path(run_dir) / "report", slo=slo))


def write_report(study: optuna.Study, output_dir: Path, commands: list[dict[str, Any]]) -> Path:
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState if any(t.state == s for t in trials)}
    infeasible = sum(t.state == TrialState.COMPLETE and not feasible(t) for t in trials)
    info = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in study.user_attrs.items()
        if not k.startswith(QUALITY_CACHE_PREFIX)  # the quality cache shows per trial, in the quality column
        and k != SPACE_NOTES
    )
    title = f"bench tune: {html.escape(study.study_name)}"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>{STYLE}</style></head><body>
<h1>{title}</h1>
<table>{info}<tr><th>trials</th><td>{html.escape(json.dumps(counts))}, infeasible: {infeasible}</td></tr>
<tr><th>objectives</th><td>{html.escape(", ".join(study.metric_names or []))}</td></tr></table>
{space_section(study)}
<h2>Best configuration{"s (Pareto front)" if len(best_trials(study)) > 1 else ""}</h2>
{best_section(study, commands)}
{plots(study)}
<h2>Trials</h2>
{trial_table(study)}
</body></html>"""
    path = output_dir / "tune_report.html"
    write_atomic(path, page)
    return path


def best_commands(study: Any, model: str, launch_command: str | None) -> list[dict[str, Any]]:
    """Each best trial as a ready `bench serve ...` command (and the filled external template)."""
    from sweep.tune.space import fill_template, serve_command

    out: list[dict[str, Any]] = []
    for trial in best_trials(study):
        knobs = trial.user_attrs.get("knobs", trial.params)
        if any(entry["knobs"] == knobs for entry in out):  # a configuration measured twice shows once
            continue
        run_dir = trial.user_attrs.get("run_dir")
        out.append(
            {
                "number": trial.number,
                "values": trial.values,
                "knobs": knobs,
                "run_dir": run_dir,
                "serve_command": serve_command(model, knobs),
                "launch_command": (fill_template(launch_command, model, knobs, port=8000, host="127.0.0.1")
                               if launch_command else None),
                "metrics": trial.user_attrs.get("metrics", {}),
                "spread": trial.user_attrs.get("spread"),
            }
        )
    return out
