"""`bench sweep`, `bench mock-server`, `bench calibrate`. Heavy modules are imported inside each command."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import typer

from engine.cli_options import knob_option, with_engine_knobs
from sweep.run.results import ReportRenderer
from sweep.soak.commands import soak as soak_command

LOAD_PANEL = "Load"
WORKLOAD_PANEL = "Workload"


def _floats(text: str | None, flag: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} takes comma-separated numbers, got {text!r}") from None


def _rate_curve(text: str | None) -> list[float] | None:
    from sweep.rate_curve import parse_rate_curve

    return None if text is None else parse_rate_curve(text)


def _synthetic_lengths(workload: str, input_len: int | None, output_len: int | None) -> dict[str, int | None]:
    """WorkloadConfig's input_len/output_len: the flags, else 1024 -> 128 for the fixed and random workloads
    (shipped mixes bring their own lengths)."""
    synthetic = workload in ("fixed", "random")
    return {
        "input_len": input_len if input_len is not None else (1024 if synthetic else None),
        "output_len": output_len if output_len is not None else (128 if synthetic else None),
    }


def _interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so a launched server is stopped and finished points stay written."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@with_engine_knobs
def sweep(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    concurrency: str | None = typer.Option(
        None, help="Closed-loop streams per point, e.g. 1,2,4,8.", rich_help_panel=LOAD_PANEL
    ),
    request_rate: str | None = typer.Option(
        None, help="Open-loop request rates (req/s) per point, e.g. 1,2,4.", rich_help_panel=LOAD_PANEL
    ),
    replay: bool = typer.Option(
        False, "--replay", help="Send each request at its trace timestamp (a workload with timestamps).",
        rich_help_panel=LOAD_PANEL,
    ),
    time_scale: str = typer.Option(
        "1", help="--replay: trace time multipliers per point (2 = half speed, 0.5 = double), e.g. 1,0.5.",
        rich_help_panel=LOAD_PANEL,
    ),
    ramp_up_strategy: str | None = typer.Option(
        None, help="One open-loop point whose rate ramps (vLLM): linear | exponential.", rich_help_panel=LOAD_PANEL
    ),
    ramp_up_start_rps: float | None = typer.Option(None, help="Ramp-up: the first request's rate.",
                                                   rich_help_panel=LOAD_PANEL),
    ramp_up_end_rps: float | None = typer.Option(None, help="Ramp-up: the last request's rate.",
                                                 rich_help_panel=LOAD_PANEL),
    rate_curve: str | None = typer.Option(
        None,
        help="With --request-rate: arrivals follow this rate curve, rescaled to each point's mean rate and "
        "stretched over the point: relative window rates (1,4,2) or a shipped mix's curve (servegen-deepseek-r1).",
        rich_help_panel=LOAD_PANEL,
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
    duration: float | None = typer.Option(None, help="Seconds of sending per point.", rich_help_panel=LOAD_PANEL),
    num_warmups: int = typer.Option(
        0, help="Warm-up requests per point (distinct prompts, not measured).", rich_help_panel=LOAD_PANEL
    ),
    turns: int = typer.Option(
        1, help="Multi-turn sessions (--endpoint chat): turns per conversation, each carrying the history; "
        "the load counts sessions.", rich_help_panel=LOAD_PANEL,
    ),
    think_time: float = typer.Option(
        0.0, help="Seconds between a turn's response and the session's next turn.", rich_help_panel=LOAD_PANEL
    ),
    warmup_seconds: float = typer.Option(
        0.0, help="Steady-state window: leave the point's first S seconds out of its `steady` figures.",
        rich_help_panel=LOAD_PANEL,
    ),
    cooldown_seconds: float = typer.Option(
        0.0, help="Steady-state window: leave the point's last S seconds (the drain) out of `steady`.",
        rich_help_panel=LOAD_PANEL,
    ),
    reset_prefix_cache: bool = typer.Option(
        False, "--reset-prefix-cache", help="POST /reset_prefix_cache before each point.", rich_help_panel=LOAD_PANEL
    ),
    max_load_under_slo: bool = typer.Option(
        False, "--max-load-under-slo", help="Search the largest load meeting --attainment.", rich_help_panel=LOAD_PANEL
    ),
    attainment: float = typer.Option(
        0.9, help="SLO attainment goal for --max-load-under-slo.", rich_help_panel=LOAD_PANEL
    ),
    search_repeats: int = typer.Option(
        0, help="--max-load-under-slo: measure each end of the final bracket R more times and report the max "
        "load with an interval.", rich_help_panel=LOAD_PANEL,
    ),
    slo: str | None = typer.Option(
        None, help="SLO, any subset: ttft=MS,tpot=MS,e2el=MS,valid=1 (valid=1: an invalid structured output misses)."
    ),
    percentiles: str = typer.Option("50,90,99", help="Percentiles to report."),
    url: str | None = typer.Option(
        None, help="OpenAI base URL, e.g. http://HOST:PORT/v1; omit to launch the built-in engine."
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
    endpoint: str = typer.Option("completions", help="completions | chat.", rich_help_panel=WORKLOAD_PANEL),
    workload: str = typer.Option(
        "random", help="Workload name or trace path (see `bench workloads list`).", rich_help_panel=WORKLOAD_PANEL
    ),
    conversations: Path | None = typer.Option(
        None,
        help="Multi-turn sessions from real conversations (--endpoint chat): a ShareGPT, LMSYS-Chat or "
        "OpenAI-messages JSON/JSONL file; each turn carries the recorded history; the load counts sessions.",
        rich_help_panel=WORKLOAD_PANEL,
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
    seed: int | None = knob_option(
        "seed", help="Workload seed (default 0); when given, the built-in engine's seed too."
    ),
    structured_output: str | None = typer.Option(
        None,
        help="Ask every request for a structured output: json | regex | choice (the structured workload sends "
        "its JSON schemas without this flag). Records keep whether each output validated.",
        rich_help_panel=WORKLOAD_PANEL,
    ),
    structured_output_shape: str | None = typer.Option(
        None,
        help="How schemas are sent: response_format | structured_outputs | guided (vLLM's guided_*); "
        "default: response_format for JSON, structured_outputs for regex and choice.",
        rich_help_panel=WORKLOAD_PANEL,
    ),
    fit_policy: str = typer.Option(
        "clip",
        help="How requests longer than --max-model-len are fitted: clip | drop | rescale.",
        rich_help_panel=WORKLOAD_PANEL,
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
        "`bench gate` resamples repeats to see between-run noise."
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
    cost_per_hour: float | None = typer.Option(
        None, help="USD per instance-hour: every point gets cost_per_million_output_tokens at its goodput."
    ),
    gpus_per_instance: int = typer.Option(1, help="GPUs of one instance (with --cost-per-hour)."),
) -> None:
    """Sweep load against an OpenAI endpoint (or the built-in engine) and write a run directory."""
    from sweep.point.benchmark_metrics import parse_slo

    _interrupt_on_sigterm()
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweeper import SweepConfig, run_sweep

    ramp = None
    if ramp_up_strategy is not None:
        if request_rate is not None or concurrency is not None or replay:
            _fail("--ramp-up-strategy replaces --request-rate (as in vLLM); drop --request-rate/--concurrency/--replay")
        if ramp_up_start_rps is None or ramp_up_end_rps is None:
            _fail("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        ramp = (ramp_up_strategy, ramp_up_start_rps, ramp_up_end_rps)
        request_rate = str(ramp_up_end_rps)
    if (concurrency is not None) + (request_rate is not None) + replay != 1:
        _fail("give exactly one of --concurrency 1,2,4, --request-rate 1,2,4, --replay or --ramp-up-strategy")
    mode = "concurrency" if concurrency is not None else "rate" if request_rate is not None else "replay"
    loads = {"concurrency": (concurrency, "--concurrency"), "rate": (request_rate, "--request-rate"),
             "replay": (time_scale, "--time-scale")}[mode]
    if rate_curve is not None and mode != "rate":
        _fail("--rate-curve shapes --request-rate points; give --request-rate (not --concurrency or --replay)")
    if url is not None and engine_knobs:
        _fail("engine knobs apply only to the built-in engine; drop them or drop --url")
    shared = {"tokenizer": tokenizer, "seed": seed, "max_model_len": max_model_len}  # the command's and the engine's
    knobs = {**engine_knobs, **{k: v for k, v in shared.items() if v is not None}}
    try:
        config = SweepConfig(
            output_dir=output_dir,
            mode=mode,
            values=_floats(*loads),
            url=url,
            model=model,
            tokenizer=tokenizer,
            api_key=api_key,
            engine_knobs=knobs if url is None else {},
            workload=WorkloadConfig(
                workload=workload,
                **_synthetic_lengths(workload, input_len, output_len),
                range_ratio=random_range_ratio,
                max_model_len=max_model_len,
                fit_policy=fit_policy,
                seed=seed if seed is not None else 0,
                endpoint=endpoint,
                structured_output=structured_output,
                structured_output_shape=structured_output_shape,
                conversations=str(conversations) if conversations is not None else None,
            ),
            num_prompts=num_prompts,
            duration=duration,
            burstiness=burstiness,
            max_concurrency=max_concurrency,
            num_warmups=num_warmups,
            reset_prefix_cache=reset_prefix_cache,
            slo=parse_slo(slo),
            percentiles=_floats(percentiles, "--percentiles"),
            max_load_under_slo=max_load_under_slo,
            attainment=attainment,
            search_repeats=search_repeats,
            resume=resume,
            client_procs=client_procs,
            repeats=repeats,
            calibration=calibration,
            server_metrics=server_metrics,
            ramp_up=ramp,
            turns=turns,
            think_time_s=think_time,
            rate_curve=_rate_curve(rate_curve),
            warmup_seconds=warmup_seconds,
            cooldown_seconds=cooldown_seconds,
            ignore_eos=ignore_eos,
            temperature=temperature,
            cost_per_hour=cost_per_hour,
            gpus_per_instance=gpus_per_instance,
            request_timeout_s=request_timeout,
            stall_timeout_s=stall_timeout,
        )
        run_dir = run_sweep(config)
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.secho(
            f"interrupted: finished points are kept in {output_dir}; continue with the same flags and --resume",
            fg=typer.colors.YELLOW,
            err=True,
        )
        raise typer.Exit(130) from None
    typer.echo(f"results: {run_dir}")
    if report and ctx.obj is not None:
        _render_report(ctx.obj, run_dir, config.slo)


def _render_report(render: ReportRenderer, run_dir: Path, slo: dict | None) -> None:
    try:
        out = render([run_dir], run_dir / "report", slo=slo)
    except Exception as e:  # the run directory is complete; only the report is missing
        typer.secho(
            f"warning: the report failed ({type(e).__name__}: {e}); the results in {run_dir} are complete",
            fg=typer.colors.YELLOW,
            err=True,
        )
        return
    typer.echo(f"report: {out}")


def mock_server(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    ttft_ms: float = typer.Option(50.0, help="Programmed time to first token."),
    itl_ms: float = typer.Option(10.0, help="Programmed gap between tokens."),
    output_len: int | None = typer.Option(None, help="Cap on output tokens (default: max_tokens decides)."),
    tokens_per_chunk: int = typer.Option(1, help="Tokens per SSE event (>1 mimics coalesced streams)."),
    model: str = typer.Option("mock", help="Model id reported by /v1/models."),
    workers: int = typer.Option(1, help="Server processes sharing the port."),
    hang_after_tokens: int | None = typer.Option(
        None, help="Every response goes silent after this many tokens and stays open (a stalled engine)."
    ),
) -> None:
    """An OpenAI-compatible server streaming on a programmed schedule (for calibration and tests)."""
    from sweep.mock.server import MockConfig, serve

    try:
        config = MockConfig(host, port, ttft_ms, itl_ms, output_len, tokens_per_chunk, model, hang_after_tokens)
    except ValueError as e:
        _fail(str(e))
    typer.echo(f"mock server on http://{host}:{port}/v1 (TTFT {ttft_ms} ms, ITL {itl_ms} ms)")
    serve(config, workers=workers)


def calibrate(
    concurrency: str = typer.Option("1,64,256", help="Concurrencies to probe (those of your sweep)."),
    output_len: int = typer.Option(64, help="Tokens per request."),
    num_prompts: int | None = typer.Option(None, help="Requests per concurrency (default 4 x concurrency, >= 16)."),
    ttft_ms: float = typer.Option(50.0),
    itl_ms: float = typer.Option(10.0),
    client_procs: int = typer.Option(1, help="Client processes."),
    endpoint: str = typer.Option("completions"),
    max_rate: bool = typer.Option(True, "--max-rate/--no-max-rate", help="Also measure the maximum chunks/s (ITL 0)."),
    mock_workers: int = typer.Option(1, help="Mock server processes (so the mock is not the bottleneck)."),
    output_json: Path | None = typer.Option(None, help="Also write the figures as JSON."),
) -> None:
    """Drive a local mock server and report the client's added latency and its maximum streamed chunks/s."""
    from sweep.mock.calibrate import CalibrateConfig, run_calibration

    _interrupt_on_sigterm()

    try:
        config = CalibrateConfig(
            concurrencies=[int(c) for c in _floats(concurrency, "--concurrency")],
            output_len=output_len,
            num_prompts=num_prompts,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
            client_procs=client_procs,
            endpoint=endpoint,
            max_rate=max_rate,
            mock_workers=mock_workers,
        )
        run_calibration(config, output_json)
    except (ValueError, RuntimeError) as e:
        _fail(str(e))


def register(app: typer.Typer, groups: dict[str, typer.Typer], render_report: ReportRenderer | None = None) -> None:
    """Add this package's commands to the `bench` app; `bench sweep --report` renders with `render_report`
    (it reaches the command as its context's `obj`; without one, no report is written)."""
    app.command("sweep", context_settings={"obj": render_report})(sweep)
    app.command("mock-server")(mock_server)
    app.command("calibrate")(calibrate)
    app.command("soak")(soak_command)
    from sweep.compare_llama_cpp import compare_llama_cpp

    app.command("compare-llama-cpp")(compare_llama_cpp)
