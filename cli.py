"""The `bench` command: one typer app; each package registers its own commands."""

from __future__ import annotations

import typer

import engine.commands
import reports.commands
import sweep.commands
import sweep.tune.commands
import workloads.commands

app = typer.Typer(
    name="bench",
    help="servelab: benchmark and tune LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

for package_commands in (engine.commands, workloads.commands, sweep.commands, sweep.tune.commands, reports.commands):
    package_commands.register(app)


if __name__ == "__main__":
    app()
