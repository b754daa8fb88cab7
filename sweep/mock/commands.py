"""`bench lab mock-server` and `bench lab calibrate` (hidden old names: `bench mock-server`, `bench calibrate`)."""

from __future__ import annotations

from pathlib import Path

import typer

from sweep.cli_options import fail, floats, interrupt_on_sigterm


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
    max_num_seqs: int | None = typer.Option(
        None, help="At most N requests run at once, later ones queue (FIFO) before their TTFT starts: a known "
        "capacity of N / (TTFT + (output tokens - 1) x ITL) requests/s per worker."
    ),
) -> None:
    """An OpenAI-compatible server streaming on a programmed schedule (for calibration and tests)."""
    from sweep.mock.server import MockConfig, serve

    try:
        config = MockConfig(
            host, port, ttft_ms, itl_ms, output_len, tokens_per_chunk, model, hang_after_tokens, max_num_seqs
        )
    except ValueError as e:
        fail(str(e))
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

    interrupt_on_sigterm()

    try:
        config = CalibrateConfig(
            concurrencies=[int(c) for c in floats(concurrency, "--concurrency")],
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
        fail(str(e))
