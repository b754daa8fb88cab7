"""Server-side metrics (`bench sweep` scrapes the target's /metrics over each point) beside the client's TTFT."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from reports.importers import RunData  # noqa: E402
from reports.plots import colour, load_label, use_log_x, xy  # noqa: E402

# (point field, panel title, y label); a panel appears when some run has the field
SERVER_PANELS = (
    ("prefix_cache_hit_rate", "prefix-cache hit rate", "hits / queried prompt tokens"),
    ("max_kv_cache_usage_perc", "KV-cache usage (max while the point ran)", "fraction of blocks"),
    ("max_num_requests_waiting", "server queue (max waiting requests)", "requests"),
    ("num_preemptions", "preemptions during the point", "preemptions"),
    ("spec_decode_acceptance_rate", "speculative acceptance rate", "accepted / draft tokens (%)"),
)


def server_metrics_vs_load(runs: list[RunData]) -> Figure | None:
    """The client's median and p99 TTFT, then one panel per server metric any run recorded; None without any."""
    panels = [p for p in SERVER_PANELS if any(p[0] in r.points and r.points[p[0]].notna().any() for r in runs)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 4.0), squeeze=False)
    ttft_ax = axes[0][0]
    for i, run in enumerate(runs):
        ttft_ax.plot(*xy(run, "median_ttft_ms"), "-o", ms=3, color=colour(i), label=f"{run.name} p50")
        ttft_ax.plot(*xy(run, "p99_ttft_ms"), "--", color=colour(i), label=f"{run.name} p99")
    ttft_ax.set(title="client TTFT", xlabel=load_label(runs), ylabel="TTFT (ms)")
    for ax, (column, title, ylabel) in zip(axes[0][1:], panels, strict=True):
        for i, run in enumerate(runs):
            ax.plot(*xy(run, column), "-o", ms=3, color=colour(i), label=run.name)
        ax.set(title=title, xlabel=load_label(runs), ylabel=ylabel)
    for ax in axes[0]:
        use_log_x(ax, runs)
        ax.grid(alpha=0.3)
    ttft_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
