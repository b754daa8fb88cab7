"""The load, workload and SLO options of `bench sweep`, `simulate`, `tune` and `soak`, declared once.

`shared_option(name)` is the typer.Option of one of them: its flag, its help text and its help panel, from
`SHARED_OPTIONS`. A command whose use of an option differs (tune's `--concurrency` is one fixed load or the
search's start, soak's is requests in flight) passes its own `default` and `help`; the flag and panel stay the
shared ones. The fields these options fill are declared once too: `sweep.run.load_config.LoadConfig`, the base
of `SweepConfig` and `SimulateConfig`; `with_load_options` adds the options that fill it to a command.

Also the small pieces every one of these commands uses: comma-separated numbers, the error exit, the
synthetic workloads' default lengths, the run's report, SIGTERM as Ctrl-C.
"""

from __future__ import annotations

import functools
import inspect
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer

from sweep.run.results import ReportRenderer

LOAD_PANEL = "Load"
WORKLOAD_PANEL = "Workload"
SLO_PANEL = "SLO"
COST_PANEL = "Cost"
SYNTHETIC_INPUT_LEN, SYNTHETIC_OUTPUT_LEN = 1024, 128  # fixed/random without --input-len/--output-len


@dataclass(frozen=True)
class OptionSpec:
    default: Any
    help: str
    panel: str
    flags: tuple[str, ...] = ()  # empty: the parameter's name (--request-rate for request_rate)


SHARED_OPTIONS: dict[str, OptionSpec] = {
    "concurrency": OptionSpec(None, "Closed-loop streams per point, e.g. 1,2,4,8.", LOAD_PANEL),
    "request_rate": OptionSpec(None, "Open-loop request rates (req/s) per point, e.g. 1,2,4.", LOAD_PANEL),
    "burstiness": OptionSpec(1.0, "Gamma shape of inter-arrival times (1 = Poisson).", LOAD_PANEL),
    "max_concurrency": OptionSpec(None, "Rate mode: cap on in-flight requests.", LOAD_PANEL),
    "num_prompts": OptionSpec(None, "Requests per point (default 200 unless --duration).", LOAD_PANEL),
    "duration": OptionSpec(None, "Seconds of sending per point.", LOAD_PANEL),
    "num_warmups": OptionSpec(0, "Warm-up requests per point (distinct prompts, not measured).", LOAD_PANEL),
    "warmup_seconds": OptionSpec(
        0.0, "Steady-state window: the point's figures leave out its first S seconds (the whole point's are kept "
        "under `full`).", LOAD_PANEL,
    ),
    "cooldown_seconds": OptionSpec(
        0.0, "Steady-state window: the point's figures leave out its last S seconds (the drain).", LOAD_PANEL
    ),
    "max_load_under_slo": OptionSpec(
        False, "Search the largest load meeting --attainment.", LOAD_PANEL, ("--max-load-under-slo",)
    ),
    "attainment": OptionSpec(0.9, "SLO attainment goal for --max-load-under-slo.", LOAD_PANEL),
    "max_load": OptionSpec(4096.0, "--max-load-under-slo never goes above this load.", LOAD_PANEL),
    # the load shapes (sweep.run.load_shape.LoadShape): bench sweep's and bench tune's
    "replay": OptionSpec(
        False, "Send each request at its trace timestamp (a workload with timestamps).", LOAD_PANEL, ("--replay",)
    ),
    "time_scale": OptionSpec(
        "1", "--replay: trace time multipliers per point (2 = half speed, 0.5 = double), e.g. 1,0.5.", LOAD_PANEL
    ),
    "ramp_up_strategy": OptionSpec(
        None, "One open-loop point whose rate ramps (vLLM): linear | exponential.", LOAD_PANEL
    ),
    "ramp_up_start_rps": OptionSpec(None, "Ramp-up: the first request's rate.", LOAD_PANEL),
    "ramp_up_end_rps": OptionSpec(None, "Ramp-up: the last request's rate.", LOAD_PANEL),
    "rate_curve": OptionSpec(
        None, "With --request-rate: arrivals follow this rate curve, rescaled to each point's mean rate and "
        "stretched over the point: relative window rates (1,4,2) or a shipped mix's curve (servegen-deepseek-r1).",
        LOAD_PANEL,
    ),
    "turns": OptionSpec(
        1, "Multi-turn sessions (--endpoint chat): turns per conversation, each carrying the history; the load "
        "counts sessions.", LOAD_PANEL,
    ),
    "think_time": OptionSpec(0.0, "Seconds between a turn's response and the session's next turn.", LOAD_PANEL),
    "conversations": OptionSpec(
        None, "Multi-turn sessions from real conversations (--endpoint chat): a ShareGPT, LMSYS-Chat or "
        "OpenAI-messages JSON/JSONL file; each turn carries the recorded history; the load counts sessions.",
        WORKLOAD_PANEL,
    ),
    "structured_output": OptionSpec(
        None, "Ask every request for a structured output: json | regex | choice (the structured workload sends "
        "its JSON schemas without this flag). Records keep whether each output validated.", WORKLOAD_PANEL,
    ),
    "structured_output_shape": OptionSpec(
        None, "How schemas are sent: response_format | structured_outputs | guided (vLLM's guided_*); default: "
        "response_format for JSON, structured_outputs for regex and choice.", WORKLOAD_PANEL,
    ),
    "endpoint": OptionSpec("completions", "completions | chat.", WORKLOAD_PANEL),
    "workload": OptionSpec(
        "random", "Workload name, trace path or prompts:FILE (see `bench workloads list`).", WORKLOAD_PANEL
    ),
    "input_len": OptionSpec(None, f"fixed/random: prompt tokens (default {SYNTHETIC_INPUT_LEN}).", WORKLOAD_PANEL),
    "output_len": OptionSpec(None, f"fixed/random: output tokens (default {SYNTHETIC_OUTPUT_LEN}).", WORKLOAD_PANEL),
    "random_range_ratio": OptionSpec(0.0, "random: lengths uniform in L*(1 +- r).", WORKLOAD_PANEL),
    "fit_policy": OptionSpec(
        "clip", "How requests longer than --max-model-len are fitted: clip | drop | rescale.", WORKLOAD_PANEL
    ),
    "slo": OptionSpec(
        None, "SLO, any subset: ttft=MS,tpot=MS,e2el=MS,itl_p99=MS,max_stall=MS,valid=1 (itl_p99: each request's "
        "p99 chunk gap; max_stall: its longest; valid=1: an invalid structured output misses). Per request class: "
        "'CLASS:items;CLASS:items', plain items apply to every class (docs/SWEEP.md).",
        SLO_PANEL,
    ),
    "percentiles": OptionSpec("50,90,99", "Percentiles to report.", SLO_PANEL),
    "cost_per_hour": OptionSpec(
        None, "USD per instance-hour: every point gets cost_per_million_output_tokens at its goodput.", COST_PANEL
    ),
    "gpus_per_instance": OptionSpec(1, (
        "GPUs of one instance: a configuration on GPUs pays --cost-per-hour x its tensor x pipeline x data "
        "parallel size / N (whole instances when it spans more than one; a CPU engine or a --url target pays the "
        "whole instance; docs/TUNE.md)."
    ), COST_PANEL),
}

_SHARED_DEFAULT = object()


def shared_option(name: str, default: Any = _SHARED_DEFAULT, help: str | None = None) -> Any:
    """The typer.Option of shared option `name`; `default` and `help` where the command's meaning differs."""
    spec = SHARED_OPTIONS[name]
    value = spec.default if default is _SHARED_DEFAULT else default
    return typer.Option(value, *spec.flags, help=help or spec.help, rich_help_panel=spec.panel)


# with_load_options: the options that fill a LoadConfig, in --help order, and their types
LOAD_OPTION_TYPES: dict[str, Any] = {
    "concurrency": str | None,
    "request_rate": str | None,
    "burstiness": float,
    "max_concurrency": int | None,
    "num_prompts": int | None,
    "duration": float | None,
    "max_load_under_slo": bool,
    "attainment": float,
    "max_load": float,
    "slo": str | None,
    "percentiles": str,
    "endpoint": str,
    "workload": str,
    "input_len": int | None,
    "output_len": int | None,
    "random_range_ratio": float,
    "fit_policy": str,
}
LOAD_PARAMETER = "load"
Command = TypeVar("Command", bound=Callable[..., Any])
Config = TypeVar("Config")


@dataclass(frozen=True)
class LoadOptions:
    """The load, workload and SLO flags as given; `config` builds the LoadConfig (or subclass) they describe."""

    concurrency: str | None
    request_rate: str | None
    burstiness: float
    max_concurrency: int | None
    num_prompts: int | None
    duration: float | None
    max_load_under_slo: bool
    attainment: float
    max_load: float
    slo: str | None
    percentiles: str
    endpoint: str
    workload: str
    input_len: int | None
    output_len: int | None
    random_range_ratio: float
    fit_policy: str

    def config(
        self,
        cls: Callable[..., Config],
        *,
        mode: str | None = None,
        values: list[float] | None = None,
        workload: dict[str, Any] | None = None,
        **config_fields: Any,
    ) -> Config:
        """`cls(...)`, a LoadConfig subclass, from the flags plus `config_fields` (the subclass's own fields).

        The load is `mode` and `values` when given, else exactly one of --concurrency and --request-rate (a
        usage error otherwise). `workload` adds WorkloadConfig fields the flags do not carry (seed, max_model_len,
        structured outputs). A bad --slo raises ValueError, as do the config's own checks.
        """
        from sweep.point.benchmark_metrics import parse_slo
        from sweep.point.runner import WorkloadConfig

        if mode is None:
            if (self.concurrency is None) == (self.request_rate is None):
                fail("give exactly one of --concurrency 1,2,4 or --request-rate 1,2,4")
            mode = "concurrency" if self.concurrency is not None else "rate"
            text, flag = (self.concurrency, "--concurrency") if mode == "concurrency" else (
                self.request_rate, "--request-rate")  # fmt: skip
            values = floats(text, flag)
        return cls(
            mode=mode,
            values=values,
            workload=WorkloadConfig(
                workload=self.workload,
                **synthetic_lengths(self.workload, self.input_len, self.output_len),
                range_ratio=self.random_range_ratio,
                fit_policy=self.fit_policy,
                endpoint=self.endpoint,
                **(workload or {}),
            ),
            num_prompts=self.num_prompts,
            duration=self.duration,
            burstiness=self.burstiness,
            max_concurrency=self.max_concurrency,
            slo=parse_slo(self.slo),
            percentiles=floats(self.percentiles, "--percentiles"),
            max_load_under_slo=self.max_load_under_slo,
            attainment=self.attainment,
            max_load=self.max_load,
            **config_fields,
        )


def with_load_options(
    exclude: tuple[str, ...] = (), help: dict[str, str] | None = None
) -> Callable[[Command], Command]:
    """Add the load, workload and SLO options (`LOAD_OPTION_TYPES`, declared in `SHARED_OPTIONS`) to a command
    in place of its `load: LoadOptions` parameter, and pass it the flags given as that `LoadOptions`.

    `exclude` names options the command does not offer (they take their shared defaults); `help` replaces an
    option's help text where the command's meaning differs. As `engine.cli_options.with_engine_knobs` does for
    engine knobs, so a command that runs a sweep-like load (`bench sweep`, `bench simulate`, or a new one such
    as a comparison over targets) gets the same flags, defaults and panels, and builds its config with
    `load.config(ItsConfig, **its_own_fields)`:

        @with_load_options(exclude=("max_load",))
        def command(load: LoadOptions, output_dir: Path = typer.Option(...)) -> None:
            config = load.config(SweepConfig, output_dir=output_dir)
    """
    return _with_options(LOAD_OPTION_TYPES, LOAD_PARAMETER, LoadOptions, exclude, help)


# with_shape_options: the load-shape options that fill a LoadShape (sweep/run/load_shape.py), and their types
SHAPE_OPTION_TYPES: dict[str, Any] = {
    "replay": bool,
    "time_scale": str,
    "ramp_up_strategy": str | None,
    "ramp_up_start_rps": float | None,
    "ramp_up_end_rps": float | None,
    "rate_curve": str | None,
    "turns": int,
    "think_time": float,
    "conversations": Path | None,
    "structured_output": str | None,
    "structured_output_shape": str | None,
}
SHAPE_PARAMETER = "shape"


def with_shape_options(help: dict[str, str] | None = None) -> Callable[[Command], Command]:
    """Add the load-shape options (sessions, replay, rate curves, structured outputs: `SHAPE_OPTION_TYPES`,
    declared in `SHARED_OPTIONS`) to a command in place of its `shape: LoadShape` parameter, as
    `with_load_options` does; `bench sweep` and `bench tune` take them, so a tune's trials measure any shape a
    sweep can. `help` replaces an option's help text where the command's meaning differs."""
    from sweep.run.load_shape import LoadShape

    return _with_options(SHAPE_OPTION_TYPES, SHAPE_PARAMETER, LoadShape, (), help)


def _with_options(
    types: dict[str, Any], parameter: str, build: Callable[..., Any], exclude: tuple[str, ...],
    help: dict[str, str] | None,
) -> Callable[[Command], Command]:
    """Replace a command's `parameter` by the options `types` names (less `exclude`) and pass it
    `build(**the flags)`."""
    unknown = set(exclude) | set(help or {})
    if unknown - set(types):
        raise ValueError(f"not {parameter} options: {sorted(unknown - set(types))}")

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        if parameter not in signature.parameters:
            raise TypeError(f"{command.__name__} needs a {parameter} parameter to receive its options")
        declared = set(types) & set(signature.parameters)
        if declared:
            raise TypeError(f"{command.__name__} declares {parameter} options itself: {sorted(declared)}; use help=")
        names = [n for n in types if n not in exclude]
        generated = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=shared_option(name, help=(help or {}).get(name)),
                annotation=types[name],
            )
            for name in names
        ]
        parameters: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            parameters += generated if p.name == parameter else [p]

        @functools.wraps(command)
        def with_options(**kwargs: Any) -> Any:
            flags = {name: SHARED_OPTIONS[name].default for name in exclude}
            flags.update({name: kwargs.pop(name) for name in names})
            return command(**kwargs, **{parameter: build(**flags)})

        with_options.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_options  # type: ignore[return-value]

    return decorate


def floats(text: str | None, flag: str) -> list[float]:
    """Comma-separated numbers; a bad one is a usage error naming `flag`."""
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} takes comma-separated numbers, got {text!r}") from None


def synthetic_lengths(workload: str, input_len: int | None, output_len: int | None) -> dict[str, int | None]:
    """WorkloadConfig's input_len/output_len: the flags, else 1024 -> 128 for the fixed and random workloads
    (shipped mixes bring their own lengths)."""
    synthetic = workload in ("fixed", "random")
    return {
        "input_len": input_len if input_len is not None else (SYNTHETIC_INPUT_LEN if synthetic else None),
        "output_len": output_len if output_len is not None else (SYNTHETIC_OUTPUT_LEN if synthetic else None),
    }


def interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so a launched server is stopped and finished points stay written."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def fail(message: str) -> None:
    """End the command with `error: message` and exit status 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def render_run_report(render: ReportRenderer, run_dir: Path, slo: dict | None) -> None:
    """Render the run's report into <run_dir>/report; a failure is a warning (the run itself is complete)."""
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
