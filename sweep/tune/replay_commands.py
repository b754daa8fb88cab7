"""`bench lab tune-efficiency` and `bench lab tune-launches`: read recorded tune studies afterwards
(no engine, no timing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def tune_efficiency(
    grid_file: Path = typer.Argument(..., help="Grid fixture JSON (written here first with --from-storage)."),
    from_storage: str | None = typer.Option(None, help="Export a finished `bench tune --grid` study from this "
                                            "storage URL into GRID_FILE first."),
    study_name: str | None = typer.Option(None, help="The grid study's name (default: the storage's only study)."),
    seeds: int = typer.Option(30, help="Replays per sampler."),
    tolerance: float = typer.Option(0.05, help="'Near-best': within this fraction of the grid's best value."),
    budget: int | None = typer.Option(None, help="Most trials per replay (default: 2 x the grid's size)."),
    output_json: Path | None = typer.Option(None, help="Also write the per-seed counts here."),
) -> None:
    """Replay a measured grid: how many trials TPE and random search need to come within 5 % of its best."""
    import optuna
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from sweep.tune.replay import SAMPLERS, efficiency, export_grid, grid_best, load_grid

    console = Console()
    try:
        if from_storage:
            names = optuna.get_all_study_names(from_storage)
            name = study_name or (names[0] if len(names) == 1 else None)
            if name is None:
                raise ValueError(f"{from_storage} holds {len(names)} studies; pick one with --study-name: {names}")
            grid_file.parent.mkdir(parents=True, exist_ok=True)
            grid_file.write_text(json.dumps(export_grid(optuna.load_study(study_name=name, storage=from_storage)),
                                            indent=1, default=str))
            console.print(f"wrote {grid_file}")
        grid = load_grid(grid_file)
        best = grid_best(grid)
    except (ValueError, OSError, KeyError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from err
    size = len(grid["trials"])
    budget = budget or 2 * size
    feasible_count = sum(e["feasible"] for e in grid["trials"])
    console.print(f"grid: {size} configurations ({feasible_count} feasible), best {grid['metric']} = {best:.4g}; "
                  f"target within {tolerance:.0%}; {seeds} seeds; budget {budget} trials")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=seeds * len(SAMPLERS))
        results = efficiency(grid, seeds, tolerance, budget, progress=lambda: progress.advance(task))
    table = Table("sampler", "reached", "median trials", "mean (reached)", "p90 trials")
    for name, r in results.items():
        mean = f"{r['mean_reached']:.1f}" if r["mean_reached"] is not None else "-"
        table.add_row(name, f"{r['reached']}/{seeds}", f"{r['median']:g}", mean, f"{r['p90']:g}")
    console.print(table)
    if output_json:
        output_json.write_text(json.dumps({"grid": str(grid_file), "tolerance": tolerance, "budget": budget,
                                           "results": results}, indent=1))


def tune_launches(
    full: str = typer.Argument(..., help="The full grid's `bench tune --grid` output directory (or storage URL)."),
    others: list[str] = typer.Argument(..., help="Studies to count against it: NAME=DIR (e.g. simfirst=OUT/sf)."),
    tolerance: float = typer.Option(0.05, help="'Near-best': within this fraction of the full grid's best value."),
    output_json: Path | None = typer.Option(None, help="Also write the comparison here."),
) -> None:
    """Engines launched before a configuration within 5 % of the full grid's best was measured, per study
    (e.g. the same grid with and without --simulate-first), with the pruned counts, wall times and the spread of
    the configurations measured in both."""
    from rich.console import Console
    from rich.table import Table

    from sweep.tune.replay import compare_launches, open_single_study

    console = Console()
    try:
        named = {}
        for item in others:
            name, sep, where = item.partition("=")
            if not sep or not name or name == "full":
                raise ValueError(f"expected NAME=DIR (NAME not 'full'), got {item!r}")
            named[name] = open_single_study(where)
        result = compare_launches(open_single_study(full), named, tolerance)
    except (ValueError, KeyError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from err
    console.print(f"full grid best {result['best']:.4g} at {json.dumps(result['best_params'])}; "
                  f"target {result['target']:.4g} (within {tolerance:.0%})")
    table = Table("study", "trials", "launched", "pruned by simulation", "refused before launch", "best measured",
                  "launches to target (measured)", "(by config)", "wall s", "same order")
    def fmt(v: Any, spec: str = "g") -> str:
        return "-" if v is None else format(v, spec)
    for name, s in result["studies"].items():
        table.add_row(name, str(s["trials"]), str(s["launched"]), str(s["pruned_by_simulation"]),
                      str(s["refused_before_launch"]), fmt(s["best"], ".4g"), fmt(s["launches_to_target"]),
                      fmt(s["launches_to_target_config"]), fmt(s["wall_s"], ".0f"), str(result["same_order"][name]))
    console.print(table)
    for name, spread in result["same_configuration_spread"].items():
        if spread["median"] is not None:
            console.print(f"{name} vs full, same configuration: {spread['pairs']} pairs, |difference| median "
                          f"{spread['median']:.1%}, max {spread['max']:.1%}")
        elif spread["pairs"]:
            console.print(f"{name}: no pairs")
    if output_json:
        output_json.write_text(json.dumps(result, indent=1, default=str))
