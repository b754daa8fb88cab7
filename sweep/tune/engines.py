"""The engines `bench tune --engine` tunes: the built-in one (`servelab`) and vLLM (`vllm`), as presets.

A preset is the launch template the tuner would otherwise be given as `--launch-command` (vLLM: `vllm serve
{model} --host {host} --port {port} --served-model-name {model} {knob_flags}`) plus the table of the space's knobs
the engine takes. Every knob of the search space is checked against that table by name before any trial starts:
a knob vLLM lacks (our CPU threads, our int4/int8 quantization, the benchmarking aids) is a `SpaceError` naming
each knob, the engine and why, not a failure in every trial. The knobs vLLM takes keep their flags: the built-in
engine's flags are vLLM's (`{knob_flags}` spells them, sweep/tune/space.py).

`engine_error_line` reads the engine's own error out of its log (the last exception line of a vLLM that refused
its configuration or died), so an infeasible trial says what vLLM said.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("servelab", "vllm")
REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV_COMMAND = REPO_ROOT / ".venv-vllm" / "bin" / "vllm"  # where `make vllm` installs vLLM's CPU build

# The knobs vLLM takes, each with the same flag as ours (engine/config.py names and spells every knob as vLLM does,
# so `{knob_flags}` is already vLLM's command line) and the same meaning unless its note says otherwise.
VLLM_KNOBS: dict[str, str] = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_chunked_prefill": "--enable-chunked-prefill / --no-enable-chunked-prefill",
    "enable_prefix_caching": "--enable-prefix-caching / --no-enable-prefix-caching",
    "block_size": "--block-size (vLLM refuses the sizes its attention backend lacks: an infeasible trial)",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization (not searched on the CPU, where vLLM sizes the KV cache "
    "from VLLM_CPU_KVCACHE_SPACE)",
    "tensor_parallel_size": "--tensor-parallel-size",
    # The same JSON and the same n-gram defaults: our prompt_lookup_min/max default to 5 each, as vLLM's do.
    "speculative_config": "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": K, "
    "\"prompt_lookup_max\": N}'",
    "dtype": "--dtype (auto: vLLM's own pick from the checkpoint, which may differ from ours; pin float32 to "
    "compare like with like)",
    "seed": "--seed",
    "tokenizer": "--tokenizer",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
}

# The knobs only the built-in engine has, and why vLLM has no true equivalent (so they are refused, not mapped).
SERVELAB_ONLY: dict[str, str] = {
    "cpu_threads": "our torch threads per rank; vLLM's CPU build binds cores instead (env VLLM_CPU_OMP_THREADS_BIND, "
    "and it reserves one for its frontend unless VLLM_CPU_NUM_OF_RESERVED_CPU=0): set those in the environment",
    "quantization": "our int8/int4 weight quantization of a float checkpoint; vLLM's --quantization names the "
    "method of an already-quantized checkpoint",
    "quantization_group_size": "a setting of our int4/int8 quantization",
    "quantization_skip": "a setting of our int4/int8 quantization",
    "attention_backend": "our kernels (torch, triton); vLLM's backends have other names",
    "device": "vLLM runs on the platform its build is for",
    "kv_cache_memory_bytes": "vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) in the "
    "environment: set it there",
    "kv_cache_dtype": "our values (auto, bfloat16) are not checked against the vLLM build's list: pass vLLM's value "
    "in a --launch-command",
    "structured_outputs_config": "not checked against vLLM's fields: pass it in a --launch-command",
}
TEST_KNOB_PREFIX = "inject_"  # benchmarking aids of the built-in engine (inject_step_delay_ms, ...)


@dataclass(frozen=True)
class EnginePreset:
    """What `bench tune --engine NAME` launches: `launch_command` (None: the built-in `bench serve`)."""

    name: str
    launch_command: str | None = None


def vllm_command(given: str | None) -> str:
    """The vllm executable: `given`, else `.venv-vllm/bin/vllm` beside the repo (the `make vllm` venv) when it
    exists, else `vllm` on PATH; a ValueError when none is there."""
    if given is not None:
        found = shutil.which(given)
        if found is None:
            raise ValueError(f"--vllm-command {given}: no such executable")
        return str(Path(found).resolve()) if "/" in given else given
    if VLLM_VENV_COMMAND.is_file():
        return str(VLLM_VENV_COMMAND)
    if shutil.which("vllm") is None:
        raise ValueError(f"--engine vllm: no `vllm` on PATH and no {VLLM_VENV_COMMAND}; run `make vllm` or give "
                         "--vllm-command PATH")
    return "vllm"


def check_vllm_model(model: str) -> str:
    """vLLM loads an HF directory (made absolute: the engine runs in the repo root) or a hub id `org/name`; our
    aliases and GGUF files are a ValueError saying how to make the directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if "/" in model and not path.exists() and not model.startswith((".", "/", "~")):
        return model  # a hub id: vLLM fetches it
    raise ValueError(f"--engine vllm loads an HF directory or a hub id (org/name), not {model!r}; "
                     f"`bench model export-hf {shlex.quote(model)} --output-dir .models/{Path(model).stem}-hf` "
                     "(or `make vllm` for the default model) writes one")


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
    template = (f"{shlex.quote(vllm_command(vllm_executable))} serve {{model}} --host {{host}} --port {{port}} "
                "--served-model-name {model} {knob_flags}")
    if extra:
        template += " " + shlex.join(extra).replace("{", "{{").replace("}", "}}")
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
    refused = []
    for name in knob_names:
        if name in VLLM_KNOBS:
            continue
        why = SERVELAB_ONLY.get(name) or ("a benchmarking aid of the built-in engine"
                                          if name.startswith(TEST_KNOB_PREFIX) else "not a knob vLLM takes")
        refused.append(f"{name} ({why})")
    return refused


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
