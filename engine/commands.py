"""`bench` sub-commands owned by this package. Import heavy modules inside each command."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `bench` app."""
    from engine.entrypoints.cli import serve

    app.command("serve")(serve)

    from engine.benchmarks.throughput import prepare_model, throughput

    app.command("throughput")(throughput)
    app.command("prepare-model")(prepare_model)
