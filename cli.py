"""The `bench` command: one typer app; each package registers its own commands, wired to each other here."""

from __future__ import annotations

import typer

import engine.commands
import reports.commands
import sweep.commands
import sweep.simulate_commands
import sweep.tune.commands
import workloads
import workloads.commands

app = typer.Typer(
    name="bench",
    help="servelab: benchmark and tune LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# The sweep never imports reports (workloads <- sweep <- reports) and the engine imports neither: their commands
# get the report renderer and the workload loader from here.
engine.commands.register(app, load_workload=workloads.load, load_texts=workloads.load_texts)
workloads.commands.register(app)
sweep.commands.register(app, render_report=reports.render_report)
sweep.tune.commands.register(app, render_report=reports.render_report)
sweep.simulate_commands.register(app, render_report=reports.render_report)
reports.commands.register(app)


if __name__ == "__main__":
    app()
