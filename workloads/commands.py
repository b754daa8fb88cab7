"""`bench workloads list` and `bench workloads show NAME [--plot out.png]`; a prompt workload (prompts:FILE or a shipped
prompt set) is measured with `--tokenizer` and compared with a shipped mix (`--compare`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

SHOWN_METADATA = ("name", "description", "source", "licence", "attribution", "tokenizer", "token_counts", "rows")
SHOWN_METADATA += ("derivation", "resolution", "classes")
workloads_app = typer.Typer(
    help="Real length mixes, synthetic workloads, trace files and prompt files (prompts:FILE, servelab-prompts).",
    no_args_is_help=True,
)
DEFAULT_TOKENIZER = "smollm2-135m"
_tokenizer_loader: list[Callable[[str], Any]] = []


def register(app: typer.Typer, get_tokenizer: Callable[[str], Any] | None = None) -> None:
    """Add this package's commands to the `bench` app; `get_tokenizer` (name -> tokenizer) measures prompt files."""
    if get_tokenizer is not None:
        _tokenizer_loader[:] = [get_tokenizer]
    app.add_typer(workloads_app, name="workloads")


@workloads_app.command("list")
def list_command() -> None:
    """The shipped real mixes: request count, p50/p90 input and output tokens; source and licence."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    import workloads

    # Two narrow tables rather than one wide one: each fits an 80-column terminal (and non-tty output) untruncated.
    infos = workloads.list_workloads()
    title = "shipped workloads: token counts as each source published them"
    lengths = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("name", "requests", "in\np50", "in\np90", "out\np50", "out\np90", "arrivals"):
        lengths.add_column(column, justify="left" if column in ("name", "arrivals") else "right", no_wrap=True)
    for info in infos:
        lengths.add_row(
            info.name,
            f"{info.count:,}",
            f"{info.input_p50:,.0f}",
            f"{info.input_p90:,.0f}",
            f"{info.output_p50:,.0f}",
            f"{info.output_p90:,.0f}",
            "trace" + ("+ids" if info.has_prefix_ids else "") if info.has_timestamps else "-",
        )
    provenance = Table(title="provenance (more: bench workloads show NAME)", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("name", "source", "licence"):
        provenance.add_column(column, no_wrap=column == "name")
    for info in infos:
        provenance.add_row(info.name, info.source, info.licence.split(" (")[0].split(";")[0])
    console = Console()
    console.print(lengths)
    console.print(provenance)
    console.print(f"generators: {', '.join(workloads.GENERATORS)}, mixture:<name>=<weight>,...; or a trace file path")
    sets = ", ".join(workloads.prompt_files.shipped_prompt_sets())
    console.print(f"text: {', '.join(workloads.TEXT_WORKLOADS)}, prompt sets {sets}, prompts:FILE (JSONL or ShareGPT)")


def _describe(name: str) -> tuple[list, dict]:
    import workloads
    from workloads.stats import arrival_stats, correlation, percentiles

    specs = workloads.load(name)
    if name in workloads.mixes.shipped_names():
        return specs, workloads.metadata(name)
    inputs, outputs = [s.input_len for s in specs], [s.output_len for s in specs]
    timed = specs[0].timestamp is not None and len(specs) > 1
    return specs, {
        "name": name,
        "rows": len(specs),
        "source_percentiles": {"input_len": percentiles(inputs), "output_len": percentiles(outputs)},
        "correlation": correlation(inputs, outputs),
        "arrivals": arrival_stats([s.timestamp for s in specs]) if timed else None,
    }


def _describe_prompts(
    name: str, tokenizer_name: str, endpoint: str | None, output_len: int | None
) -> tuple[list, dict]:
    from workloads.prompt_files import read_prompt_file
    from workloads.stats import correlation, percentiles
    from workloads.text_mixtures import check_text_mixture, is_text_mixture, prompt_components
    from workloads.text_workloads import text_prompts

    mixture = is_text_mixture(name)
    if mixture:
        check_text_mixture(name)  # every component, before the tokenizer loads
    files = prompt_components(name) if mixture else [read_prompt_file(name)]
    if not _tokenizer_loader:
        raise ValueError("measuring a prompt file needs a tokenizer loader (bench registers one)")
    endpoint = endpoint or ("chat" if any(f.has_chats for f in files) else "completions")
    specs, _ = text_prompts(name, endpoint, output_len, _tokenizer_loader[0](tokenizer_name), None, 0, "")
    inputs, outputs = [s.input_len for s in specs], [s.output_len for s in specs]
    skipped = sum(f.skipped for f in files)
    classes = sorted({s.request_class for s in specs if s.request_class is not None})
    return specs, {
        "name": name,
        "source": ", ".join(str(f.path) for f in files) + (" (mixed with length components)" * mixture),
        "tokenizer": f"{tokenizer_name} (lengths measured from the text, {endpoint} endpoint)",
        "rows": f"{len(specs)}" + (" (drawn by weight)" * mixture)
        + (f" ({skipped} ShareGPT entries without a human turn skipped)" * bool(skipped)),
        "source_percentiles": {"input_len": percentiles(inputs), "output_len": percentiles(outputs)},
        "correlation": correlation(inputs, outputs),
        **({"classes": ", ".join(f"{c} {sum(s.request_class == c for s in specs)}" for c in classes)}
           if classes else {}),  # fmt: skip
    }


def _print_comparison(console: Any, specs: list, mix: str) -> None:
    import workloads
    from workloads.fidelity import compare_lengths

    compared = compare_lengths(specs, workloads.load(mix))
    for key, sides in compared.items():
        for side, label in (("workload", "this workload"), ("reference", mix)):
            stats = sides[side]
            shown = "  ".join(f"{q} {stats[q]:,.0f}" for q in ("p10", "p50", "p90", "p99"))
            console.print(f"[bold]{key}[/] {label:>24}: {shown}")
        console.print(f"[bold]{key}[/] {'KS statistic':>24}: {sides['ks']:.3f} (0 = same distribution, 1 = disjoint)")


@workloads_app.command("show")
def show_command(
    name: str = typer.Argument(..., help="a shipped mix, a generator, a trace file, a prompt set or prompts:FILE"),
    plot: Path | None = typer.Option(None, "--plot", help="write a PNG: length histograms, scatter, arrivals"),
    tokenizer: str = typer.Option(
        DEFAULT_TOKENIZER, "--tokenizer", help="prompt workloads: the tokenizer that measures the text (the target's)"
    ),
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="prompt workloads: completions | chat (default: chat if the file has chats)"
    ),
    output_len: int | None = typer.Option(
        None, "--output-len", min=1, help="prompt workloads: output length of rows without one (default 128)"
    ),
    compare: str = typer.Option(
        "sharegpt", "--compare", help="prompt workloads: the shipped mixes shown beside them, comma-separated, or all"
    ),
) -> None:
    """Metadata, length percentiles, correlation, arrival and prefix statistics of one workload; a prompt workload's
    lengths are measured with --tokenizer and shown beside shipped mixes' (--compare) with their KS statistics."""
    import json

    from rich.console import Console
    from rich.markup import escape

    import workloads

    console = Console()
    prompt_workload = workloads.prompt_files.is_prompt_workload(name) or workloads.text_mixtures.is_text_mixture(name)
    if prompt_workload:
        if endpoint not in (None, "completions", "chat"):
            console.print(f"[red]--endpoint must be completions or chat, got {endpoint!r}")
            raise typer.Exit(2)
        mixes = workloads.shipped_names() if compare == "all" else [m.strip() for m in compare.split(",") if m.strip()]
        unknown = [m for m in mixes if m not in workloads.shipped_names()] or ([] if mixes else [compare])
        if unknown:
            console.print(f"[red]--compare {', '.join(unknown)!r}: not a shipped mix; the shipped mixes are "
                          f"{', '.join(workloads.shipped_names())} (or all)")
            raise typer.Exit(2)
    try:
        if prompt_workload:
            specs, meta = _describe_prompts(name, tokenizer, endpoint, output_len)
        else:
            specs, meta = _describe(name)
    except (ValueError, OSError) as error:
        console.print(f"[red]{escape(str(error))}")
        raise typer.Exit(2 if prompt_workload else 1) from None
    if prompt_workload:
        console.print(f"[bold]count[/]: {len(specs)}")
    for key in SHOWN_METADATA:
        if key in meta:
            console.print(f"[bold]{key}[/]: {escape(str(meta[key]))}")
    for key in ("input_len", "output_len"):
        stats = meta["source_percentiles"][key]
        console.print(f"[bold]{key}[/]: " + "  ".join(f"{q} {v:,.0f}" for q, v in stats.items()))
    console.print(f"[bold]correlation[/]: {meta['correlation']}")
    if prompt_workload:
        for mix in mixes:
            _print_comparison(console, specs, mix)
    for key in ("arrivals", "prefix"):
        if meta.get(key):
            shown = dict(meta[key])
            if "aggregate_rate_rps" in shown:
                rates = shown.pop("aggregate_rate_rps")
                shown["rate_curve"] = f"{len(rates)} windows of {shown['window_s']} s, {min(rates)}-{max(rates)} req/s"
            console.print(f"[bold]{key}[/]: {escape(json.dumps(shown))}")
    if plot is not None:
        write_plot(specs, meta["name"], plot, (meta.get("arrivals") or {}).get("aggregate_rate_rps"))
        console.print(f"wrote {plot}")


def write_plot(specs: list, title: str, path: Path, rate_curve: list[float] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    inputs = np.array([s.input_len for s in specs])
    outputs = np.array([s.output_len for s in specs])
    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    for axis, values, label in ((axes[0, 0], inputs, "input tokens"), (axes[0, 1], outputs, "output tokens")):
        low = max(values.min(), 1)
        bins = np.logspace(np.log10(low), np.log10(max(values.max(), low + 1)), 60)
        axis.hist(np.maximum(values, 1), bins=bins)
        axis.set(xscale="log", xlabel=label, ylabel="requests")
    shown = np.random.default_rng(0).choice(len(specs), size=min(len(specs), 5000), replace=False)
    axes[1, 0].scatter(np.maximum(inputs[shown], 1), np.maximum(outputs[shown], 1), s=2, alpha=0.3)
    axes[1, 0].set(xscale="log", yscale="log", xlabel="input tokens", ylabel="output tokens")
    if specs[0].timestamp is not None:
        times = np.array([s.timestamp for s in specs])
        counts = np.bincount((times // 60).astype(int))
        axes[1, 1].step(np.arange(counts.size), counts, where="post")
        axes[1, 1].set(xlabel="minute", ylabel="requests per minute")
    elif rate_curve:
        axes[1, 1].step(np.arange(len(rate_curve)), rate_curve, where="post")
        axes[1, 1].set(xlabel="window", ylabel="aggregate requests/s")
    else:
        axes[1, 1].text(0.5, 0.5, "no timestamps in this source", ha="center", va="center")
        axes[1, 1].set_axis_off()
    figure.suptitle(f"{title}: {len(specs):,} requests")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
