"""`bench simulate`: `bench sweep`'s load, workload and SLO flags, run on the real scheduler in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from engine.cli_options import knob_option, with_engine_knobs
from sweep.commands import LOAD_PANEL, WORKLOAD_PANEL, _fail, _floats, _render_report, _synthetic_lengths


@with_engine_knobs
def simulate(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    profile: Path = typer.Option(..., help="A `bench profile` JSON: the step-time cost model."),
    concurrency: str | None = typer.Option(
        None, help="Closed-loop streams per point, e.g. 1,2,4,8.", rich_help_panel=LOAD_PANEL
    ),
    request_rate: str | None = typer.Option(
        None, help="Open-loop request rates (req/s) per point, e.g. 1,2,4.", rich_help_panel=LOAD_PANEL
    ),
    burstiness: float = typer.Option(
        1.0, help="Gamma shape of inter-arrival times (1 = Poisson).", rich_help_panel=LOAD_PANEL
    ),
    max_concurrency: int | None = typer.Option(
        None, help="Rate mode: cap on in-flight requests.", rich_help_panel=LOAD_PANEL
    ),
    num_prompts: int | None = typer.Option(
        None, help="Requests per point (default 200 unless --duration).", rich_help_panel=LOAD_PANEL
    ),
    duration: float | None = typer.Option(
        None, help="Simulated seconds of sending per point.", rich_help_panel=LOAD_PANEL
    ),
    max_load_under_slo: bool = typer.Option(
        False, "--max-load-under-slo", help="Search the largest load meeting --attainment.", rich_help_panel=LOAD_PANEL
    ),
    attainment: float = typer.Option(
        0.9, help="SLO attainment goal for --max-load-under-slo.", rich_help_panel=LOAD_PANEL
    ),
    max_load: float = typer.Option(
        4096.0, help="--max-load-under-slo never goes above this load.", rich_help_panel=LOAD_PANEL
    ),
    slo: str | None = typer.Option(None, help="SLO, any subset: ttft=MS,tpot=MS,e2el=MS."),
    percentiles: str = typer.Option("50,90,99", help="Percentiles to report."),
    model: str | None = knob_option("model", help="Model (default: the profile's; another one is an error)."),
    workload: str = typer.Option(
        "random", help="Workload name or trace path (see `bench workloads list`).", rich_help_panel=WORKLOAD_PANEL
    ),
    input_len: int | None = typer.Option(
        None, help="fixed/random: prompt tokens (default 1024).", rich_help_panel=WORKLOAD_PANEL
    ),
    output_len: int | None = typer.Option(
        None, help="fixed/random: output tokens (default 128).", rich_help_panel=WORKLOAD_PANEL
    ),
    random_range_ratio: float = typer.Option(
        0.0, help="random: lengths uniform in L*(1 +- r).", rich_help_panel=WORKLOAD_PANEL
    ),
    seed: int | None = knob_option("seed", help="Workload seed (default 0)."),
    fit_policy: str = typer.Option(
        "clip",
        help="How requests longer than --max-model-len are fitted: clip | drop | rescale.",
        rich_help_panel=WORKLOAD_PANEL,
    ),
    max_model_len: int | None = knob_option(
        "max_model_len", help="Fit the workload to this context (and the simulated engine's max_model_len)."
    ),
    output_dir: Path = typer.Option(Path("results/simulate"), help="Run directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --output-dir, keeping finished points."),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Render the report into <output-dir>/report at the end."
    ),
    cost_per_hour: float | None = typer.Option(
        None, help="USD per instance-hour: every point gets a simulated cost_per_million_output_tokens."
    ),
    gpus_per_instance: int = typer.Option(1, help="GPUs of one instance (with --cost-per-hour)."),
) -> None:
    """Predict a sweep without running the model: the engine's scheduler and KV manager driven by a profiled
    step-time cost model, written as a `bench sweep` run directory marked simulated."""
    from sweep.point.benchmark_metrics import parse_slo
    from sweep.point.runner import WorkloadConfig
    from sweep.run.cost import CostConfig
    from sweep.simulate_run import SimulateConfig, load_profile, run_simulation

    if (concurrency is None) == (request_rate is None):
        _fail("give exactly one of --concurrency 1,2,4 or --request-rate 1,2,4")
    mode = "concurrency" if concurrency is not None else "rate"
    own = {"model": model, "seed": seed, "max_model_len": max_model_len}
    knobs = {**engine_knobs, **{k: v for k, v in own.items() if v is not None}}
    try:
        config = SimulateConfig(
            output_dir=output_dir,
            profile=load_profile(profile),
            mode=mode,
            values=_floats(
                concurrency if mode == "concurrency" else request_rate, f"--{mode.replace('rate', 'request-rate')}"
            ),
            engine_knobs=knobs,
            workload=WorkloadConfig(
                workload=workload,
                **_synthetic_lengths(workload, input_len, output_len),
                range_ratio=random_range_ratio,
                max_model_len=max_model_len,
                fit_policy=fit_policy,
                seed=seed if seed is not None else 0,
            ),
            num_prompts=num_prompts,
            duration=duration,
            burstiness=burstiness,
            max_concurrency=max_concurrency,
            slo=parse_slo(slo),
            percentiles=_floats(percentiles, "--percentiles"),
            max_load_under_slo=max_load_under_slo,
            attainment=attainment,
            max_load=max_load,
            resume=resume,
            cost=None if cost_per_hour is None else CostConfig(cost_per_hour, gpus_per_instance),
        )
        run_dir = run_simulation(config)
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as e:
        _fail(str(e))
    typer.echo(f"results: {run_dir}")
    if report and ctx.obj is not None:
        _render_report(ctx.obj, run_dir, config.slo)


def profile_serving(
    profile: Path = typer.Option(..., help="A `bench profile` JSON (its serving terms are refitted)."),
    measured: list[Path] = typer.Option(..., help="A measured `bench sweep` run directory to calibrate on; repeat."),
    output: Path = typer.Option(..., help="Where to write the calibrated profile."),
) -> None:
    """Fit the profile's serving terms (engine-core and API cost per step and per sequence, and the API process's
    hand-over per request and per prompt token) to measured runs, so `bench simulate` predicts a served engine
    rather than the bare model runner (sweep/serving_fit.py)."""
    import json

    from sweep.serving_fit import calibrate
    from sweep.simulate_run import load_profile

    try:
        data = calibrate(load_profile(profile), measured)
    except (ValueError, FileNotFoundError, KeyError) as e:
        _fail(str(e))
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


def register(app: typer.Typer, groups: dict[str, typer.Typer], render_report: Any = None) -> None:
    app.command("simulate", context_settings={"obj": render_report})(simulate)
    app.command("profile-serving")(profile_serving)
