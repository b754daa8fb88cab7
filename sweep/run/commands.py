"""`bench sweep`: load against an OpenAI endpoint (or the built-in engine), written as a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from engine.cli_options import knob_option, with_engine_knobs
from sweep.cli_options import (
    LOAD_PANEL,
    LoadOptions,
    fail,
    floats,
    interrupt_on_sigterm,
    render_run_report,
    shared_option,
    with_load_options,
    with_shape_options,
)
from sweep.mock.machine_speed import host_warnings
from sweep.run.load_shape import LoadShape
from sweep.run.results import CONFIG
from sweep.run.run_info import openai_base_url
from sweep.run.search import DEFAULT_CONFIDENCE


@with_engine_knobs
@with_load_options(exclude=("max_load",))
@with_shape_options()
def sweep(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    load: LoadOptions,
    shape: LoadShape,
    num_warmups: int = shared_option("num_warmups"),
    warmup_seconds: float = shared_option("warmup_seconds"),
    cooldown_seconds: float = shared_option("cooldown_seconds"),
    steady_window: str | None = typer.Option(
        None, help="auto: detect each point's steady window (the longest span whose in-flight count stays within "
        "25 % of its median; docs/SWEEP.md) and report its figures, as --warmup/--cooldown-seconds do.",
        rich_help_panel=LOAD_PANEL,
    ),
    cancel_rate: float = typer.Option(
        0.0, help="Share of each point's requests (0..1, a seeded choice) the client aborts mid-stream by closing "
        "the connection; they are recorded as cancelled, not failed.", rich_help_panel=LOAD_PANEL,
    ),
    cancel_after: str | None = typer.Option(
        None, help="--cancel-rate: when to abort, a time after the send (2s, 500ms) or an output-token count "
        "(16tok).", rich_help_panel=LOAD_PANEL,
    ),
    reset_prefix_cache: bool = typer.Option(
        False, "--reset-prefix-cache", help="POST /reset_prefix_cache before each point.", rich_help_panel=LOAD_PANEL
    ),
    stop_when_saturated: bool = typer.Option(
        False, "--stop-when-saturated",
        help="--request-rate points: end a point once it over-saturates (completions fall behind the offered rate "
        "while the in-flight count keeps rising; docs/SWEEP.md) and skip the higher rates. Without it such a "
        "point is still marked saturated.", rich_help_panel=LOAD_PANEL,
    ),
    search_repeats: int = typer.Option(
        0, help="--max-load-under-slo: measure a load whose verdict is uncertain up to R more times, pooling its "
        "good and judged requests, until it passes or fails with --confidence.", rich_help_panel=LOAD_PANEL,
    ),
    confidence: float = typer.Option(
        DEFAULT_CONFIDENCE,
        help="--max-load-under-slo: confidence level of each load's attainment interval (Wilson score); "
        "a load passes when the interval's lower bound >= --attainment, fails when its upper bound is below.",
        rich_help_panel=LOAD_PANEL,
    ),
    url: str | None = typer.Option(
        None, help="OpenAI base URL, e.g. http://HOST:PORT/v1 (a bare http://HOST:PORT means its /v1); omit to "
        "launch the built-in engine."
    ),
    model: str = knob_option(
        "model", "smollm2-135m", help="Model name (sent in requests; the built-in engine loads it)."
    ),
    tokenizer: str | None = knob_option(
        "tokenizer", help="Tokenizer for prompt synthesis (alias, HF dir, hub id), and the built-in engine's; "
        "default: --model."
    ),
    api_key: str | None = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token for the target."),
    request_timeout: float = typer.Option(
        21600.0, help="Seconds a request may take in all; a longer one fails with reason Timeout (0: no limit)."
    ),
    stall_timeout: float = typer.Option(
        600.0, help="Seconds a request may wait for its next byte; a stream silent longer fails with reason "
        "Stalled (0: no limit)."
    ),
    seed: int | None = knob_option(
        "seed", help="Workload seed (default 0); when given, the built-in engine's seed too."
    ),
    max_model_len: int | None = knob_option(
        "max_model_len", help="Fit the workload to this context (and the built-in engine's max_model_len)."
    ),
    output_dir: Path = typer.Option(Path("results/sweep"), help="Run directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --output-dir, keeping finished points."),
    client_procs: int = typer.Option(1, help="Client processes sharing one absolute schedule."),
    calibration: bool = typer.Option(
        True, "--calibration/--no-calibration",
        help="Record a short machine-speed calibration in config.json (`bench gate` compares it).",
    ),
    repeats: int = typer.Option(
        1, help="Measure every point this many times, interleaved (repeat k runs all points before k+1); "
        "`bench gate` resamples repeats to see between-run noise. With --max-load-under-slo: each probe's "
        "first R measurements, back to back, pooled."
    ),
    server_metrics: bool = typer.Option(
        True, "--server-metrics/--no-server-metrics", help="Scrape the target's /metrics over each point."
    ),
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--no-ignore-eos", help="Run outputs to the workload's lengths."
    ),
    temperature: float | None = typer.Option(None, help="Sampling temperature (default: the server's)."),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Render the report into <output-dir>/report at the end."
    ),
    cost_per_hour: float | None = shared_option("cost_per_hour"),
    gpus_per_instance: int = shared_option("gpus_per_instance"),
) -> None:
    """Sweep load against an OpenAI endpoint (or the built-in engine) and write a run directory."""
    from sweep.point.cancel import CancelConfig, parse_cancel_after
    from sweep.point.saturation import SaturationConfig
    from sweep.run.sweeper import SweepConfig, run_sweep

    interrupt_on_sigterm()

    concurrency, request_rate, replay = load.concurrency, load.request_rate, shape.replay
    try:
        ramp = shape.ramp(concurrency, request_rate)
    except ValueError as e:
        fail(str(e))
    if ramp is not None:
        request_rate = str(ramp[2])
    if (concurrency is not None) + (request_rate is not None) + replay != 1:
        fail("give exactly one of --concurrency 1,2,4, --request-rate 1,2,4, --replay or --ramp-up-strategy")
    mode = "concurrency" if concurrency is not None else "rate" if request_rate is not None else "replay"
    loads = {"concurrency": (concurrency, "--concurrency"), "rate": (request_rate, "--request-rate"),
             "replay": (shape.time_scale, "--time-scale")}[mode]
    if shape.rate_curve is not None and mode != "rate":
        fail("--rate-curve shapes --request-rate points; give --request-rate (not --concurrency or --replay)")
    if url is not None and engine_knobs:
        fail("engine knobs apply only to the built-in engine; drop them or drop --url")
    shared = {"tokenizer": tokenizer, "seed": seed, "max_model_len": max_model_len}  # the command's and the engine's
    knobs = {**engine_knobs, **{k: v for k, v in shared.items() if v is not None}}
    try:
        cancel = CancelConfig(cancel_rate, parse_cancel_after(cancel_after) if cancel_after is not None else None)
    except ValueError as e:
        fail(str(e))
    try:
        config = load.config(
            SweepConfig,
            mode=mode,
            values=floats(*loads),
            workload={"max_model_len": max_model_len, "seed": seed if seed is not None else 0,
                      **shape.workload_fields()},
            output_dir=output_dir,
            url=openai_base_url(url) if url is not None else None,
            model=model,
            tokenizer=tokenizer,
            api_key=api_key,
            engine_knobs=knobs if url is None else {},
            num_warmups=num_warmups,
            reset_prefix_cache=reset_prefix_cache,
            search_repeats=search_repeats,
            confidence=confidence,
            resume=resume,
            client_procs=client_procs,
            repeats=repeats,
            calibration=calibration,
            server_metrics=server_metrics,
            **shape.sweep_fields(),
            warmup_seconds=warmup_seconds,
            cooldown_seconds=cooldown_seconds,
            steady_window=steady_window,
            cancel=cancel,
            ignore_eos=ignore_eos,
            temperature=temperature,
            cost_per_hour=cost_per_hour,
            gpus_per_instance=gpus_per_instance,
            request_timeout_s=request_timeout,
            stall_timeout_s=stall_timeout,
            saturation=SaturationConfig(stop=stop_when_saturated),
        )
        run_dir = run_sweep(config)
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        typer.secho(
            f"interrupted: finished points are kept in {output_dir}; continue with the same flags and --resume",
            fg=typer.colors.YELLOW,
            err=True,
        )
        raise typer.Exit(130) from None
    typer.echo(f"results: {run_dir}")
    for warning in host_warnings(json.loads((run_dir / CONFIG).read_text()).get("calibration")):
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if report and ctx.obj is not None:
        render_run_report(ctx.obj, run_dir, config.slo)
