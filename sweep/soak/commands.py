"""`bench soak`: flags → SoakConfig, progress lines, the verdict, and `bench gate`'s exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sweep.cli_options import shared_option

SOAK_EXIT_PASS, SOAK_EXIT_FAIL, SOAK_EXIT_UNUSABLE = 0, 1, 2
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1.5h' → seconds."""
    raw = text.strip().lower()
    scale = _UNITS.get(raw[-1:], None)
    number = raw[:-1] if scale is not None else raw
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"--duration takes seconds or a number with s, m or h (e.g. 10m), got {text!r}") from None
    if seconds <= 0:
        raise ValueError(f"--duration must be positive, got {text!r}")
    return seconds


def soak(
    url: str = typer.Option(..., help="OpenAI base URL, e.g. http://HOST:PORT/v1 (/metrics is read from its root)."),
    duration: str = shared_option("duration", "10m", help="How long to send: seconds, or 90s, 10m, 1h."),
    num_requests: int | None = typer.Option(None, help="Stop after this many requests (if before --duration)."),
    concurrency: int = shared_option("concurrency", 16, help="Requests in flight."),
    mix: str | None = typer.Option(
        None, help="Shares, e.g. cancel=0.1,disconnect=0.05,malformed=0.1,stream=0.5,chat=0.3,prefix=0.5,"
        "long_output=0.02 (unnamed ones keep these defaults)."
    ),
    model: str | None = typer.Option(None, help="Model name to send (default: the first of /v1/models)."),
    api_key: str | None = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token for the target."),
    max_model_len: int | None = typer.Option(
        None, help="Context limit (default: /v1/models' max_model_len, else 2048)."
    ),
    max_tokens: int = typer.Option(64, help="Most valid requests draw max_tokens in [1, this]; long_output ones "
                                   "go up to the context limit."),
    request_timeout: float = typer.Option(60.0, help="Seconds before a request counts as a timeout."),
    num_windows: int = typer.Option(5, help="Time windows the load is split into for drift."),
    oversized_bytes: int = typer.Option(17 * 2**20, help="Body size of the oversized malformed requests "
                                        "(set it just above the server's limit)."),
    max_unexpected_errors: int = typer.Option(0, help="Verdict: most unexpected outcomes (5xx, resets, timeouts, "
                                              "wrong outputs, wrong 4xx) allowed."),
    max_latency_drift: float = typer.Option(0.5, help="Verdict: last window's median TTFT/TPOT at most (1 + this) x "
                                            "the first window's."),
    max_memory_growth: float = typer.Option(0.05, help="Verdict: resident memory growth, first to last window."),
    drain_timeout: float = typer.Option(30.0, help="Verdict: seconds KV usage and running requests get to reach 0 "
                                        "after the load."),
    seed: int = typer.Option(0, help="Seed of the request mix."),
    output_dir: Path = typer.Option(Path("results/soak"), help="Run directory (requests.jsonl, metrics.jsonl, "
                                    "summary.json, report.html)."),
) -> None:
    """Soak an OpenAI endpoint with long mixed, hostile load; report drift; exit 0 pass, 1 fail, 2 unusable."""
    from sweep.soak.cases import SoakMix
    from sweep.soak.report import SoakBounds
    from sweep.soak.runner import SoakConfig, run_soak

    try:
        config = SoakConfig(
            url=url, output_dir=output_dir, duration_s=parse_duration(duration), num_requests=num_requests,
            concurrency=concurrency, mix=SoakMix.parse(mix), model=model, api_key=api_key,
            max_model_len=max_model_len, max_tokens=max_tokens, request_timeout_s=request_timeout,
            num_windows=num_windows, oversized_bytes=oversized_bytes, seed=seed,
            bounds=SoakBounds(max_unexpected_errors, max_latency_drift, max_memory_growth, drain_timeout),
        )  # fmt: skip
        summary = run_soak(config, progress=lambda line: typer.echo(line, err=True))
    except (ValueError, ConnectionError) as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(SOAK_EXIT_UNUSABLE) from None
    for name, check in summary["verdict"]["checks"].items():
        result = {True: "pass", False: "FAIL", None: "not measured"}[check["passed"]]
        typer.echo(f"{name:18} {result:12} value {json.dumps(check['value'])}  bound {check['bound']}")
    passed = summary["verdict"]["passed"]
    typer.echo(f"verdict: {'PASS' if passed else 'FAIL'}; report: {output_dir / 'report.html'}")
    raise typer.Exit(SOAK_EXIT_PASS if passed else SOAK_EXIT_FAIL)
