"""A whole simulated sweep: the profile, the engine config, every point, the run directory (`bench simulate`).

The engine config is built exactly as a launched engine builds it (`EngineConfig.from_kwargs` with the model and
knobs). The profile fixes what it measured: model, dtype, quantization, kv_cache_dtype, device and tensor-parallel
size; a knob that contradicts it is an error, and so is a speculative_config (the simulation does not model
speculation). The KV cache holds `--num-gpu-blocks-override` blocks, else `--kv-cache-memory-bytes` at the
profile's bytes per token, else what the profiled engine's budget held (`kv_cache.tokens` in the profile), capped
as the model runner caps it at max_num_seqs sequences of max_model_len.
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from sweep.point.benchmark_metrics import calculate_metrics, percentile_name
from sweep.point.runner import PointSpec, schedule
from sweep.run import results
from sweep.run.load_config import LoadConfig
from sweep.simulate.point import SimulatedRequest, prompt_token_ids, simulate_point

PROFILE_KIND = "servelab-step-profile"
PROFILE_FIXED_KNOBS = ("model", "dtype", "quantization", "kv_cache_dtype", "device", "tensor_parallel_size")


@dataclass
class Profile:
    """A `bench model profile` file: the cost model plus what it was measured on."""

    path: Path
    data: dict[str, Any]
    cost_model: Any  # engine.executor.cost_model.CostModel

    @property
    def knobs(self) -> dict[str, Any]:
        return dict(self.data.get("knobs") or {})

    @property
    def kv_cache_tokens(self) -> int | None:
        return (self.data.get("kv_cache") or {}).get("tokens")


def load_profile(path: str | Path) -> Profile:
    from engine.executor.cost_model import CostModel

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--profile {path}: no such file; make one with `bench model profile`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--profile {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ValueError(f"--profile {path}: not a `bench model profile` file (kind must be {PROFILE_KIND!r})")
    try:
        cost_model = CostModel.from_dict(data["cost_model"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"--profile {path}: cost_model: {e}") from None
    return Profile(path, data, cost_model)


@dataclass
class SimulateConfig(LoadConfig):
    """`bench simulate`'s run: `LoadConfig`'s load, workload and SLO (concurrency or rate mode), on a profile."""

    output_dir: Path
    profile: Profile
    engine_knobs: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    cost: Any = None  # sweep.run.cost.CostConfig: points get a simulated cost_per_million_output_tokens
    command: str = field(default_factory=lambda: shlex.join(["bench", *sys.argv[1:]]))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.output_dir = Path(self.output_dir)
        for name in PROFILE_FIXED_KNOBS:
            given, profiled = self.engine_knobs.get(name), self.profile.knobs.get(name)
            if given is not None and profiled is not None and given != profiled:
                raise ValueError(
                    f"--{name.replace('_', '-')} {given}: the profile {self.profile.path} was measured with "
                    f"{name}={profiled}; run `bench model profile` for that configuration"
                )

    @property
    def knobs(self) -> dict[str, Any]:
        """The engine's knobs: the profile's fixed ones, then the user's."""
        fixed = {k: v for k, v in self.profile.knobs.items() if k in PROFILE_FIXED_KNOBS and v is not None}
        return {**fixed, **self.engine_knobs}


def engine_config(config: SimulateConfig) -> tuple[Any, int]:
    """The EngineConfig a launched engine would build, and the simulated KV cache's size in blocks."""
    from engine.config import EngineConfig
    from engine.kv_cache_manager import cdiv

    engine = EngineConfig.from_kwargs(**config.knobs)
    if engine.speculative_config is not None:
        raise ValueError(
            "the simulation does not model speculative decoding (its tokens are not the model's, so draft "
            "acceptance would be made up, and draft-model passes are not costed); drop --speculative-config"
        )
    cc, sc = engine.cache_config, engine.scheduler_config
    max_model_len = engine.model_config.max_model_len
    assert max_model_len is not None
    if cc.num_gpu_blocks_override is not None:
        return engine, cc.num_gpu_blocks_override
    tokens = config.profile.kv_cache_tokens
    bytes_per_token = (config.profile.data.get("kv_cache") or {}).get("bytes_per_token")
    if cc.kv_cache_memory_bytes is not None:
        if not bytes_per_token:
            raise ValueError(f"the profile {config.profile.path} has no kv_cache.bytes_per_token for "
                             "--kv-cache-memory-bytes; pass --num-gpu-blocks-override")  # fmt: skip
        tokens = cc.kv_cache_memory_bytes // bytes_per_token
    if not tokens:
        raise ValueError(f"the profile {config.profile.path} has no kv_cache.tokens; pass --num-gpu-blocks-override")
    num_blocks = min(tokens // cc.block_size, sc.max_num_seqs * cdiv(max_model_len, cc.block_size))
    if num_blocks * cc.block_size < max_model_len:
        raise ValueError(
            f"the profiled KV cache ({tokens} tokens) holds less than one sequence of max_model_len={max_model_len}"
        )
    return engine, num_blocks


def build_requests(config: SimulateConfig, n: int, salt: str) -> tuple[list[SimulatedRequest], Any]:
    """The point's requests from the workload (fitted to max_model_len as `bench sweep` fits them). A text workload
    (`prompts:FILE`, a shipped prompt set, copy-heavy) gives the lengths of its text in the target's tokenizer, as
    `bench sweep` measures them (salt and endpoint's chat template included, not fitted); the simulated engine sees
    token ids of those lengths, not the words."""
    import workloads
    from sweep.point.prompts import is_trace_file, workload_specs

    w = config.workload
    tokenizer = None
    text = workloads.is_text_workload(w.workload)
    if text or is_trace_file(w):
        from engine.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(config.knobs.get("tokenizer") or config.knobs["model"])
    if text:
        from workloads.prompt_files import is_prompt_workload, read_prompt_file
        from workloads.text_workloads import text_prompts

        endpoint = w.endpoint  # bench simulate has no --endpoint: a file of chats is measured as chat sends it
        if is_prompt_workload(w.workload) and read_prompt_file(w.workload).has_chats:
            endpoint = "chat"
        elif any(f.has_chats for f in workloads.text_mixtures.prompt_components(w.workload)):
            endpoint = "chat"
        specs, fit_report = text_prompts(w.workload, endpoint, w.output_len, tokenizer, n, w.seed, salt)[0], None
    else:
        specs, fit_report = workload_specs(w, n, w.seed, tokenizer)
    requests = [
        SimulatedRequest(i, prompt_token_ids(s, i, salt), s.output_len, s.request_class) for i, s in enumerate(specs)
    ]
    return requests, fit_report


class Simulator:
    """Runs `bench simulate`'s points into a run directory, one fresh engine core per point."""

    def __init__(self, config: SimulateConfig, console: Console | None = None) -> None:
        from sweep.point.prompts import check_slo_classes

        self.config = config
        self.console = console or Console(stderr=True)
        self.engine_config, self.num_blocks = engine_config(config)
        build_requests(config, 1, salt="check")  # a bad workload fails before any file exists
        check_slo_classes(config.workload, config.slo, config.num_prompts)  # ... and an SLO class it lacks
        self.salt = uuid.uuid4().hex[:12]
        previous = config.output_dir / results.CONFIG
        if config.resume and previous.exists():
            self.salt = json.loads(previous.read_text()).get("workload", {}).get("salt", self.salt)
        self.writer = results.open_run(config.output_dir, self.run_config(), resume=config.resume)

    def run_config(self) -> dict[str, Any]:
        from sweep.run.run_info import run_config

        cfg = self.config
        target = {
            "url": None,
            "model": cfg.knobs.get("model"),
            "tokenizer": cfg.knobs.get("tokenizer") or cfg.knobs.get("model"),
            "backend": "simulated",
            "engine_knobs": dict(cfg.engine_knobs),
            "launch_template": None,
            "profile": str(cfg.profile.path),
            "profile_machine": cfg.profile.data.get("machine"),
            "cost_model": cfg.profile.cost_model.to_dict(),  # serving: step and hand-over terms
            "num_gpu_blocks": self.num_blocks,
        }
        sweep = {"ignore_eos": True, "temperature": 0.0}
        return run_config(cfg, cfg.output_dir, self.salt, cfg.command, target, sweep, simulated=True)

    def point_spec(self, value: float) -> PointSpec:
        return self.config.point_spec(value)

    def measure(self, value: float) -> dict[str, Any]:
        """Simulate one point (or reload it on resume) and return its point dict."""
        from engine.engine_core import EngineCore
        from engine.executor.simulated import SimulatedExecutor

        cfg, spec = self.config, self.point_spec(value)
        if spec.label in self.writer.finished_labels():
            return self.writer.load_point(spec.label)
        requests, fit_report = build_requests(cfg, spec.pool_size, salt=f"{self.salt}-{spec.label}")
        offsets = schedule(spec, requests, cfg.workload.seed)  # type: ignore[arg-type]
        max_model_len = self.engine_config.model_config.max_model_len
        executor = SimulatedExecutor(cfg.profile.cost_model, self.num_blocks, max_model_len)
        core = EngineCore(self.engine_config, executor=executor)
        hand_over = cfg.profile.cost_model.hand_over
        simulated = simulate_point(
            core, executor, requests, offsets, spec.concurrency, spec.duration, hand_over=hand_over
        )
        if hand_over is not None:
            simulated.stats["hand_over"] = dict(zip(("per_request_s", "per_prompt_token_s"), hand_over, strict=True))
        metrics = calculate_metrics(
            simulated.records, simulated.duration, cfg.percentiles, cfg.slo, spec.concurrency is not None
        )
        point: dict[str, Any] = {
            "label": spec.label,
            "max_concurrency": spec.concurrency,
            "request_rate": spec.rate,
            "burstiness": spec.burstiness,
            "num_prompts": len(simulated.records),
            **metrics,
            "simulated": True,
            "simulation": simulated.stats,
        }
        if cfg.cost is not None:
            from sweep.run.cost import cost_fields, occupied_devices

            devices = occupied_devices(cfg.knobs)  # the profile's device and parallel sizes, then the user's
            point.update(cost_fields(simulated.records, simulated.duration, cfg.slo, cfg.cost, source="simulated",
                                     devices_used=devices))
        if fit_report is not None:
            point["fidelity"] = {"fit": asdict(fit_report)}
        self.writer.write_point(point, [r.to_row(spec.label) for r in simulated.records])
        self._print_row(point)
        return point

    def _print_row(self, point: dict[str, Any]) -> None:
        p = percentile_name(max(self.config.percentiles))
        sim = point["simulation"]
        attain = point.get("slo_attainment")
        self.console.print(
            f"{point['label']:>9} done {point['completed']:>5} fail {point['failed']:>4}  "
            f"out {point['output_throughput']:>8.1f} tok/s  TTFT p50 {point['median_ttft_ms']:>8.1f} "
            f"{p} {point[f'{p}_ttft_ms']:>8.1f}  TPOT p50 {point['median_tpot_ms']:>7.2f} ms  "
            f"attain {'-' if attain is None else f'{attain:.3f}'}  | {sim['steps']} steps, "
            f"{sim['mean_running_seqs']:.1f} running, scheduler {sim['scheduler_cpu_us_per_step_p50']:.0f} us/step "
            f"(p50), {point['completed'] / max(sim['cpu_s'], 1e-9):.0f} req per CPU-s",
            soft_wrap=True,
        )

    def run(self) -> list[dict[str, Any]]:
        cfg = self.config
        if not cfg.max_load_under_slo:
            return [self.measure(value) for value in cfg.values]
        from sweep.run.search import SearchConfig, max_load_under_slo, point_counts

        # a point estimate (no confidence level): each load is simulated once
        search = SearchConfig(mode=cfg.mode, start=cfg.values[0], attainment=cfg.attainment, max_value=cfg.max_load)
        result = max_load_under_slo(search, lambda value, _: point_counts(self.measure(value)))
        labels = [cfg.label(p.value) for p in result.probes]
        self.writer.write_search({**result.to_dict(), "labels": labels, "slo": cfg.slo})
        unit = "streams" if cfg.mode == "concurrency" else "req/s"
        self.console.print(
            f"max load under SLO (simulated): {result.best:g} {unit}, bracket {result.bracket}"
            if result.best is not None
            else f"no load met attainment >= {cfg.attainment} (simulated); smallest failing: {result.bracket[1]}"
        )
        return [self.writer.load_point(label) for label in sorted(self.writer.finished_labels())]


def run_simulation(config: SimulateConfig, console: Console | None = None) -> Path:
    Simulator(config, console).run()
    return config.output_dir
