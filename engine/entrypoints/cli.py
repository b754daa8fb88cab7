"""`bench serve`: flags under vLLM's names, start-up (port check, tokenizer, engine process), clean exits."""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer

from engine.cli_options import knob_option, with_engine_knobs

logger = logging.getLogger("servelab.server")


@with_engine_knobs
def serve(
    engine_knobs: dict[str, Any],
    model_tag: str | None = typer.Argument(None, metavar="MODEL", help="The model, as `vllm serve MODEL` takes it."),
    model: str | None = knob_option(
        "model", help="Model alias, HF dir, .gguf file or hub id (or the MODEL argument); default: smollm2-135m."
    ),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (0.0.0.0 exposes the server to the network)."),
    port: int = typer.Option(8000, help="Port to listen on; 0 picks a free one."),
    api_key: str | None = typer.Option(
        None, envvar="SERVELAB_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 and the tokenizer routes."
    ),
    served_model_name: str | None = typer.Option(None, help="Model name the API answers to (default: --model)."),
    max_request_bytes: int = typer.Option(16 * 1024 * 1024, help="Largest request body accepted (413 above)."),
    shutdown_timeout: float = typer.Option(5.0, help="Seconds in-flight requests get to finish on SIGINT/SIGTERM."),
    log_level: str = typer.Option("info", help="debug | info | warning | error"),
    metrics_require_api_key: bool = typer.Option(
        False, "--metrics-require-api-key", help="With --api-key: /metrics needs the key too (/health never does)."
    ),
    request_timeout: float | None = typer.Option(
        None, help="Seconds a request may take, body upload to last byte (504, or an error event mid-stream); "
        "default: no limit."
    ),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, /metrics)."""
    if model_tag is not None and model is not None and model_tag != model:
        raise typer.BadParameter(f"the positional model {model_tag!r} and --model {model!r} differ; give one")
    model = model_tag or model or "smollm2-135m"
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(f"--log-level must be debug, info, warning or error, got {log_level!r}")
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    code = run_server(
        {"model": model, **engine_knobs},
        host=host, port=port, api_key=api_key, served_model_name=served_model_name,
        max_request_bytes=max_request_bytes, shutdown_timeout=shutdown_timeout,
        metrics_require_api_key=metrics_require_api_key, request_timeout=request_timeout,
    )  # fmt: skip
    raise typer.Exit(code)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name) only accepts connections from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _fail(message: str) -> int:
    print(f"bench serve: error: {message}", file=sys.stderr, flush=True)
    return 1


def run_server(knobs: dict[str, Any], **server_options: Any) -> int:
    """Start everything, serve until a signal, shut down. Returns the process exit code."""
    import asyncio

    from engine.config import ConfigError, EngineConfig
    from engine.entrypoints.api_server import Server, ServerConfig, bind_socket, serve
    from engine.entrypoints.engine_client import EngineClient, EngineStartupError
    from engine.entrypoints.prometheus import ServerMetrics
    from engine.model_files import ModelNotFoundError
    from engine.tokenizer import get_tokenizer

    try:
        config = EngineConfig.from_kwargs(**knobs)
        server_config = ServerConfig(**server_options)
    except ModelNotFoundError as error:
        return _fail(f"cannot load model {knobs.get('model')!r}: {error}")
    except (ConfigError, ValueError) as error:
        return _fail(str(error))
    if server_config.api_key is None and not is_loopback(server_config.host):
        logger.warning("serving on %s without --api-key: anyone who can reach this port can use the server",
                       server_config.host)  # fmt: skip
    try:
        sock = bind_socket(server_config.host, server_config.port)
    except OSError as error:
        return _fail(f"{error}; is another server running? pick another --port")
    engine: EngineClient | None = None
    try:
        tokenizer = get_tokenizer(config.model_config.tokenizer or config.model_config.model)
        served_name = server_config.served_model_name or config.model_config.model
        metrics = ServerMetrics(served_name)
        engine = EngineClient(config, metrics)
        logger.info("loading %s in the engine process...", config.model_config.model)
        info = engine.start()
        metrics.set_engine_info(info.num_gpu_blocks, info.block_size, info.tensor_parallel_size)
        if engine.pid is not None:
            metrics.watch_engine_process(engine.pid)
        host, port = sock.getsockname()[:2]
        url_host = f"[{host}]" if ":" in host else host
        startup_line = (
            f"Serving {served_name} (model {info.model}, max_model_len {info.max_model_len}, tensor_parallel_size "
            f"{info.tensor_parallel_size}, KV cache {info.num_gpu_blocks} blocks x {info.block_size} = "
            f"{info.kv_capacity_tokens} tokens per rank, forward {info.forward_mode}) "
            f"at http://{url_host}:{port}"
        )
        server = Server(engine, tokenizer, server_config, metrics)
        asyncio.run(serve(server, sock, startup_line))
        return 0
    except (ModelNotFoundError, EngineStartupError) as error:
        return _fail(f"cannot load model {config.model_config.model!r}: {error}")
    finally:
        if engine is not None:
            engine.shutdown()
        sock.close()
