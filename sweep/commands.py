"""The sweep package's `bench` commands outside simulate, tune and compare: `bench sweep`, `bench soak`,
`bench lab mock-server` and `bench lab calibrate`, with the hidden old names `bench mock-server` and
`bench calibrate`."""

from __future__ import annotations

import typer

from engine.cli_options import renamed_command
from sweep.mock.commands import calibrate, mock_server
from sweep.run.commands import sweep
from sweep.run.results import ReportRenderer
from sweep.soak.commands import soak


def register(app: typer.Typer, groups: dict[str, typer.Typer], render_report: ReportRenderer | None = None) -> None:
    """Add these commands to the `bench` app and its `lab` group; `bench sweep --report` renders with
    `render_report` (it reaches the command as its context's `obj`; without one, no report is written)."""
    app.command("sweep", context_settings={"obj": render_report})(sweep)
    app.command("soak")(soak)
    groups["lab"].command("mock-server")(mock_server)
    groups["lab"].command("calibrate")(calibrate)
    app.command("mock-server", hidden=True)(renamed_command(mock_server, "bench lab mock-server"))
    app.command("calibrate", hidden=True)(renamed_command(calibrate, "bench lab calibrate"))
