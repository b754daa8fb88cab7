"""`bench tune` (Optuna search over engine knobs for goodput under an SLO), `bench lab tune-efficiency` and
`bench lab tune-launches` (hidden old names: `bench tune-efficiency`, `bench tune-launches`). Heavy imports stay
inside the commands."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import typer

from engine.cli_options import renamed_command
from sweep.cli_options import shared_option, with_shape_options
from sweep.run.load_shape import LoadShape
from sweep.run.results import ReportRenderer, write_atomic
from sweep.tune import engines
from sweep.tune.replay_commands import tune_efficiency, tune_launches


def _model_max_len(model: str) -> int | None:
    """The built-in engine's context length for the model (what it accepts as max_model_len)."""
    try:
        from engine.config import model_context_length

        return model_context_length(model)
    except Exception:  # an external engine's model we cannot open here: no context-length filter
        return None


def _model_tensor_parallel_sizes(model: str) -> tuple[int, ...] | None:
    """The tensor-parallel sizes the model's heads split into (vLLM's rule, so external engines' too), when the
    model's config can be read here."""
    try:
        from engine.distributed import valid_tensor_parallel_sizes
        from engine.model_files import load_hf_config, resolve_model
        from engine.models import ArchConfig

        arch = ArchConfig.from_hf(load_hf_config(resolve_model(model)))
    except Exception:  # an external engine's model we cannot open here: the device filter only
        return None
    return tuple(valid_tensor_parallel_sizes(arch.num_attention_heads, arch.num_key_value_heads))


def default_study_name(model: str, workload: str, objective: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"tune-{Path(model).name}-{Path(workload).name}-{objective}")


@with_shape_options(help={
    "replay": "Every trial replays the trace at its timestamps (a workload with timestamps); --objective goodput, "
    "pareto or cost only: max-load has no load to search in a replay (docs/TUNE.md).",
    "time_scale": "--replay: the trace time multiplier of every trial (one number; 2 = half speed, 0.5 = double).",
    "ramp_up_strategy": "Every trial measures one open-loop point whose rate ramps (vLLM): linear | exponential; "
    "--objective goodput, pareto or cost only (max-load cannot scale a ramp).",
    "rate_curve": "With --request-rate: arrivals follow this rate curve, rescaled to each point's mean rate (the "
    "fixed rate, or each rate the max-load search tries): relative window rates (1,4,2) or a shipped mix's curve.",
})
def tune(
    ctx: typer.Context,
    shape: LoadShape,
    model: str = typer.Option("smollm2-135m", help="Model alias, HF directory or hub id."),
    slo: str = shared_option(
        "slo", ..., help="SLO, e.g. ttft=500,tpot=50 (ms; any of ttft, tpot, e2el, itl_p99, max_stall; "
        "per request class as for bench sweep)."
    ),
    attainment: float = shared_option("attainment", help="Fraction of requests that must meet the SLO."),
    objective: str = typer.Option("max-load", help="max-load | goodput | pareto | cost (needs --cost-per-hour)."),
    n_trials: int | None = typer.Option(None, help="Finished trials the study should hold, all workers together "
                                        "(default 20; with --grid, the grid's size)."),
    timeout: float | None = typer.Option(None, help="Stop starting trials after this many seconds."),
    storage: str | None = typer.Option(None, help="Optuna RDB URL (postgresql://...); default SQLite in --output-dir."),
    study_name: str | None = typer.Option(None, help="Study name; default derived from model, workload, objective."),
    space: Path | None = typer.Option(None, help="YAML/JSON file overriding the search space."),
    output_dir: Path = typer.Option(Path("results/tune"), help="Study DB, trial run directories, tune_report.html."),
    workload: str = shared_option("workload", help="Workload: a shipped mix, fixed, random, or a trace file."),
    input_len: int | None = shared_option(
        "input_len", help="Prompt tokens for generated workloads (fixed/random: 256)."
    ),
    output_len: int | None = shared_option(
        "output_len", help="Output tokens for generated workloads (fixed/random: 64)."
    ),
    num_prompts: int | None = shared_option(
        "num_prompts", help="Prompts per load point (default 32 unless --duration; at least one per stream: the "
        "point's concurrency, times --turns with sessions)."
    ),
    duration: float | None = shared_option("duration"),
    num_warmups: int = shared_option("num_warmups", 1, help="Warm-up prompts before each point (not measured)."),
    endpoint: str = shared_option("endpoint"),
    seed: int = typer.Option(0, help="Workload and sampler seed."),
    tokenizer: str | None = typer.Option(None, help="Tokenizer for prompt synthesis; default the model."),
    concurrency: int | None = shared_option(
        "concurrency", help="Closed loop: fixed load (goodput/pareto) or search start."
    ),
    request_rate: float | None = shared_option("request_rate", help="Open loop (req/s): fixed load or search start."),
    max_load: float = shared_option("max_load", 64, help="max-load: the search never goes above this load."),
    launch_command: str | None = typer.Option(
        None, help="External engine template, e.g. 'vllm serve {model} --port {port} --max-num-seqs {max_num_seqs}'."
    ),
    engine: str | None = typer.Option(
        None, help="servelab (default: the built-in engine) | vllm: launch `vllm serve MODEL --host --port "
        "--served-model-name MODEL {knob_flags}` (MODEL an HF directory); knobs vLLM lacks are refused first."
    ),
    vllm_command: str | None = typer.Option(
        None, help="--engine vllm: the vllm executable (default .venv-vllm/bin/vllm beside the repo, from `make "
        "vllm`, when it exists, else vllm on PATH)."
    ),
    vllm_args: str | None = typer.Option(
        None, help="--engine vllm: flags added to every trial's `vllm serve` (e.g. '--enforce-eager'); the "
        "space's knobs set their own flags."
    ),
    repeats: int = typer.Option(1, help="Measure each trial K times; the median is the value, the spread kept."),
    startup_timeout: float = typer.Option(600, help="Seconds an engine may take to become healthy."),
    trial_timeout: float = typer.Option(
        7200, help="Seconds a whole trial (engine start and every point) may take; past it the engine is killed and "
        "the trial recorded infeasible, cause timeout (0: no limit)."
    ),
    grid: bool = typer.Option(False, help="Measure every combination of the space once (Optuna GridSampler) "
                              "instead of TPE; --n-trials defaults to the grid's size."),
    simulate_first: Path | None = typer.Option(
        None, help="A `bench model profile` JSON: simulate every configuration first; launch all but those predicted "
        "infeasible, or worse than the best measured trial by --prune-margin even with --prune-step-error faster "
        "steps (docs/TUNE.md)."
    ),
    prune_margin: float = typer.Option(0.2, help="--simulate-first: prune predictions this much worse than the "
                                       "reference (the best measured trial's value or, if lower, its prediction)."),
    prune_step_error: str = typer.Option(
        "profile", help="--simulate-first: before pruning, simulate again with every step 1/(1+E) as long; E is "
        "'profile' (the profile's leave-one-out max step-time error) or a number >= 0 (0: no second simulation)."
    ),
    cost_per_hour: float | None = shared_option(
        "cost_per_hour",
        help="USD per instance-hour: points get cost_per_million_output_tokens (--objective cost needs it).",
    ),
    gpus_per_instance: int = shared_option("gpus_per_instance"),
    steady_window: str | None = typer.Option(
        None, help="auto: judge every point by its detected steady window (bench sweep --steady-window auto)."
    ),
    warmup_seconds: float = shared_option("warmup_seconds"),
    cooldown_seconds: float = shared_option("cooldown_seconds"),
    max_quality_loss: str | None = typer.Option(
        None, help="Largest perplexity increase over the unquantized model, e.g. 2% or 0.02: configurations over it "
        "are infeasible, cause quality (measured with `bench check quality` once per weight and KV-cache dtype "
        "setting, before any launch)."
    ),
    quality_window: int = typer.Option(
        1024, help="--max-quality-loss: tokens per scored window (bench check quality)."
    ),
    quality_tokens: int | None = typer.Option(None, help="--max-quality-loss: score only the text's first N tokens."),
    quality_chunk: int = typer.Option(64, help="--max-quality-loss: prefill chunk (--max-num-batched-tokens) of the "
                                      "measurement, below the window so the KV cache's dtype is seen."),
) -> None:
    """Search engine knobs (Optuna TPE) for the most load, or goodput, under an SLO."""
    import logging
    import warnings

    import optuna
    from rich.console import Console

    from sweep.point.benchmark_metrics import parse_slo, slo_classes
    from sweep.point.prompts import check_slo_classes
    from sweep.tune.backend import EngineBackend, TrialWorkload
    from sweep.tune.load_checks import (
        check_simulated_shape,
        check_trial_sweep,
        check_workload,
        study_longest_request,
        tune_load,
    )
    from sweep.tune.objective import ObjectiveSpec
    from sweep.tune.report import SPACE_NOTES, best_commands, render_best_sweep_report, write_report
    from sweep.tune.space import DeviceInfo, SpaceError, build_space, fill_template
    from sweep.tune.study import TuneAborted, TuneObjective, check_space_matches, open_study, run_study, storage_url

    console = Console()
    n_trials_given = n_trials is not None
    n_trials = n_trials if n_trials is not None else 20
    try:
        slo_ms = parse_slo(slo)
        if not slo_ms:
            raise ValueError("--slo needs at least one of ttft, tpot, e2el, itl_p99, max_stall")
        mode, given_load = tune_load(objective, concurrency, request_rate, shape)
        if steady_window not in (None, "auto"):
            raise ValueError(f"--steady-window takes 'auto', got {steady_window!r}")
        if trial_timeout < 0:
            raise ValueError(f"--trial-timeout must be >= 0 (0: no limit), got {trial_timeout}")
        if objective == "cost" and cost_per_hour is None:
            raise ValueError("--objective cost needs --cost-per-hour USD (the price of one instance-hour)")
        if cost_per_hour is not None:
            from sweep.run.cost import CostConfig

            CostConfig(cost_per_hour, gpus_per_instance)
        measures_builtin = [name for name, given in (("--max-quality-loss", max_quality_loss is not None),
                                                     ("--simulate-first", simulate_first is not None)) if given]
        engine_preset, model = engines.resolve(engine, launch_command, vllm_command, model, measures_builtin,
                                               vllm_args)
        launch_command = engine_preset.launch_command
        quality_guard = None
        if max_quality_loss is not None:
            from sweep.tune.quality_guard import QualityGuard, QualityGuardConfig, parse_max_quality_loss

            quality_guard = QualityGuard(QualityGuardConfig(model, parse_max_quality_loss(max_quality_loss),
                                                            window=quality_window, num_tokens=quality_tokens,
                                                            chunk_tokens=quality_chunk))
        profile, step_error = None, 0.0
        if simulate_first is not None:
            from sweep.simulate.simulation import load_profile
            from sweep.tune.simulate_first import resolve_step_error

            check_simulated_shape(shape)
            profile = load_profile(simulate_first)
            if profile.knobs.get("model") not in (None, model):
                raise ValueError(f"--simulate-first {simulate_first} profiles {profile.knobs['model']}, not {model}")
            step_error = resolve_step_error(prune_step_error, profile)
        load = given_load if given_load is not None else (1 if objective == "max-load" else 8)
        spec = ObjectiveSpec(
            kind=objective,
            attainment=attainment,
            load_mode=mode,
            load=load,
            min_load=load,
            max_load=max(max_load, load),
        )
        if workload in ("fixed", "random"):  # shipped mixes and traces bring their own lengths: pass none
            input_len, output_len = input_len or 256, output_len or 64
        check_workload(workload, input_len, output_len, seed)
        trial_workload = TrialWorkload(
            model=model, workload=workload, input_len=input_len, output_len=output_len,
            num_prompts=num_prompts if num_prompts is not None or duration is not None else 32, duration=duration,
            num_warmups=num_warmups, endpoint=endpoint, seed=seed, tokenizer=tokenizer, slo=slo_ms, load_mode=mode,
            cost_per_hour=cost_per_hour, gpus_per_instance=gpus_per_instance, steady_window=steady_window,
            warmup_seconds=warmup_seconds, cooldown_seconds=cooldown_seconds,
            **shape.workload_fields(), **shape.sweep_fields(),
        )  # fmt: skip
        check_trial_sweep(trial_workload, load)  # the sweep's own checks of the shape, once
        if slo_classes(slo_ms):  # a class the workload lacks is one clear error before any trial
            check_slo_classes(
                trial_workload.workload_config(None),
                slo_ms,
                trial_workload.num_prompts,
            )
        # vLLM's HF directory is one we can read: its context bounds max_model_len as the built-in engine's does.
        readable = not launch_command or (engine_preset.name == "vllm" and Path(model).is_dir())
        model_max_len = _model_max_len(model) if readable else None
        longest = study_longest_request(trial_workload, spec, tokenizer or model)
        device = DeviceInfo.detect(model_max_len=model_max_len, min_model_len=longest,
                                   tensor_parallel_sizes=_model_tensor_parallel_sizes(model))  # fmt: skip
        search_space = build_space(device, space)
        engines.check_knobs(engine_preset.name, search_space.placeholder_knobs())  # by name, before any trial
        if isinstance(pinned := search_space.fixed.get("max_model_len"), int) and pinned < longest:
            search_space.notes.append(
                f"max_model_len: pinned to {pinned}, shorter than the workload's longest request ({longest} tokens "
                "of prompt + output): every trial clips the requests longer than it the same way"
            )
        if grid:
            search_space.grid()  # every knob needs a finite list of values
        if launch_command:  # a placeholder the space cannot fill fails here, not in every trial
            fill_template(launch_command, model, search_space.placeholder_knobs())
    except (ValueError, SpaceError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from err
    for note in search_space.notes:
        console.print(f"[yellow]space:[/yellow] {note}")
    console.print(
        f"searching {', '.join(search_space.names)}"
        + (f"; pinned {json.dumps(search_space.fixed)}" if search_space.fixed else "")
    )

    output_dir.mkdir(parents=True, exist_ok=True)
    url = storage_url(storage, output_dir)
    name = study_name or default_study_name(model, workload, objective)
    info = {
        "model": model,
        "workload": workload,
        "slo": slo_ms,
        "attainment": attainment,
        "objective": objective,
        "load_mode": mode,
        "load": load,
        "launch_command": launch_command or "",
        **({"load_shape": shape.given()} if shape.given() else {}),
        "engine": engine_preset.name,
        "repeats": repeats,
        "trial_timeout_s": trial_timeout or None,
        "longest_request": longest,  # prompt + output tokens: no searched max_model_len is below it
        SPACE_NOTES: search_space.notes,  # what the space left out and why (the console's `space:` lines)
        **({"max_quality_loss": quality_guard.config.max_loss} if quality_guard else {}),
        **({"simulate_first": str(simulate_first), "prune_margin": prune_margin, "prune_step_error": step_error}
           if profile is not None else {}),
    }
    optuna.logging.set_verbosity(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    grid_values = search_space.grid() if grid else None
    if grid_values:
        size = math.prod(len(v) for v in grid_values.values())
        n_trials = min(n_trials, size) if n_trials_given else size
        console.print(f"grid: {size} combinations")
    study = open_study(url, name, spec, seed, info, grid=grid_values)
    try:
        check_space_matches(study, search_space)
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from err
    backend = EngineBackend(trial_workload, launch_command=launch_command, startup_timeout_s=startup_timeout,
                            trial_timeout_s=trial_timeout or None)
    if profile is not None:
        from sweep.tune.simulate_first import SimulateFirstObjective, simulators

        nominal, optimistic = simulators(profile, trial_workload, step_error)
        try:
            tune_objective: TuneObjective = SimulateFirstObjective(
                search_space, spec, backend, output_dir, repeats=repeats, model_max_len=model_max_len,
                simulator=nominal, optimistic=optimistic, step_error=step_error, margin=prune_margin,
                quality_guard=quality_guard,
            )  # fmt: skip
        except ValueError as err:
            console.print(f"[red]error:[/red] {err}")
            raise typer.Exit(2) from err
    else:
        tune_objective = TuneObjective(
            search_space, spec, backend, output_dir, repeats=repeats, model_max_len=model_max_len,
            quality_guard=quality_guard,
        )
    console.print(f"study [bold]{name}[/bold] in {url}")
    aborted: TuneAborted | None = None
    try:
        run_study(study, tune_objective, n_trials=n_trials, timeout=timeout)
    except TuneAborted as err:
        aborted = err

    best = best_commands(study, model, launch_command)
    if best and best[0]["run_dir"] and ctx.obj is not None:
        try:
            best[0]["sweep_report"] = render_best_sweep_report(
                ctx.obj, str(Path(best[0]["run_dir"]) / "repeat0"), slo_ms
            )
        except Exception as err:  # the tuning result stands without its sweep report; say why it is missing
            console.print(f"[yellow]the best trial's sweep report failed:[/yellow] {err}")
    write_atomic(output_dir / "best.json", json.dumps(best, indent=2, default=str))
    report = write_report(study, output_dir, best)
    if not best:
        console.print("[red]no feasible configuration met the SLO[/red]")
    for entry in best:
        if engine_preset.name == "vllm":  # the runnable `vllm serve ...`; `bench serve` would run another engine
            console.print(f"[bold]best[/bold] trial {entry['number']} {entry['values']}: {entry['launch_command']}")
        else:
            console.print(f"[bold]best[/bold] trial {entry['number']} {entry['values']}: {entry['serve_command']}")
            if entry["launch_command"]:
                console.print(f"  external: {entry['launch_command']}")
        console.print(f"  run dir: {entry['run_dir']}")
    console.print(f"report: {report}")
    if aborted is not None:
        console.print(f"[red]stopped:[/red] {aborted}")
        raise typer.Exit(1)


def register(app: typer.Typer, groups: dict[str, typer.Typer], render_report: ReportRenderer | None = None) -> None:
    """Add `bench tune`, `bench lab tune-efficiency` and `bench lab tune-launches` to the `bench` app; `render_report`
    renders the best trial's sweep report, linked from tune_report.html (it reaches `tune` as its context's `obj`;
    without one, no link)."""
    app.command("tune", context_settings={"obj": render_report})(tune)
    groups["lab"].command("tune-efficiency")(tune_efficiency)
    groups["lab"].command("tune-launches")(tune_launches)
    app.command("tune-efficiency", hidden=True)(renamed_command(tune_efficiency, "bench lab tune-efficiency"))
    app.command("tune-launches", hidden=True)(renamed_command(tune_launches, "bench lab tune-launches"))
