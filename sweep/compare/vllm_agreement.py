"""`bench lab vllm-agreement`: our client and vLLM's own (`vllm bench serve`) against one server, interleaved.

Users compare servelab's figures with vLLM's, so both clients must measure the same thing. Each round runs, at
every concurrency, `vllm bench serve` and `bench sweep` one after the other against the same server, in ABBA
order (vLLM's client first on even rounds, ours first on odd ones, so a drift of the machine lands on both), with
the same lengths (random tokens, fixed input and output length, ignore-EOS, greedy) and the server's prefix cache
reset before each run (our `--reset-prefix-cache`; a POST /reset_prefix_cache before vLLM's). Both clients send
one unmeasured request first (vLLM's "initial test run", our `--num-warmups 1`). Every run gets its own seed.

Per concurrency, each client's figure is the median over the rounds of its runs' median TTFT, median TPOT and
output throughput (vLLM's field names, and ours are the same); the agreement is ours / vLLM's - 1, within
`tolerance` or not. The command lines, every run's figures and the verdicts go to agreement.json.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FIGURES = ("median_ttft_ms", "median_tpot_ms", "output_throughput")
CLIENTS = ("vllm", "servelab")
VLLM_BACKENDS = {"completions": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions")}


class AgreementError(ValueError):
    """A bad option or a client run that did not finish every request (the message says which and where)."""


@dataclass
class AgreementConfig:
    """`url`: the server's root (no /v1); `vllm`: the vLLM executable whose `bench serve` is run; `tolerance`:
    the largest |ours / vLLM's - 1| that agrees (0.03: 3 %)."""

    url: str
    model: str
    tokenizer: str
    output_dir: Path
    vllm: str = "vllm"
    endpoint: str = "completions"
    concurrencies: list[int] = field(default_factory=lambda: [1, 16])
    num_prompts: int = 16
    input_len: int = 256
    output_len: int = 128
    rounds: int = 2
    seed: int = 0
    tolerance: float = 0.03
    api_key: str | None = None

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/").removesuffix("/v1")
        if self.endpoint not in VLLM_BACKENDS:
            raise AgreementError(f"--endpoint is completions or chat, not {self.endpoint!r}")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise AgreementError(f"--concurrency needs positive values, got {self.concurrencies}")
        for name in ("num_prompts", "input_len", "output_len", "rounds"):
            if getattr(self, name) < 1:
                raise AgreementError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.output_len < 2:
            raise AgreementError("--output-len must be >= 2: TPOT needs a second token")
        if not 0 < self.tolerance < 1:
            raise AgreementError(f"--tolerance is a fraction in (0, 1), got {self.tolerance}")
        if not self.vllm.strip() or shutil.which(shlex.split(self.vllm)[0]) is None:
            raise AgreementError(f"no vLLM executable {self.vllm!r}; `make vllm` installs .venv-vllm/bin/vllm")


def vllm_command(cfg: AgreementConfig, concurrency: int, seed: int, result_dir: Path) -> list[str]:
    backend, path = VLLM_BACKENDS[cfg.endpoint]
    return [
        *shlex.split(cfg.vllm), "bench", "serve", "--backend", backend, "--base-url", cfg.url, "--endpoint", path,
        "--model", cfg.model, "--tokenizer", cfg.tokenizer, "--dataset-name", "random",
        "--random-input-len", str(cfg.input_len), "--random-output-len", str(cfg.output_len),
        "--random-range-ratio", "0", "--num-prompts", str(cfg.num_prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--save-result", "--save-detailed",
        "--result-dir", str(result_dir), "--result-filename", "result.json",
    ]  # fmt: skip


def servelab_command(cfg: AgreementConfig, concurrency: int, seed: int, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "cli", "sweep", "--url", cfg.url + "/v1", "--model", cfg.model,
        "--tokenizer", cfg.tokenizer, "--endpoint", cfg.endpoint, "--workload", "random",
        "--input-len", str(cfg.input_len), "--output-len", str(cfg.output_len), "--random-range-ratio", "0",
        "--num-prompts", str(cfg.num_prompts), "--concurrency", str(concurrency), "--ignore-eos",
        "--temperature", "0", "--seed", str(seed), "--num-warmups", "1", "--reset-prefix-cache", "--no-report",
        "--no-calibration", "--output-dir", str(run_dir), *(["--api-key", cfg.api_key] if cfg.api_key else []),
    ]  # fmt: skip


def reset_prefix_cache(cfg: AgreementConfig) -> bool:
    """The sweep client's POST /reset_prefix_cache (sweep.point.client), for the runs of vLLM's client."""
    from sweep.point.client import ClientConfig, make_session
    from sweep.point.client import reset_prefix_cache as post_reset

    async def reset() -> bool:
        async with make_session() as session:
            return await post_reset(session, ClientConfig(url=cfg.url + "/v1", model=cfg.model, api_key=cfg.api_key))

    return asyncio.run(reset())


def read_vllm(result_dir: Path, num_prompts: int) -> dict[str, Any]:
    data = json.loads((result_dir / "result.json").read_text())
    if data.get("completed") != num_prompts:
        raise AgreementError(f"vllm bench serve completed {data.get('completed')} of {num_prompts} requests; "
                             f"see {result_dir}")  # fmt: skip
    return {key: float(data[key]) for key in FIGURES}


def read_servelab(run_dir: Path, num_prompts: int) -> dict[str, Any]:
    """The figures of the one point a run of `servelab_command` measured (whatever its label)."""
    (point_file,) = (run_dir / "points").glob("*.json")
    point = json.loads(point_file.read_text())
    if point.get("completed") != num_prompts:
        raise AgreementError(f"bench sweep completed {point.get('completed')} of {num_prompts} requests; see "
                             f"{run_dir}")  # fmt: skip
    return {key: float(point[key]) for key in FIGURES}


def run_client(command: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise AgreementError(f"{command[0]} exited with code {done.returncode}; log {log}:\n{tail}")


def summarise(cfg: AgreementConfig, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and figure: each client's median over the rounds, the agreement and its verdict."""
    rows = []
    for c in cfg.concurrencies:
        for key in FIGURES:
            value = {
                client: statistics.median(r["figures"][key] for r in runs if r["client"] == client
                                          and r["concurrency"] == c)  # fmt: skip
                for client in CLIENTS
            }
            difference = value["servelab"] / value["vllm"] - 1 if value["vllm"] else float("inf")
            rows.append({"concurrency": c, "figure": key, **value, "difference": difference,
                         "agrees": abs(difference) <= cfg.tolerance})  # fmt: skip
    return rows


def run_agreement(cfg: AgreementConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every round's runs (interleaved), then agreement.json; returns what it wrote."""
    from sweep.run.run_info import check_reachable

    check_reachable(cfg.url + "/v1", cfg.api_key)  # before any file is written
    if (cfg.output_dir / "agreement.json").exists():
        raise AgreementError(f"{cfg.output_dir} already holds an agreement study; choose another --output-dir")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    total = cfg.rounds * len(cfg.concurrencies) * len(CLIENTS)
    for r in range(cfg.rounds):
        for j, c in enumerate(cfg.concurrencies):
            for client in CLIENTS if r % 2 == 0 else CLIENTS[::-1]:
                seed = cfg.seed + 1000 * r + j  # a fresh seed per (round, load); both clients of a pair share it
                where = cfg.output_dir / f"r{r}" / f"c{c:04d}" / client
                say(f"[{len(runs) + 1}/{total}] round {r}, concurrency {c}: {client} (log {where}.log)")
                if client == "vllm":
                    reset = reset_prefix_cache(cfg)
                    command = vllm_command(cfg, c, seed, where)
                    run_client(command, where.with_suffix(".log"))
                    figures = read_vllm(where, cfg.num_prompts)
                else:
                    reset = None  # the sweep resets it itself and records whether that worked
                    command = servelab_command(cfg, c, seed, where)
                    run_client(command, where.with_suffix(".log"))
                    figures = read_servelab(where, cfg.num_prompts)
                runs.append({"round": r, "concurrency": c, "client": client, "seed": seed, "command":
                             shlex.join(command), "prefix_cache_reset": reset, "figures": figures})  # fmt: skip
    result = {"config": {**asdict(cfg), "output_dir": str(cfg.output_dir), "api_key": None},
              "runs": runs, "agreement": summarise(cfg, runs)}  # fmt: skip
    (cfg.output_dir / "agreement.json").write_text(json.dumps(result, indent=2))
    return result


def agreement_table(result: dict[str, Any]) -> str:
    """The verdicts as a Markdown table."""
    tolerance = result["config"]["tolerance"]
    lines = ["| concurrency | figure | vllm bench serve | bench sweep | difference | within "
             f"{tolerance:.0%} |", "|---:|---|---:|---:|---:|---|"]  # fmt: skip
    for row in result["agreement"]:
        lines.append(f"| {row['concurrency']} | {row['figure']} | {row['vllm']:.2f} | {row['servelab']:.2f} | "
                     f"{row['difference']:+.1%} | {'yes' if row['agrees'] else 'NO'} |")  # fmt: skip
    return "\n".join(lines)
