"""Reports, notebooks' helpers and the CI regression gate over sweep results.

`render_report` is what cli.py hands to `bench sweep` and `bench tune` to render their runs; heavy imports
stay inside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def render_report(run_dirs: list[Path], out_dir: Path, slo: Mapping[str, float] | None = None) -> Path:
    """Write report.html (self-contained) and report.md (+ plots/) for the runs; returns report.html's path.

    `slo` in ms (`{"ttft_ms": 200, "tpot_ms": 50}` or `{"ttft": 200}`) re-evaluates goodput from the
    stored requests; None uses the first run's own SLO.
    """
    from reports.render import render_report as _render

    return _render([Path(p) for p in run_dirs], Path(out_dir), slo)
