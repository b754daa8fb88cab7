"""The load, workload and SLO options of `bench sweep`, `simulate`, `tune` and `soak`, declared once.

`shared_option(name)` is the typer.Option of one of them: its flag, its help text and its help panel, from
`SHARED_OPTIONS`. A command whose use of an option differs (tune's `--concurrency` is one fixed load or the
search's start, soak's is requests in flight) passes its own `default` and `help`; the flag and panel stay the
shared ones. The fields these options fill are declared once too: `sweep.run.load_config.LoadConfig`, the base
of `SweepConfig` and `SimulateConfig`.

Also the small pieces every one of these commands uses: comma-separated numbers, the error exit, the
synthetic workloads' default lengths, the run's report, SIGTERM as Ctrl-C.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    "max_load_under_slo": OptionSpec(
        False, "Search the largest load meeting --attainment.", LOAD_PANEL, ("--max-load-under-slo",)
    ),
    "attainment": OptionSpec(0.9, "SLO attainment goal for --max-load-under-slo.", LOAD_PANEL),
    "max_load": OptionSpec(4096.0, "--max-load-under-slo never goes above this load.", LOAD_PANEL),
    "endpoint": OptionSpec("completions", "completions | chat.", WORKLOAD_PANEL),
    "workload": OptionSpec("random", "Workload name or trace path (see `bench workloads list`).", WORKLOAD_PANEL),
    "input_len": OptionSpec(None, f"fixed/random: prompt tokens (default {SYNTHETIC_INPUT_LEN}).", WORKLOAD_PANEL),
    "output_len": OptionSpec(None, f"fixed/random: output tokens (default {SYNTHETIC_OUTPUT_LEN}).", WORKLOAD_PANEL),
    "random_range_ratio": OptionSpec(0.0, "random: lengths uniform in L*(1 +- r).", WORKLOAD_PANEL),
    "fit_policy": OptionSpec(
        "clip", "How requests longer than --max-model-len are fitted: clip | drop | rescale.", WORKLOAD_PANEL
    ),
    "slo": OptionSpec(
        None, "SLO, any subset: ttft=MS,tpot=MS,e2el=MS,valid=1 (valid=1: an invalid structured output misses).",
        SLO_PANEL,
    ),
    "percentiles": OptionSpec("50,90,99", "Percentiles to report.", SLO_PANEL),
    "cost_per_hour": OptionSpec(
        None, "USD per instance-hour: every point gets cost_per_million_output_tokens at its goodput.", COST_PANEL
    ),
    "gpus_per_instance": OptionSpec(1, (
        "GPUs of one instance: recorded beside the cost; --cost-per-hour is per instance, so it enters no figure."
    ), COST_PANEL),
}

_SHARED_DEFAULT = object()


def shared_option(name: str, default: Any = _SHARED_DEFAULT, help: str | None = None) -> Any:
    """The typer.Option of shared option `name`; `default` and `help` where the command's meaning differs."""
    spec = SHARED_OPTIONS[name]
    value = spec.default if default is _SHARED_DEFAULT else default
    return typer.Option(value, *spec.flags, help=help or spec.help, rich_help_panel=spec.panel)


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
