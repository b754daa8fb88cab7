"""The tuner's search space over the engine knobs, generated from the engine config fields (engine/config.py).

A knob whose field declares a `SearchRange` is searched by default; a space file can search, pin or drop any
engine knob, and a name that is not one is an error listing the valid names. The fields of `speculative_config`
are knobs of their own (`speculative_config.num_speculative_tokens`, ...; sweep/tune/speculative_space.py) that
`SearchSpace.suggest` assembles into the engine's JSON. Values the device or workload cannot use are dropped up
front by the device filters (keyed by knob name) and the reason is kept in `SearchSpace.notes`, which the CLI
prints.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from engine.config import SearchRange, engine_knobs, knob_args
from sweep.tune import speculative_space

KNOB_KINDS = ("int", "float", "bool", "categorical")


class SpaceError(ValueError):
    """The search space (or a space file) is invalid; the message names the knob and the fix."""


@dataclass(frozen=True)
class DeviceInfo:
    """What the tuner knows about the machine and the model before any trial starts."""

    device: str = "cpu"  # "cpu" or "cuda"
    num_devices: int = 1
    model_max_len: int | None = None  # the model's context length, when known
    min_model_len: int = 1  # the workload's longest prompt + output: a shorter max_model_len would clip it
    num_cpus: int = 1  # the cores this process may use: CPU tensor-parallel ranks share them
    tensor_parallel_sizes: tuple[int, ...] | None = None  # the sizes the model's heads split into, when known

    @classmethod
    def detect(
        cls, model_max_len: int | None = None, min_model_len: int = 1,
        tensor_parallel_sizes: tuple[int, ...] | None = None,
    ) -> DeviceInfo:  # fmt: skip
        import os

        import torch

        cuda = torch.cuda.is_available()
        return cls(
            device="cuda" if cuda else "cpu",
            num_devices=torch.cuda.device_count() if cuda else 1,
            model_max_len=model_max_len,
            min_model_len=min_model_len,
            num_cpus=len(os.sched_getaffinity(0)),
            tensor_parallel_sizes=tensor_parallel_sizes,
        )


def engine_knob_names() -> list[str]:
    """Every engine knob (a field of an engine config dataclass), in declaration order."""
    return list(engine_knobs())


@dataclass
class Knob:
    """One tunable engine knob. `choices` for bool/categorical, `low`/`high` (+`log`, `step`) for int/float."""

    name: str
    kind: str
    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    # Drops, in place, the values the device/workload cannot use; returns a message saying what and why, or None.
    device_filter: Callable[[Knob, DeviceInfo], str | None] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KNOB_KINDS:
            raise SpaceError(f"knob {self.name}: kind must be one of {KNOB_KINDS}, got {self.kind!r}")
        if self.kind == "bool" and self.choices is None:
            self.choices = [False, True]
        if self.kind in ("bool", "categorical"):
            if not self.choices:
                raise SpaceError(f"knob {self.name}: needs a non-empty list of choices")
        elif self.low is None or self.high is None or self.low > self.high:
            raise SpaceError(f"knob {self.name}: needs low <= high, got low={self.low} high={self.high}")
        elif self.log and self.low <= 0:
            raise SpaceError(f"knob {self.name}: a log range needs low > 0, got {self.low}")

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind in ("bool", "categorical"):
            return trial.suggest_categorical(self.name, self.choices)  # type: ignore[arg-type]
        if self.kind == "int":
            step = int(self.step or 1)
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=step, log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)  # type: ignore[arg-type]

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.kind in ("bool", "categorical"):
            return optuna.distributions.CategoricalDistribution(self.choices)  # type: ignore[arg-type]
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log,  # type: ignore[arg-type]
                                                        step=int(self.step or 1))
        return optuna.distributions.FloatDistribution(float(self.low), float(self.high), log=self.log,  # type: ignore[arg-type]
                                                      step=self.step)

    def grid_values(self) -> list[Any]:
        if self.choices is not None:
            return list(self.choices)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))  # type: ignore[arg-type]
        raise SpaceError(f"knob {self.name}: a float range has no grid; give it choices")


def _keep_choices(knob: Knob, keep: Callable[[Any], bool], why: str) -> str | None:
    dropped = [c for c in knob.choices or [] if not keep(c)]
    if not dropped:
        return None
    knob.choices = [c for c in knob.choices or [] if keep(c)]
    return f"{knob.name}: excluded {dropped} ({why})"


def _filter_max_model_len(knob: Knob, dev: DeviceInfo) -> str | None:
    """Drop the contexts shorter than the workload's longest request (a trial would clip its prompts and measure a
    lighter workload than the others: sweep/tune/workload_lengths.py) and those longer than the model's; with
    none left, a SpaceError."""
    before = list(knob.choices or [])
    notes = [
        _keep_choices(knob, lambda v: v is None or v >= dev.min_model_len,
                      f"shorter than the workload's longest request, {dev.min_model_len} tokens of prompt + output: "
                      "a trial with it would clip those prompts and measure a lighter workload than the others"),
    ]
    if dev.model_max_len is not None:
        notes.append(_keep_choices(knob, lambda v: v is None or v <= dev.model_max_len,
                                   f"longer than the model's context length {dev.model_max_len}"))
    if before and not knob.choices and any(v is not None and v < dev.min_model_len for v in before):
        context = f" (the model's context is {dev.model_max_len})" if dev.model_max_len is not None else ""
        raise SpaceError(
            f"max_model_len: no choice of {before} fits the workload's longest request, {dev.min_model_len} tokens "
            f"of prompt + output{context}; every trial must measure the same requests, so a shorter context is "
            "not searched. Give --space choices of at least that length, pin max_model_len (every trial then "
            "clips the same requests), drop it (`max_model_len: null`: the engine's own context, where longer "
            "requests fail), or use fewer or shorter requests"
        )
    return "; ".join(n for n in notes if n) or None


def _filter_gpu_memory_utilization(knob: Knob, dev: DeviceInfo) -> str | None:
    if dev.device == "cuda":
        return None
    knob.choices = []
    return (f"{knob.name}: not tuned on {dev.device} (it sizes the KV cache from shared host RAM there); "
            "the engine default is used")


def _filter_tensor_parallel_size(knob: Knob, dev: DeviceInfo) -> str | None:
    limit, what = (dev.num_devices, "GPUs") if dev.device == "cuda" else (dev.num_cpus, "CPU cores")
    notes = [_keep_choices(knob, lambda v: v <= limit, f"more ranks than the {limit} {what} here")]
    if dev.tensor_parallel_sizes is not None:
        valid = dev.tensor_parallel_sizes
        notes.append(_keep_choices(knob, lambda v: v in valid,
                                   f"the model's attention and KV heads split only into {list(valid)}"))
    if knob.choices == [1]:
        knob.choices = []
        notes.append(f"{knob.name}: only 1 fits, not searched (the engine default)")
    return "; ".join(n for n in notes if n) or None


DEVICE_FILTERS: dict[str, Callable[[Knob, DeviceInfo], str | None]] = {
    "max_model_len": _filter_max_model_len,
    "gpu_memory_utilization": _filter_gpu_memory_utilization,
    "tensor_parallel_size": _filter_tensor_parallel_size,
}
# The order a trial draws the default knobs in: a seeded study's trials stay the same as knobs are added.
_DRAW_ORDER = ("scheduler_config", "cache_config", "model_config", "parallel_config")


def _default_choices(search: SearchRange, dev: DeviceInfo) -> list[Any]:
    values = list(search.cuda if dev.device == "cuda" and search.cuda is not None else search.cpu)
    if not search.fraction_of_model_len:
        return values
    if dev.model_max_len is None:
        return [None]  # the model's context length is unknown: the engine default
    return sorted({int(dev.model_max_len * fraction) for fraction in values})


def default_knobs(dev: DeviceInfo) -> list[Knob]:
    """The default space: every engine knob whose field declares a search range, with the device's values.

    The scheduler's knobs come first, then the cache's, the model's and the parallel ones: a sampler's draws follow
    this order, so it is what keeps a seeded study's trials the same.
    """
    specs = sorted(engine_knobs().values(), key=lambda spec: _DRAW_ORDER.index(spec.component))
    knobs: list[Knob] = []
    for spec in specs:
        if spec.search is None:
            continue
        choices = _default_choices(spec.search, dev)
        if spec.name == "speculative_config":  # searched as its fields, in its place in the draw order
            knobs += [Knob(name, "categorical", choices=values)
                      for name, values in speculative_space.default_choices(choices).items()]
            continue
        kind = "bool" if spec.value_type is bool else "categorical"
        knobs.append(Knob(spec.name, kind, choices=choices, device_filter=DEVICE_FILTERS.get(spec.name)))
    return knobs


@dataclass
class SearchSpace:
    """The knobs that are searched, the knobs pinned to one value, and why anything was left out."""

    knobs: list[Knob]
    fixed: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's engine knobs: its draws and the pinned values, the speculative fields assembled."""
        params = {k.name: k.suggest(trial) for k in self.knobs}
        return speculative_space.assemble({**self.fixed, **params})

    def placeholder_knobs(self) -> dict[str, Any]:
        """Every engine knob a trial sets, with the pinned values (None for the searched ones)."""
        return speculative_space.assemble({**dict.fromkeys(self.names), **self.fixed})

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def grid(self) -> dict[str, list[Any]]:
        return {k.name: k.grid_values() for k in self.knobs}


def known_constraint_violation(knobs: dict[str, Any], model_max_len: int | None) -> str | None:
    """vLLM's static rules a configuration must meet before it is worth a launch (None when it meets them)."""
    mnbt, mns = knobs.get("max_num_batched_tokens"), knobs.get("max_num_seqs")
    if mnbt is not None and mns is not None and mnbt < mns:
        return f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({mns})"
    max_len = knobs.get("max_model_len") or model_max_len
    if knobs.get("enable_chunked_prefill") is False and mnbt is not None and max_len is not None and mnbt < max_len:
        return (f"max_num_batched_tokens ({mnbt}) must be >= max_model_len ({max_len}) "
                "when chunked prefill is off")
    return speculative_space.config_violation(knobs.get("speculative_config"))


def _load_space_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # PyYAML ships with optuna, but keep JSON usable without it
            raise SpaceError(f"{path}: reading YAML needs PyYAML (pip install pyyaml), or write it as JSON") from err
        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpaceError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: expected a mapping of knob name -> settings, got {type(data).__name__}")
    return data.get("knobs", data)


def _apply_override(knobs: dict[str, Knob], fixed: dict[str, Any], name: str, spec: Any, dev: DeviceInfo) -> None:
    if name not in engine_knobs() and name not in speculative_space.KNOB_NAMES:
        raise SpaceError(f"space file: unknown knob {name!r}; the engine knobs are: {', '.join(engine_knob_names())}; "
                         f"the speculative_config fields: {', '.join(speculative_space.KNOB_NAMES)}")
    if name == "model":
        raise SpaceError("space file: the model is `bench tune --model`, not a knob to search or pin")
    if spec is None:  # removed from the space: the engine default applies
        knobs.pop(name, None)
    elif isinstance(spec, dict):
        allowed = {"kind", "choices", "low", "high", "log", "step"}
        if unknown := set(spec) - allowed - {"fixed"}:
            raise SpaceError(f"space file: knob {name}: unknown setting(s) {sorted(unknown)}; use {sorted(allowed)}")
        if "fixed" in spec:
            knobs.pop(name, None)
            fixed[name] = spec["fixed"]
            return
        base = knobs.get(name)
        kind = spec.get("kind")
        if kind is None and "choices" in spec:
            kind = "categorical"
        elif kind is None and {"low", "high"} & set(spec):
            bounds = [spec.get("low"), spec.get("high"), spec.get("step")]
            kind = "float" if any(isinstance(b, float) for b in bounds) else "int"
        elif kind is None:
            kind = base.kind if base else "categorical"
        settings = {k: v for k, v in spec.items() if k != "kind"}
        if "choices" in settings:
            settings.update(low=None, high=None)
        elif {"low", "high"} & set(settings):
            settings["choices"] = None
        keep = {} if base is None else {k: getattr(base, k) for k in ("choices", "low", "high", "log", "step")}
        keep.update(settings)
        knobs[name] = Knob(name, kind, device_filter=DEVICE_FILTERS.get(name), **keep)
    else:  # a bare value pins the knob
        knobs.pop(name, None)
        fixed[name] = spec


def build_space(dev: DeviceInfo, space_file: str | Path | None = None) -> SearchSpace:
    """Default knobs for the device, overridden by the space file, minus what the device/engine cannot use."""
    notes: list[str] = []
    knobs = {knob.name: knob for knob in default_knobs(dev)}
    fixed: dict[str, Any] = {}
    if space_file is not None:
        path = Path(space_file)
        if not path.is_file():
            raise SpaceError(f"space file {path} does not exist")
        overrides = _load_space_file(path)
        if "speculative_config" in overrides:
            if named := [name for name in overrides if speculative_space.is_speculative_knob(name)]:
                raise SpaceError(f"space file: give speculative_config or its fields {named}, not both")
            for name in speculative_space.KNOB_NAMES:
                knobs.pop(name, None)
        for name, spec in overrides.items():
            _apply_override(knobs, fixed, name, spec, dev)
        if errors := speculative_space.check_space(knobs, fixed):
            raise SpaceError("space file: " + "; ".join(errors))
    searched: list[Knob] = []
    for knob in knobs.values():
        if knob.device_filter is not None and (note := knob.device_filter(knob, dev)):
            notes.append(note)
        if knob.choices is not None and len(knob.choices) == 0:
            continue
        if knob.choices is not None and len(knob.choices) == 1:
            if knob.choices[0] is not None:
                fixed[knob.name] = knob.choices[0]
            continue
        searched.append(knob)
    if not searched:  # every knob pinned: each trial measures the same configuration (a baseline, or noise)
        notes.append("nothing left to search: every trial measures the pinned configuration")
    return SearchSpace(knobs=searched, fixed=fixed, notes=notes)


def serve_command(model: str, knobs: dict[str, Any], extra: Sequence[str] = ()) -> str:
    """The `bench serve` command for a configuration, with the flags the tuner launched it with."""
    return shlex.join(["bench", "serve", model, *knob_args(knobs), *extra])


def fill_template(template: str, model: str, knobs: dict[str, Any], port: int = 8000, host: str = "127.0.0.1") -> str:
    """Fill an external launch template such as `vllm serve {model} --max-num-seqs {max_num_seqs}`.

    The sweep launcher's `template_command` fills `{model}`, `{host}`, `{port}` and `{name}` (a knob's value;
    booleans `true`/`false`); the tuner adds `{name_flag}`, the knob's vLLM-style flag (`--max-num-seqs 8`,
    `--enable-prefix-caching`, `--no-enable-prefix-caching`), and `{knob_flags}`, every knob's flag. A knob left
    at the engine default (None) fills as nothing. Unknown placeholders are an error.
    """
    from sweep.run.launcher import template_command

    values: dict[str, Any] = {name: "" if value is None else value for name, value in knobs.items()}
    values |= {f"{name}_flag": shlex.join(knob_args({name: value})) for name, value in knobs.items()}
    values["knob_flags"] = shlex.join(knob_args(knobs))
    try:
        return shlex.join(template_command(template, model, host, port, values))
    except ValueError as err:
        raise SpaceError(
            f"{err}; a template may use the model, host, port and each knob in the space as {{name}} or "
            f"{{name_flag}}, and {{knob_flags}} ({', '.join(sorted(values))})"
        ) from err
