"""The report's cost: dollars per million output tokens at each point's goodput, and its plot against load.

A point's price is `--cost-per-hour` (and `--gpus-per-instance`) when the report is given one, else the price its
sweep stored (`bench sweep/simulate --cost-per-hour`); the devices are those the sweep stored (`devices_used`). The
cost is recomputed from the stored requests under the report's SLO (`sweep.run.cost`), so a report with another
SLO prices its own goodput. Simulated points are drawn hollow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from reports.importers import RunData
from reports.recompute import normalize_slo, records_from_rows
from sweep.point.saturation import is_saturated
from sweep.run.cost import CostConfig, cost_fields

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COST_COLUMN = "cost_per_million_output_tokens"


def with_cost(
    points: pd.DataFrame,
    requests: pd.DataFrame,
    slo: Mapping[str, float] | None,
    cost: CostConfig | None,
    simulated: bool = False,
) -> pd.DataFrame:
    """Points with the cost fields recomputed under `slo`; unchanged when neither `cost` nor the points price."""
    stored = pd.to_numeric(points["cost_per_hour"], errors="coerce") if "cost_per_hour" in points else None
    if cost is None and (stored is None or stored.isna().all()):
        return points
    points = points.copy()
    slo = normalize_slo(slo)
    groups = {label: rows for label, rows in requests.groupby("label", sort=False)} if len(requests) else {}
    empty = requests.iloc[0:0]
    rows_out = []
    for index, point in points.iterrows():
        price = cost
        if price is None:
            gpus = point.get("gpus_per_instance")
            price = CostConfig(float(stored[index]), int(gpus) if pd.notna(gpus) else 1)  # type: ignore[index]
        devices = point.get("devices_used")  # what the sweep knew the configuration occupied (None: the instance)
        records = records_from_rows(groups.get(point["label"], empty))
        source = "simulated" if simulated else "measured"
        rows_out.append(cost_fields(records, float(point["duration"]), slo, price, source=source,
                                    devices_used=int(devices) if pd.notna(devices) else None))
    for column in rows_out[0]:
        points[column] = [row[column] for row in rows_out]
    return points


def cost_vs_load(runs: list[RunData], slo: Mapping[str, float] | None, goal: float = 0.9) -> Figure | None:
    """USD per million good output tokens against load, log scale; filled markers meet the attainment goal
    (hollow ones miss it), and a dotted line marks each run's largest load that meets it (the SLO boundary)."""
    from reports.plots import colour, load_label, plt, use_log_x

    priced = [r for r in runs if COST_COLUMN in r.points]
    if not priced:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, run in enumerate(priced):
        x = run.load_values().to_numpy(dtype=float)
        y = pd.to_numeric(run.points[COST_COLUMN], errors="coerce").to_numpy(dtype=float)
        attain = pd.to_numeric(run.points.get("slo_attainment"), errors="coerce").to_numpy(dtype=float)
        saturated = np.array([is_saturated(p) for p in run.points.to_dict("records")], dtype=bool)
        meets = (attain >= goal if slo else np.ones_like(x, dtype=bool)) & ~saturated  # saturated: fails the SLO
        keep = np.isfinite(x) & np.isfinite(y)
        order = np.argsort(x[keep])
        simulated = bool(run.config.get("simulated"))
        name = f"{run.name} (simulated)" if simulated else run.name
        ax.plot(x[keep][order], y[keep][order], "--" if simulated else "-", color=colour(i), label=name)
        for filled in (True, False):
            sel = keep & (meets == filled)
            ax.scatter(x[sel], y[sel], s=22, color=colour(i), facecolors=colour(i) if filled else "none")
        if slo and meets.any():
            ax.axvline(float(x[meets & np.isfinite(x)].max()), color=colour(i), ls=":", lw=1)
    ax.set_yscale("log")
    from reports.recompute import format_slo

    ax.set(
        title=f"USD per 1M good output tokens (SLO: {format_slo(slo)})",
        xlabel=load_label(priced),
        ylabel="USD / 1M output tokens",
    )
    ax.title.set_fontsize(9)
    use_log_x(ax, priced)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
