"""`bench compare`'s rounds: every target measured on every load point each round, the order alternating.

Round r measures the targets in order when r is even and in reverse when odd (ABBA...), and the loads likewise
(forward, then backward: sweep/run/repeats.py), so a drift of the machine over the job lands on every target
alike. `--together` keeps every server up for the whole job (started side by side) and interleaves target by
target at each load point (what `bench ab` did); one-at-a-time (the default on a CPU host, where an idle server
still shares the cores) starts each target for its share of a round and stops it after. Each target writes an
ordinary `bench sweep` run directory `<output_dir>/<name>` whose `--repeats` are the rounds, so `bench report`
and `bench gate` read it later; `--resume` keeps every finished (load, round) of every target.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from sweep.compare.targets import (
    LLAMA_CPP,
    LLAMA_CPP_HEALTH,
    SHARED_KNOBS,
    VLLM,
    Target,
    TargetError,
    check_targets,
    checkout,
    launch_template,
    resolve_ref,
    target_weights,
)
from sweep.run import results
from sweep.run.repeats import repeat_order
from sweep.run.vllm_engine import check_vllm_model, refused_vllm_knobs, vllm_command

if TYPE_CHECKING:
    from sweep.run.sweep_config import SweepConfig

DEFAULT_CONTEXT = 4096  # llama.cpp's n_ctx when neither --max-model-len nor both lengths are known


@dataclass
class CompareConfig:
    """`sweep`: the load, workload and SLO every target gets (`output_dir`: the compare's directory, `repeats`:
    the rounds, `engine_knobs`: the knobs every engine, ref and vllm target starts from); `together`: all servers
    up. `vllm_model`: the HF directory (or hub id) vllm targets load; `vllm_command`: their executable (default:
    the `make vllm` venv's, else `vllm` on PATH); both resolved on construction."""

    sweep: SweepConfig
    targets: list[Target] = field(default_factory=list)
    together: bool = False
    vllm_model: str | None = None
    vllm_command: str | None = None

    def __post_init__(self) -> None:
        check_targets(self.targets)
        if self.sweep.url is not None:
            raise TargetError("bench compare takes its servers from --target; a url: target names a running one")
        if self.sweep.max_load_under_slo:
            raise TargetError("bench compare measures fixed loads; it cannot search --max-load-under-slo")
        if any(t.kind == LLAMA_CPP for t in self.targets):
            from engine.model_files import gguf_source

            if gguf_source(self.sweep.model) is None:
                raise TargetError(f"a llama.cpp target serves a GGUF: --model is smollm2-135m or a .gguf path, "
                                  f"not {self.sweep.model!r}")  # fmt: skip
        for target in self.targets:
            if target.kind == "ref":
                resolve_ref(target.value)  # a bad ref fails before any server starts
        self._check_vllm()

    def _check_vllm(self) -> None:
        """A vllm target needs --vllm-model, an executable, and command-level knobs vLLM takes; the vLLM options
        without a vllm target are an error too."""
        if not any(t.kind == VLLM for t in self.targets):
            if self.vllm_model is not None or self.vllm_command is not None:
                raise TargetError("--vllm-model and --vllm-command are for a vllm target (--target NAME=vllm)")
            return
        if refused := refused_vllm_knobs(vllm_shared_knobs(self.sweep.engine_knobs)):
            raise TargetError(f"a vllm target gets the command's engine knobs, and vLLM does not take "
                              f"{'; '.join(refused)}: set them per target (engine:KNOB=V)")  # fmt: skip
        if self.vllm_model is None:
            raise TargetError("a vllm target needs --vllm-model DIR: the HF directory vLLM loads (`bench model "
                              "export-hf MODEL --output-dir DIR` writes one); --model stays the served name")
        try:
            self.vllm_model = check_vllm_model(self.vllm_model, option="--vllm-model")
            self.vllm_command = vllm_command(self.vllm_command, option="a vllm target")
        except ValueError as e:
            raise TargetError(str(e)) from None

    @property
    def rounds(self) -> int:
        return self.sweep.repeats

    def run_dir(self, target: Target) -> Path:
        return self.sweep.output_dir / target.name


def context_length(config: SweepConfig, knobs: dict) -> int:
    if knobs.get("max_model_len"):
        return int(knobs["max_model_len"])
    lengths = (config.workload.input_len, config.workload.output_len)
    return sum(lengths) + 64 if None not in lengths else DEFAULT_CONTEXT  # type: ignore[arg-type]


def vllm_shared_knobs(knobs: dict) -> dict:
    """The command's engine knobs a vllm target gets: all but the tokenizer (vLLM uses its directory's)."""
    return {k: v for k, v in knobs.items() if k not in SHARED_KNOBS}


def target_sweep(config: CompareConfig, target: Target, worktree: Path | None) -> SweepConfig:
    """The target's own `bench sweep` config: its run directory, its launch (or URL), its knobs, its weights."""
    base = config.sweep
    shared = vllm_shared_knobs(base.engine_knobs) if target.kind == VLLM else base.engine_knobs
    knobs = {**shared, **target.knobs}
    vllm = None
    if target.kind == VLLM:
        assert config.vllm_command is not None and config.vllm_model is not None  # resolved in __post_init__
        vllm = (config.vllm_command, config.vllm_model)
    template = launch_template(target, base.model, knobs, worktree, context_length(base, knobs), vllm)
    return replace(
        base,
        output_dir=config.run_dir(target),
        url=target.value + "/v1" if target.kind == "url" else None,
        engine_knobs={} if target.kind in ("url", LLAMA_CPP) else knobs,
        launch_template=template,
        health_path=LLAMA_CPP_HEALTH if target.kind == LLAMA_CPP else base.health_path,
        command=f"{base.command} [{target.name}: {target.describe()}]",
        weights=target_weights(target, base.model, knobs, config.vllm_model),
    )


def round_order(
    targets: list[Target], loads: list[float], rounds: int, together: bool
) -> Iterator[tuple[int, Target, list[float]]]:
    """(round, target, loads) in the order they are measured: together, one load at a time across the targets;
    one at a time, each target's loads of the round in one go. Targets and loads reverse on odd rounds."""
    if together:
        for r, value in repeat_order(loads, rounds):
            for target in targets if r % 2 == 0 else targets[::-1]:
                yield r, target, [value]
        return
    for r in range(rounds):
        for target in targets if r % 2 == 0 else targets[::-1]:
            yield r, target, loads if r % 2 == 0 else loads[::-1]


def _finished(config: SweepConfig, r: int, loads: list[float]) -> bool:
    repeats = config.output_dir / results.REPEATS
    return all((repeats / f"{config.label(v)}.r{r}.json").exists() for v in loads)


def _check_fresh(config: CompareConfig) -> None:
    """Without --resume, no target's directory may hold a measured run (caught before any server starts)."""
    if config.sweep.resume:
        return
    for target in config.targets:
        run = config.run_dir(target)
        if any(any((run / sub).glob("*.json")) for sub in (results.POINTS, results.REPEATS)):
            raise FileExistsError(f"{run} already holds a run; pass --resume to continue it or choose another "
                                  "--output-dir")  # fmt: skip


def run_compare(config: CompareConfig, console: Console | None = None) -> dict[str, Path]:
    """Measure every target over every round into `<output_dir>/<name>`; returns name -> run directory."""
    from sweep.run.sweeper import Sweeper, calibrate  # loads the HTTP client: only when measuring

    console = console or Console(stderr=True)
    _check_fresh(config)
    loads = list(config.sweep.values)
    with ExitStack() as stack:
        worktrees = {t.name: stack.enter_context(checkout(t.value)) for t in config.targets if t.kind == "ref"}
        sweeps = {t.name: target_sweep(config, t, worktrees.get(t.name)) for t in config.targets}
        if config.together:
            # The servers start side by side (spawned, then each waited for), after one machine calibration that
            # every target records: measured while another server starts, it would measure that start-up.
            calibration = calibrate(console) if config.sweep.calibration else None
            sweepers = {}
            for target in config.targets:
                console.print(f"[bold]{target.name}[/bold]: starting {target.describe()}")
                sweepers[target.name] = Sweeper(sweeps[target.name], console, calibration)
                stack.push(sweepers[target.name])  # stopped on the way out, whatever happens from here
                sweepers[target.name].open(wait=False)
            for sweeper in sweepers.values():
                sweeper.wait_ready()
            for r, target, values in round_order(config.targets, loads, config.rounds, together=True):
                console.print(f"[dim]{target.name}[/dim]", end=" ")
                sweepers[target.name].measure_repeat(values[0], r)
        else:
            opened: set[str] = set()
            for r, target, values in round_order(config.targets, loads, config.rounds, together=False):
                sweep = sweeps[target.name]
                if config.sweep.resume and _finished(sweep, r, values):
                    console.print(f"[dim]{target.name} round {r}: already measured, kept[/dim]")
                    continue
                stored = config.sweep.resume and (sweep.output_dir / results.CONFIG).exists()
                first = target.name not in opened and not stored
                sweep = replace(sweep, resume=not first, calibration=sweep.calibration and first)
                opened.add(target.name)
                console.print(f"[bold]round {r}: {target.name}[/bold] ({target.describe()})")
                with Sweeper(sweep, console) as sweeper:
                    for value in values:
                        sweeper.measure_repeat(value, r)
    return {t.name: config.run_dir(t) for t in config.targets}
