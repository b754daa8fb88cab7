"""The report's figures (matplotlib, Agg backend). Several runs overlay, one colour per run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from reports.importers import RunData  # noqa: E402
from reports.recompute import percentile_key, request_latencies, ttft_decomposition  # noqa: E402

LINESTYLES = ("-", "--", ":", "-.")
DEFAULT_ATTAINMENT_GOAL = 0.9


def colour(i: int) -> str:
    return plt.get_cmap("tab10")(i % 10)


def load_label(runs: list[RunData]) -> str:
    modes = {r.mode for r in runs}
    if modes == {"concurrency"}:
        return "concurrency (max in-flight requests)"
    if modes == {"rate"}:
        return "offered request rate (req/s)"
    return "load (concurrency or req/s)"


def xy(run: RunData, column: str) -> tuple[np.ndarray, np.ndarray]:
    x = run.load_values().to_numpy(dtype=float)
    y = pd.to_numeric(run.points.get(column), errors="coerce").to_numpy(dtype=float) if column in run.points else None
    if y is None:
        return np.zeros(0), np.zeros(0)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def use_log_x(ax, runs: list[RunData]) -> None:
    """Log2 load axis for wide sweeps, only on an axis that plots data: an empty log axis (attainment without an
    SLO, say) makes matplotlib fail with "Data cannot be log-scaled because all values are <= 0"."""
    if not (np.isfinite(ax.dataLim.x0) and ax.dataLim.x0 > 0):
        return
    loads = np.concatenate([r.load_values().to_numpy(dtype=float) for r in runs])
    loads = loads[np.isfinite(loads) & (loads > 0)]
    if loads.size and loads.max() / loads.min() >= 8:
        ax.set_xscale("log", base=2)


def latency_vs_load(runs: list[RunData], slo: Mapping[str, float] | None) -> Figure:
    """TTFT, TPOT and E2EL p50/p90/p99 against load; SLO thresholds drawn as horizontal lines."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, metric in zip(axes, ("ttft", "tpot", "e2el"), strict=True):
        for i, run in enumerate(runs):
            for j, p in enumerate(run.percentiles):
                x, y = xy(run, f"{percentile_key(p)}_{metric}_ms")
                ax.plot(x, y, LINESTYLES[j % 4], marker="o", ms=3, color=colour(i), label=f"{run.name} p{p:g}")
        if slo and f"{metric}_ms" in slo:
            ax.axhline(slo[f"{metric}_ms"], color="red", lw=1, ls="--", label=f"SLO {slo[f'{metric}_ms']:g} ms")
        use_log_x(ax, runs)
        ax.set(title=f"{metric.upper()} percentiles", xlabel=load_label(runs), ylabel=f"{metric.upper()} (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def throughput_vs_latency(runs: list[RunData]) -> Figure:
    """Output tokens/s against median and p99 latency: where extra throughput starts to cost latency."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
        for i, run in enumerate(runs):
            tput = pd.to_numeric(run.points["output_throughput"], errors="coerce").to_numpy(dtype=float)
            for j, p in enumerate((50, 99)):
                column = f"{percentile_key(p)}_{metric}_ms"
                if column not in run.points:
                    column = f"median_{metric}_ms" if p == 50 else None
                if column is None:
                    continue
                lat = pd.to_numeric(run.points[column], errors="coerce").to_numpy(dtype=float)
                ax.plot(tput, lat, LINESTYLES[j], marker="o", ms=3, color=colour(i), label=f"{run.name} p{p}")
        ax.set(title=f"throughput vs {metric.upper()}", xlabel="output throughput (tok/s)",
               ylabel=f"{metric.upper()} (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def goodput_vs_load(
    runs: list[RunData], slo: Mapping[str, float] | None, goal: float = DEFAULT_ATTAINMENT_GOAL
) -> Figure:
    """Request goodput and SLO attainment against load (recomputed from the requests under `slo`)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, run in enumerate(runs):
        axes[0].plot(*xy(run, "request_throughput"), ":", color=colour(i), label=f"{run.name} throughput")
        axes[0].plot(*xy(run, "request_goodput"), "-o", ms=3, color=colour(i), label=f"{run.name} goodput")
        axes[1].plot(*xy(run, "slo_attainment"), "-o", ms=3, color=colour(i), label=run.name)
    axes[1].axhline(goal, color="red", lw=1, ls="--", label=f"attainment goal {goal:.0%}")
    axes[1].set_ylim(-0.02, 1.02)
    from reports.recompute import format_slo

    axes[0].set(title=f"goodput (SLO: {format_slo(slo)})", xlabel=load_label(runs), ylabel="requests/s")
    axes[1].set(title="SLO attainment (failures count as misses)", xlabel=load_label(runs), ylabel="good / all")
    for ax in axes:
        use_log_x(ax, runs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _gpus(run: RunData) -> int | None:
    knobs = (run.config.get("target") or {}).get("engine_knobs") or {}
    sizes = [knobs.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")]
    sizes = [int(s) for s in sizes if s]
    return int(np.prod(sizes)) if sizes else None


def pareto_points(run: RunData) -> pd.DataFrame:
    """tokens/s/user (output throughput / concurrency, vLLM's plot_pareto; for rate sweeps the mean
    in-flight count by Little's law) against tokens/s (per GPU when the engine's parallelism is known)."""
    pts = run.points
    tput = pd.to_numeric(pts["output_throughput"], errors="coerce").to_numpy(dtype=float)
    if run.mode == "concurrency":
        users = pd.to_numeric(pts["max_concurrency"], errors="coerce").to_numpy(dtype=float)
    else:
        users = (pd.to_numeric(pts["request_throughput"], errors="coerce") * pts["mean_e2el_ms"] / 1000.0).to_numpy()
    gpus = _gpus(run) or 1
    frame = pd.DataFrame({"label": pts["label"], "tokens_per_s": tput / gpus, "tokens_per_s_per_user": tput / users})
    frame = frame[np.isfinite(frame["tokens_per_s"]) & np.isfinite(frame["tokens_per_s_per_user"])]
    values = frame[["tokens_per_s", "tokens_per_s_per_user"]].to_numpy()
    frame["on_frontier"] = [not np.any(np.all(values >= v, axis=1) & np.any(values > v, axis=1)) for v in values]
    return frame


def pareto(runs: list[RunData]) -> Figure:
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    per_gpu = all(_gpus(r) for r in runs)
    for i, run in enumerate(runs):
        frame = pareto_points(run)
        ax.scatter(frame["tokens_per_s"], frame["tokens_per_s_per_user"], color=colour(i), s=14, alpha=0.6)
        front = frame[frame["on_frontier"]].sort_values("tokens_per_s")
        ax.plot(front["tokens_per_s"], front["tokens_per_s_per_user"], "-o", ms=4, color=colour(i), label=run.name)
        for _, row in front.iterrows():
            ax.annotate(row["label"], (row["tokens_per_s"], row["tokens_per_s_per_user"]), fontsize=6)
    ax.set(title="Pareto: per-user speed vs total throughput",
           xlabel="output tokens/s" + (" per GPU" if per_gpu else ""), ylabel="output tokens/s per user")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def cdfs(runs: list[RunData]) -> Figure:
    """Empirical CDFs of TTFT and TPOT per point; runs differ in line style, loads in shade."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, run in enumerate(runs):
        labels = list(run.points["label"])
        cmap = plt.get_cmap(("Blues", "Oranges", "Greens", "Purples", "Reds")[i % 5])
        for k, label in enumerate(labels):
            lat = request_latencies(run.point_requests(label))
            shade = cmap(0.35 + 0.6 * k / max(len(labels) - 1, 1))
            for ax, column in zip(axes, ("ttft_ms", "tpot_ms"), strict=True):
                values = np.sort(lat[column].dropna().to_numpy())
                if values.size:
                    ax.step(values, np.arange(1, values.size + 1) / values.size, where="post",
                            ls=LINESTYLES[i % 4], color=shade, label=f"{run.name} {label}")
    for ax, name in zip(axes, ("TTFT", "TPOT"), strict=True):
        ax.set(title=f"{name} CDF per point", xlabel=f"{name} (ms)", ylabel="fraction of requests")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def timeline(run: RunData, label: str) -> Figure:
    """One bar per request: client queue (intended -> sent), waiting for the first token, streaming."""
    rows = run.point_requests(label).sort_values("send_time")
    send = pd.to_numeric(rows["send_time"], errors="coerce").to_numpy(dtype=float)
    intended = pd.to_numeric(rows["intended_send_time"], errors="coerce").to_numpy(dtype=float)
    intended = np.where(np.isfinite(intended), intended, send)
    first = pd.to_numeric(rows["first_token_time"], errors="coerce").to_numpy(dtype=float)
    last = pd.to_numeric(rows["last_token_time"], errors="coerce").to_numpy(dtype=float)
    end = pd.to_numeric(rows["end_time"], errors="coerce").to_numpy(dtype=float)
    ok = rows["success"].astype(bool).to_numpy()
    origin = float(np.nanmin(intended))
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(0.12 * len(rows) + 1.5, 14))))
    height = 0.8 if len(rows) < 200 else 1.0
    ax.barh(y, send - intended, left=intended - origin, color="lightgrey", height=height)
    ax.barh(y[ok], (first - send)[ok], left=(send - origin)[ok], color="tab:orange", height=height)
    ax.barh(y[ok], (last - first)[ok], left=(first - origin)[ok], color="tab:blue", height=height)
    ax.barh(y[~ok], (end - send)[~ok], left=(send - origin)[~ok], color="tab:red", height=height)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("lightgrey", "tab:orange", "tab:blue", "tab:red")]
    names = ["client queue", "waiting for first token", "streaming", "failed"]
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(title=f"request timeline: {run.name} {label}", xlabel="seconds since the point started", ylabel="request")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def ttft_breakdown(runs: list[RunData]) -> Figure | None:
    """Mean TTFT split into server queue, prefill and the rest (network + client), per point."""
    bars = []
    for run in runs:
        for label in run.points["label"]:
            parts = ttft_decomposition(run.point_requests(label))
            if parts is not None:
                bars.append((f"{run.name}\n{label}" if len(runs) > 1 else label, parts.mean()))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(bars) + 2), 4.2))
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for column, colour, name in (("queue_ms", "tab:grey", "server queue"), ("prefill_ms", "tab:orange", "prefill"),
                                 ("ttft_rest_ms", "tab:blue", "rest (network + client)")):
        values = np.array([b[1][column] for b in bars])
        ax.bar(x, values, bottom=bottom, color=colour, label=name)
        bottom += np.clip(values, 0, None)
    ax.set_xticks(x, [b[0] for b in bars], fontsize=7, rotation=0 if len(runs) == 1 else 45)
    ax.set(title="mean TTFT decomposition (server timing)", ylabel="ms")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def fidelity(runs: list[RunData]) -> Figure | None:
    """Requested vs realised input and output lengths for every request."""
    have = [r for r in runs if r.requests.get("requested_input_len") is not None
            and r.requests["requested_input_len"].notna().any()]
    if not have:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, run in enumerate(have):
        rows = run.requests[run.requests["success"].astype(bool)]
        for ax, (req, real) in zip(axes, (("requested_input_len", "prompt_tokens"),
                                          ("requested_output_len", "output_tokens")), strict=True):
            ax.scatter(rows[req], rows[real], s=6, alpha=0.5, color=colour(i), label=run.name)
    for ax, name in zip(axes, ("input", "output"), strict=True):
        lims = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(lims, lims, "k--", lw=0.8, label="requested = realised")
        ax.set(title=f"{name} tokens: requested vs realised", xlabel="requested", ylabel="realised (usage)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
