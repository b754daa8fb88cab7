"""The `bench` command: one typer app; each package registers its own commands, wired to each other here.

Top level: the commands a user runs (serve, throughput, sweep, soak, tune, simulate, report, gate, compare) and
four groups: `bench workloads …`, `bench model …` (prepare and export checkpoints, profile step cost), `bench
check …` (correctness and machine checks) and `bench lab …` (studies of the tool itself). Old names are hidden aliases.
"""

from __future__ import annotations

from typing import Any

import typer

import engine.commands
import reports.commands
import reports.compare
import sweep.commands
import sweep.compare.commands
import sweep.simulate.commands
import sweep.tune.commands
import workloads
import workloads.commands

app = typer.Typer(
    name="bench",
    help="servelab: benchmark and tune LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(
    help="Prepare the default and other checkpoints, export them as HF directories; profile a model's step cost.",
    no_args_is_help=True,
)
check_app = typer.Typer(
    help="Correctness and machine checks: kernels, greedy output, quality, GPU.", no_args_is_help=True
)
lab_app = typer.Typer(
    help="Studies of the tool itself (gate noise, tuner efficiency, simulator fit, ...).", no_args_is_help=True
)


# The sweep never imports reports (workloads <- sweep <- reports) and the engine imports neither: their commands
# get the report renderer, the compare report and gate, and the workload loader from here.
def get_tokenizer(name: str) -> Any:
    """The engine's tokenizer resolver (aliases, HF dirs, .gguf), imported when a command first needs it."""
    from engine.tokenizer import get_tokenizer as resolve

    return resolve(name)


groups = {"model": model_app, "check": check_app, "lab": lab_app}
engine.commands.register(app, groups, load_workload=workloads.load, load_texts=workloads.load_texts)
workloads.commands.register(app, get_tokenizer=get_tokenizer)
sweep.commands.register(app, groups, render_report=reports.render_report)
sweep.tune.commands.register(app, groups, render_report=reports.render_report)
sweep.simulate.commands.register(app, groups, render_report=reports.render_report)
reports.commands.register(app, groups)
sweep.compare.commands.register(app, groups, judge=reports.compare)
app.add_typer(model_app, name="model")
app.add_typer(check_app, name="check")
app.add_typer(lab_app, name="lab")


if __name__ == "__main__":
    app()
