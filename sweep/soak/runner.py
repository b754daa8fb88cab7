"""`bench soak`: a long mixed load against any OpenAI endpoint (valid, cancelled, disconnected and malformed
requests), /metrics sampled alongside, one row per request, windows over time, a verdict.

Every request has a timeout, so a hung server shows up as timeouts. Rows and samples are appended as they come;
the summary (windows + verdict) and the report page are written at the end with write-temp-then-rename.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from sweep.point.client import SSEParser
from sweep.run.results import write_atomic
from sweep.soak.cases import SoakCase, SoakMix, is_openai_error_body, make_case
from sweep.soak.report import SoakBounds, summarize, write_report

REQUESTS_FILE = "requests.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"

# Prometheus series read from /metrics (vLLM's names; the *_resident_memory_bytes series are summed).
_GAUGES = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
}
_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


@dataclass
class SoakConfig:
    url: str  # base URL ending in /v1
    output_dir: Path
    duration_s: float = 600.0
    num_requests: int | None = None  # stop after this many (whichever of this and duration comes first)
    concurrency: int = 16
    mix: SoakMix = field(default_factory=SoakMix)
    model: str | None = None  # default: the first id of /v1/models
    api_key: str | None = None
    max_model_len: int | None = None  # default: /v1/models' max_model_len, else 2048
    max_tokens: int = 64  # most valid requests draw max_tokens in [1, this]; mix.long_output go to the limit
    request_timeout_s: float = 60.0
    num_windows: int = 5
    metrics_interval_s: float = 1.0
    oversized_bytes: int = 17 * 2**20
    seed: int = 0
    bounds: SoakBounds = field(default_factory=SoakBounds)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        checks = [
            ("--duration", self.duration_s > 0), ("--concurrency", self.concurrency >= 1),
            ("--num-requests", self.num_requests is None or self.num_requests >= 1),
            ("--max-tokens", self.max_tokens >= 1), ("--request-timeout", self.request_timeout_s > 0),
            ("--num-windows", self.num_windows >= 2), ("--metrics-interval", self.metrics_interval_s > 0),
            ("--oversized-bytes", self.oversized_bytes >= 1), ("--max-model-len", (self.max_model_len or 1) >= 1),
        ]  # fmt: skip
        for flag, ok in checks:
            if not ok:
                raise ValueError(f"{flag} is out of range (see --help)")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must be an http(s) URL ending in /v1, got {self.url!r}")

    @property
    def root(self) -> str:
        """The server root (the base URL without /v1), where /metrics lives."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


def parse_metrics(text: str) -> dict[str, float]:
    """The soak's gauges from Prometheus text: KV usage, running/waiting, and resident memory summed over every
    `*process_resident_memory_bytes` series (the API process and, on our server, the engine process)."""
    values: dict[str, float] = {}
    memory = None
    for line in text.splitlines():
        match = _SAMPLE_LINE.match(line)
        if match is None:
            continue
        name, value = match.group(1), float(match.group(3))
        if name.endswith("process_resident_memory_bytes"):
            memory = (memory or 0.0) + value
        for key, names in _GAUGES.items():
            if name in names:
                values[key] = values.get(key, 0.0) + value
    if memory is not None:
        values["resident_memory_bytes"] = memory
    return values


class SoakRun:
    def __init__(self, config: SoakConfig, progress: Callable[[str], None] = print) -> None:
        self.config = config
        self.progress = progress
        self.rng = random.Random(config.seed)
        self.rows: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.start = 0.0
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.metrics_available = True

    # ------------------------------------------------------------------------------------------- setup

    async def discover(self, session: aiohttp.ClientSession) -> None:
        """Model name and context length from /v1/models; raises ConnectionError when the server is unusable."""
        try:
            async with session.get(self.config.url + "/models", headers=self.headers,
                                   timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s)) as response:
                if response.status != 200:
                    raise ConnectionError(f"GET {self.config.url}/models answered {response.status}")
                cards = (await response.json()).get("data") or []
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
            raise ConnectionError(f"cannot reach {self.config.url}/models: {type(error).__name__}: {error}") from error
        if self.config.model is None:
            if not cards:
                raise ConnectionError(f"{self.config.url}/models lists no model; pass --model")
            self.config.model = cards[0]["id"]
        if self.config.max_model_len is None:
            card = next((c for c in cards if c.get("id") == self.config.model), cards[0] if cards else {})
            self.config.max_model_len = int(card.get("max_model_len") or 2048)

    # ------------------------------------------------------------------------------------------- one request

    async def send(self, session: aiohttp.ClientSession, case: SoakCase) -> dict[str, Any]:
        """Send `case`; never raises. The row's `outcome` is ok | cancelled | disconnected | expected_4xx, or an
        unexpected class: http_5xx | bad_4xx | accepted_malformed | wrong_output | reset | timeout."""
        row: dict[str, Any] = {"kind": case.kind, "malformed_kind": case.malformed_kind, "path": case.path,
                               "stream": case.stream, "max_tokens": case.max_tokens,
                               "start": time.monotonic() - self.start}  # fmt: skip
        begin = time.perf_counter()
        try:
            if case.kind == "disconnect":
                await asyncio.wait_for(self._disconnect(case), self.config.request_timeout_s)
                row["outcome"] = "disconnected"
            else:
                timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
                async with session.post(self.config.root + case.path, data=case.body,
                                        headers={**case.headers, **self.headers}, timeout=timeout) as response:
                    row["status"] = response.status
                    await self._read(response, case, row, begin)
        except asyncio.TimeoutError:
            row["outcome"], row["error"] = "timeout", f"no complete answer within {self.config.request_timeout_s} s"
        except (aiohttp.ClientError, OSError) as error:
            if case.malformed_kind == "oversized_body" and isinstance(error, aiohttp.ClientOSError):
                # the server refused the body and closed while it was still being sent: that is a refusal
                row["outcome"], row["error"] = "expected_4xx", f"connection closed on upload: {error}"
            else:
                row["outcome"], row["error"] = "reset", f"{type(error).__name__}: {error}"
        row["latency"] = time.perf_counter() - begin
        return row

    async def _disconnect(self, case: SoakCase) -> None:
        """Write the whole request on a raw connection and close it before reading a byte."""
        parts = urlsplit(self.config.root)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        headers = {**case.headers, **self.headers, "Host": parts.netloc, "Content-Length": str(len(case.body))}
        head = f"POST {case.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode() + case.body)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def _read(self, response: aiohttp.ClientResponse, case: SoakCase, row: dict[str, Any], begin: float) -> None:
        status = response.status
        if case.kind == "malformed":
            payload = await _json_or_none(response)
            if 400 <= status < 500:
                good = is_openai_error_body(payload)
                row["outcome"] = "expected_4xx" if good else "bad_4xx"
                if not good:
                    row["error"] = f"{status} without an OpenAI error body"
            elif 200 <= status < 300 and case.accept_2xx:
                row["outcome"] = "ok"
            elif status >= 500:
                row["outcome"], row["error"] = "http_5xx", f"{status}: {str(payload)[:200]}"
            else:
                row["outcome"], row["error"] = "accepted_malformed", f"{status} for a {case.malformed_kind} request"
            return
        if status != 200:
            payload = await _json_or_none(response)
            row["outcome"] = "http_5xx" if status >= 500 else "bad_4xx"
            row["error"] = f"{status}: {str(payload)[:200]}"
            return
        if not case.stream:
            payload = await response.json()
            row["completion_tokens"] = (payload.get("usage") or {}).get("completion_tokens")
            row["finish_reason"] = (payload.get("choices") or [{}])[0].get("finish_reason")
            self._check_tokens(case, row)
            return
        await self._read_stream(response, case, row, begin)

    async def _read_stream(self, response: aiohttp.ClientResponse, case: SoakCase, row: dict[str, Any],
                           begin: float) -> None:  # fmt: skip
        parser, chunks, token_times, done = SSEParser(), 0, [], False
        async for raw in response.content.iter_any():
            now = time.perf_counter()
            for data in parser.feed(raw):
                if data.strip() == "[DONE]":
                    done = True
                    continue
                message = json.loads(data)
                if "error" in message and not message.get("choices"):
                    row["outcome"], row["error"] = "http_5xx", f"error event: {str(message['error'])[:200]}"
                    return
                if message.get("usage"):
                    row["completion_tokens"] = message["usage"].get("completion_tokens")
                for choice in message.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        token_times.append(now)
                    if choice.get("finish_reason"):
                        row["finish_reason"] = choice["finish_reason"]
                if message.get("choices"):
                    chunks += 1
                if case.kind == "cancel" and chunks >= case.cancel_after_chunks:
                    row["outcome"] = "cancelled"
                    return  # leaving the `async with` closes the connection mid-stream
        if token_times:
            row["ttft"] = token_times[0] - begin
            if len(token_times) > 1:
                row["tpot"] = (token_times[-1] - token_times[0]) / (len(token_times) - 1)
        if case.kind == "cancel":
            row["outcome"] = "ok"  # the stream ended before the chosen cancel point
        elif not done:
            row["outcome"], row["error"] = "wrong_output", "the stream ended without [DONE]"
        else:
            self._check_tokens(case, row)

    @staticmethod
    def _check_tokens(case: SoakCase, row: dict[str, Any]) -> None:
        tokens, reason = row.get("completion_tokens"), row.get("finish_reason")
        if tokens == case.max_tokens and reason == "length":
            row["outcome"] = "ok"
        else:
            row["outcome"] = "wrong_output"
            row["error"] = f"{tokens} completion tokens (finish_reason {reason}), expected {case.max_tokens}, length"

    # ------------------------------------------------------------------------------------------- load

    async def sample_metrics(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        if not self.metrics_available:
            return None
        try:
            async with session.get(self.config.root + "/metrics", headers=self.headers,
                                   timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s)) as response:
                if response.status == 404:
                    self.metrics_available = False
                    return None
                text = await response.text()
                values = parse_metrics(text) if response.status == 200 else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
            values = {"error": f"{type(error).__name__}: {error}"}
        sample = {"time": time.monotonic() - self.start, "completed": len(self.rows), **values}
        self.samples.append(sample)
        return sample

    async def _sampler(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_metrics(session)
            try:
                await asyncio.wait_for(stop.wait(), self.config.metrics_interval_s)
            except asyncio.TimeoutError:
                pass

    async def _worker(self, session: aiohttp.ClientSession, deadline: float, out: Any) -> None:
        config = self.config
        assert config.model is not None and config.max_model_len is not None
        while time.monotonic() < deadline:
            if config.num_requests is not None and self.launched >= config.num_requests:
                return
            self.launched += 1
            case = make_case(self.rng, config.mix, config.model, config.max_model_len, config.max_tokens,
                             config.oversized_bytes)  # fmt: skip
            row = await self.send(session, case)
            row["index"] = len(self.rows)
            self.rows.append(row)
            out.write(json.dumps(row) + "\n")
            if len(self.rows) % self.report_every == 0:
                bad = sum(r["outcome"] not in _EXPECTED for r in self.rows)
                self.progress(f"{len(self.rows)} requests, {bad} unexpected, {time.monotonic() - self.start:.0f} s")

    async def wait_idle(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        """After the load: poll /metrics until KV usage and running requests are 0 (or the drain timeout)."""
        deadline = time.monotonic() + self.config.bounds.drain_timeout_s
        sample = None
        while True:
            sample = await self.sample_metrics(session)
            if sample is None:
                return None
            idle = sample.get("kv_cache_usage", 0.0) == 0.0 and sample.get("num_requests_running", 0.0) == 0.0
            if idle or time.monotonic() > deadline:
                return sample
            await asyncio.sleep(0.5)

    async def run(self) -> dict[str, Any]:
        config = self.config
        config.output_dir.mkdir(parents=True, exist_ok=True)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:
            await self.discover(session)
            write_atomic(config.output_dir / "config.json", json.dumps(_config_dict(config), indent=2))
            self.start = time.monotonic()
            self.launched = 0
            self.report_every = max(50, (config.num_requests or 1000) // 20)
            stop = asyncio.Event()
            sampler = asyncio.create_task(self._sampler(session, stop))
            deadline = self.start + config.duration_s
            with open(config.output_dir / REQUESTS_FILE, "w") as out:
                await asyncio.gather(*(self._worker(session, deadline, out) for _ in range(config.concurrency)))
            load_end = time.monotonic() - self.start
            stop.set()
            await sampler
            final = await self.wait_idle(session)
        with open(config.output_dir / METRICS_FILE, "w") as out:
            out.writelines(json.dumps(s) + "\n" for s in self.samples)
        summary = summarize(self.rows, self.samples, final, load_end, config.num_windows, config.bounds)
        summary["config"] = _config_dict(config)
        write_atomic(config.output_dir / SUMMARY_FILE, json.dumps(summary, indent=2))
        write_report(summary, config.output_dir / "report.html")
        return summary


_EXPECTED = ("ok", "cancelled", "disconnected", "expected_4xx")


async def _json_or_none(response: aiohttp.ClientResponse) -> Any:
    try:
        return json.loads(await response.read())
    except (ValueError, UnicodeDecodeError):
        return None


def _config_dict(config: SoakConfig) -> dict[str, Any]:
    data = asdict(config)
    data["output_dir"] = str(config.output_dir)
    data.pop("api_key", None)  # never written to disk
    return data


def run_soak(config: SoakConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    return asyncio.run(SoakRun(config, progress).run())
