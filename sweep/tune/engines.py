"""The engines `bench tune --engine` tunes: the built-in one (`servelab`) and vLLM (`vllm`), as presets.

A preset is the launch template the tuner would otherwise be given as `--launch-command` (vLLM: `vllm serve {model}
--host {host} --port {port} --served-model-name {model} {knob_flags}`) plus the table of the space's knobs the engine
takes (vLLM's template, knob table and model check are sweep/run/vllm_engine.py's, shared with `bench compare
--target NAME=vllm`). Every knob of the search space is checked against that table by name before any trial starts: a
knob vLLM lacks (our CPU threads, our int4/int8 quantization, the benchmarking aids) is a `SpaceError` naming each
knob, the engine and why, not a failure in every trial. The knobs vLLM takes keep their flags: the built-in engine's
flags are vLLM's (`{knob_flags}` spells them, sweep/tune/space.py).

`engine_error_line` reads the engine's own error out of its log (the last exception line of a vLLM that refused
its configuration or died), so an infeasible trial says what vLLM said.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sweep.run import vllm_engine
from sweep.run.launcher import escape
from sweep.run.vllm_engine import VLLM_KNOBS, check_vllm_model, refused_vllm_knobs

__all__ = ["VLLM_KNOBS", "check_vllm_model"]  # re-exported: tune and its tests read them here

ENGINES = ("servelab", "vllm")
VLLM_VENV_COMMAND = vllm_engine.VLLM_VENV_COMMAND


@dataclass(frozen=True)
class EnginePreset:
    """What `bench tune --engine NAME` launches: `launch_command` (None: the built-in `bench serve`)."""

    name: str
    launch_command: str | None = None


def vllm_command(given: str | None) -> str:
    """The vllm executable (sweep/run/vllm_engine.py): `given`, else `.venv-vllm/bin/vllm` beside the repo (the
    `make vllm` venv) when it exists, else `vllm` on PATH; a ValueError when none is there."""
    return vllm_engine.vllm_command(given, VLLM_VENV_COMMAND)


def preset(engine: str, vllm_executable: str | None = None, vllm_args: str | None = None) -> EnginePreset:
    """The engine's preset; ValueError for an unknown engine, a `--vllm-command`/`--vllm-args` without `--engine
    vllm`, or a `--vllm-args` flag that a knob of the space spells (the space sets those, trial by trial)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "servelab":
        if vllm_executable is not None or vllm_args is not None:
            raise ValueError("--vllm-command and --vllm-args are for --engine vllm")
        return EnginePreset(engine)
    extra = shlex.split(vllm_args or "")
    knob_flags = {flag for spelling in VLLM_KNOBS.values() for flag in re.findall(r"--[a-z-]+", spelling)}
    if clash := sorted({a.split("=", 1)[0] for a in extra} & knob_flags):
        raise ValueError(f"--vllm-args {' '.join(clash)}: a knob of the search space sets that flag; fix it in "
                         "--space ({\"fixed\": ...}) instead")
    # The served name is the model string, the one the sweep's client sends as `model` in every request.
    template = vllm_engine.serve_template(vllm_command(vllm_executable)) + " {knob_flags}"
    if extra:
        template += " " + escape(shlex.join(extra))
    return EnginePreset(engine, launch_command=template)


def resolve(engine: str | None, launch_command: str | None, vllm_executable: str | None, model: str,
            measures_builtin: Iterable[str] = (), vllm_args: str | None = None) -> tuple[EnginePreset, str]:
    """`bench tune`'s engine: the preset and the model as that engine loads it. ValueErrors (usage errors) for
    `--engine` with `--launch-command`, and for the options in `measures_builtin` (`--max-quality-loss`,
    `--simulate-first`: they measure the built-in engine in this process) with any other engine."""
    if engine is not None and launch_command is not None:
        raise ValueError("give --engine (a preset that writes the launch command) or --launch-command, not both")
    chosen = preset(engine or "servelab", vllm_executable, vllm_args)
    external = chosen.launch_command is not None or launch_command is not None
    if external and (options := list(measures_builtin)):
        what = f"--engine {chosen.name}" if chosen.launch_command else "--launch-command"
        verb, them = ("measures", "it") if len(options) == 1 else ("measure", "them")
        raise ValueError(f"{' and '.join(options)} {verb} the built-in engine (servelab, in this process), not the "
                         f"engine {what} launches: drop {them}, or trials are judged by another engine's figures")
    if chosen.name == "vllm":
        return chosen, check_vllm_model(model)
    return (chosen if launch_command is None else EnginePreset("external", launch_command)), model


def refused_knobs(engine: str, knob_names: Iterable[str]) -> list[str]:
    """One line per knob of the space the engine does not take ('name: why'); empty when it takes them all."""
    if engine != "vllm":
        return []
    return refused_vllm_knobs(knob_names)


def check_knobs(engine: str, knob_names: Iterable[str]) -> None:
    """A ValueError naming every knob the engine refuses and the engine, before any trial starts."""
    if refused := refused_knobs(engine, knob_names):
        raise ValueError(f"--engine {engine} does not take these knobs of the search space: {'; '.join(refused)}. "
                         "Drop them from --space (`NAME: null`); vLLM takes "
                         + ", ".join(VLLM_KNOBS))


# An exception line: `ValueError: ...`, `pydantic_core._pydantic_core.ValidationError: 1 validation error for ...`,
# after any prefix vLLM puts on its processes' lines (`(APIServer pid=12) `, `ERROR 12-02 10:00:00 [x.py:1] `).
_EXCEPTION = re.compile(r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")
_PROCESS_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s?")
_PYDANTIC_INPUT = re.compile(r"\s*\[type=.*$")  # pydantic's echo of the whole input: long, and said already
# vLLM's front end re-raises an engine core's failure with this line; the root cause is the exception before it.
_WRAPPERS = ("see root cause above", "engine core initialization failed")
LOG_READ_BYTES = 256 * 1024


def engine_error_line(log_text: str) -> str | None:
    """The engine's own error: the last exception line of its log that is not a wrapper pointing above it, with a
    pydantic validation error's indented detail lines appended; None when the log has none."""
    lines = [_PROCESS_PREFIX.sub("", line).rstrip() for line in log_text.splitlines()]
    for index in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION.search(lines[index])
        if match is None or any(w in match.group(2).lower() for w in _WRAPPERS):
            continue
        text = f"{match.group(1)}: {match.group(2)}"
        if "validation error" in match.group(2):
            detail = []
            for line in lines[index + 1 :]:
                if not line.startswith(" ") or len(detail) == 4:
                    break
                if not line.strip().startswith("For further information"):
                    detail.append(_PYDANTIC_INPUT.sub("", line.strip()))
            text = " ".join([text, *detail])
        return text
    return None


def log_error_line(log_path: Path) -> str | None:
    """`engine_error_line` of the log file's last LOG_READ_BYTES (None when there is no log)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(log.seek(0, 2) - LOG_READ_BYTES, 0))
            return engine_error_line(log.read().decode(errors="replace"))
    except OSError:
        return None
