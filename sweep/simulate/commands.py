"""`bench simulate` (`bench sweep`'s load, workload and SLO flags, run on the real scheduler in virtual time),
`bench model profile` (the step-cost profile it runs on) and `bench lab profile-serving` (the profile's serving
terms fitted to measured runs), with the hidden old names `bench profile` and `bench profile-serving`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from engine.cli_options import knob_option, renamed_command, with_engine_knobs
from sweep.cli_options import LoadOptions, fail, render_run_report, shared_option, with_load_options


@with_engine_knobs
@with_load_options(
    exclude=("endpoint",),
    help={
        "duration": "Simulated seconds of sending per point.",
        "slo": "SLO, any subset: ttft=MS,tpot=MS,e2el=MS,itl_p99=MS,max_stall=MS.",
    },
)
def simulate(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    load: LoadOptions,
    profile: Path = typer.Option(..., help="A `bench model profile` JSON: the step-time cost model."),
    model: str | None = knob_option("model", help="Model (default: the profile's; another one is an error)."),
    seed: int | None = knob_option("seed", help="Workload seed (default 0)."),
    max_model_len: int | None = knob_option(
        "max_model_len", help="Fit the workload to this context (and the simulated engine's max_model_len)."
    ),
    output_dir: Path = typer.Option(Path("results/simulate"), help="Run directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --output-dir, keeping finished points."),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Render the report into <output-dir>/report at the end."
    ),
    cost_per_hour: float | None = shared_option(
        "cost_per_hour", help="USD per instance-hour: every point gets a simulated cost_per_million_output_tokens."
    ),
    gpus_per_instance: int = shared_option("gpus_per_instance"),
) -> None:
    """Predict a sweep without running the model: the engine's scheduler and KV manager driven by a profiled
    step-time cost model, written as a `bench sweep` run directory marked simulated."""
    from sweep.run.cost import CostConfig
    from sweep.simulate.simulation import SimulateConfig, load_profile, run_simulation

    own = {"model": model, "seed": seed, "max_model_len": max_model_len}
    knobs = {**engine_knobs, **{k: v for k, v in own.items() if v is not None}}
    try:
        config = load.config(
            SimulateConfig,
            workload={"max_model_len": max_model_len, "seed": seed if seed is not None else 0},
            output_dir=output_dir,
            profile=load_profile(profile),
            engine_knobs=knobs,
            resume=resume,
            cost=None if cost_per_hour is None else CostConfig(cost_per_hour, gpus_per_instance),
        )
        run_dir = run_simulation(config)
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as e:
        fail(str(e))
    typer.echo(f"results: {run_dir}")
    if report and ctx.obj is not None:
        render_run_report(ctx.obj, run_dir, config.slo)


def profile_serving(
    profile: Path = typer.Option(..., help="A `bench model profile` JSON (its serving terms are refitted)."),
    measured: list[Path] = typer.Option(..., help="A measured `bench sweep` run directory to calibrate on; repeat."),
    output: Path = typer.Option(..., help="Where to write the calibrated profile."),
) -> None:
    """Fit the profile's serving terms (engine-core and API cost per step and per sequence, and the API process's
    hand-over per request and per prompt token) to measured runs, so `bench simulate` predicts a served engine
    rather than the bare model runner (sweep/simulate/serving_fit.py)."""
    from sweep.simulate.serving_fit import calibrate
    from sweep.simulate.simulation import load_profile

    try:
        data = calibrate(load_profile(profile), measured)
    except (ValueError, FileNotFoundError, KeyError) as e:
        fail(str(e))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n")
    record = data["serving_calibration"]
    terms = record["terms"]
    typer.echo(
        f"serving terms: {terms['step_overhead'] * 1e3:.2f} ms per step + {terms['per_seq'] * 1e3:.3f} ms per "
        f"sequence; calibration TPOT mean error {100 * record['tpot_mean_rel_error_before']:.1f} % -> "
        f"{100 * record['tpot_mean_rel_error_after']:.1f} %"
    )
    hand_over = record.get("hand_over")
    if hand_over:
        before, after = record["ttft_mean_rel_error_before"], record["ttft_mean_rel_error_after"]
        typer.echo(
            f"hand-over: {hand_over['hand_over_per_request'] * 1e3:.2f} ms per request + "
            f"{hand_over['hand_over_per_prompt_token'] * 1e6:.2f} us per prompt token (from "
            f"{record['hand_over_requests']} requests' server timestamps); calibration TTFT mean error "
            + (f"{100 * before:.1f} % -> {100 * after:.1f} %" if before is not None and after is not None else "n/a")
        )
    else:
        typer.echo("hand-over: not fitted (the runs lack the server's received_time); requests join when sent")
    typer.echo(f"profile: {output}")


def positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise typer.BadParameter(f"{flag} needs positive integers, got {text!r}")
    return sorted(set(values))


@with_engine_knobs
def profile(
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    prefill_tokens: str = typer.Option("16,64,256,1024", help="Prefill chunk sizes (tokens) of the grid."),
    decode_seqs: str = typer.Option("1,4,16,64", help="Decode batch sizes of the grid."),
    context_lens: str = typer.Option("128,512,1024", help="Context lengths (tokens) the decodes attend over."),
    repeats: int = typer.Option(3, help="Timed runs per grid step (the median is kept), after one warm-up."),
    output: Path = typer.Option(Path("profile.json"), help="Where to write the profile."),
) -> None:
    """Time the model runner over a grid of step shapes and fit the step-time cost model `bench simulate` uses."""
    from engine.config import ConfigError
    from engine.model_files import ModelNotFoundError
    from sweep.simulate.profile import default_grid, profile_model

    if repeats < 1:
        raise typer.BadParameter(f"--repeats must be >= 1, got {repeats}")
    grid = default_grid(
        positive_ints(prefill_tokens, "--prefill-tokens"), positive_ints(decode_seqs, "--decode-seqs"),
        positive_ints(context_lens, "--context-lens"),
    )  # fmt: skip
    try:  # bad input (a missing model, an impossible knob) ends the command with its message, not a traceback
        data = profile_model({**engine_knobs, "model": model}, grid, repeats, echo=typer.echo)
    except (ModelNotFoundError, ConfigError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n")
    error = data["cost_model"]["fit_error"]
    typer.echo(
        f"fit error: mean {100 * error['mean_rel_error']:.1f} %, max {100 * error['max_rel_error']:.1f} % in sample"
        + (f"; leave-one-out mean {100 * error['loo_mean_rel_error']:.1f} %, max "
           f"{100 * error['loo_max_rel_error']:.1f} %" if "loo_mean_rel_error" in error else "")
    )  # fmt: skip
    typer.echo(f"profile: {output}")


def register(app: typer.Typer, groups: dict[str, typer.Typer], render_report: Any = None) -> None:
    """Add `bench simulate`, `bench model profile` and `bench lab profile-serving` (and their hidden old names);
    `bench simulate --report` renders with `render_report` (its context's `obj`)."""
    app.command("simulate", context_settings={"obj": render_report})(simulate)
    groups["model"].command("profile")(profile)
    groups["lab"].command("profile-serving")(profile_serving)
    app.command("profile", hidden=True)(renamed_command(profile, "bench model profile"))
    app.command("profile-serving", hidden=True)(renamed_command(profile_serving, "bench lab profile-serving"))
