"""vLLM as a launched server, for any command that starts one (`bench tune --engine vllm`, `bench compare
--target NAME=vllm`): where its executable is, what it loads, its `vllm serve` command line and the table of our
engine knobs it takes.

Our engine knobs are named and spelled as vLLM's (engine/config.py), so a knob vLLM takes keeps its flag. A knob
vLLM lacks (our CPU threads, our int4/int8 quantization, the benchmarking aids) is refused by name, with why, before
anything starts (`refused_vllm_knobs`). vLLM loads an HF directory (`bench model export-hf` writes one, with a
`servelab-export.json` marker naming its source) or a hub id, never our aliases or a GGUF (`check_vllm_model`).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
    "attention_backend": "our kernels (torch, triton, cpu); vLLM's backends have other names",
    "device": "vLLM runs on the platform its build is for",
    "kv_cache_memory_bytes": "vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) in the "
    "environment: set it there",
    "kv_cache_dtype": "our values (auto, bfloat16) are not checked against the vLLM build's list: pass vLLM's value "
    "in a --launch-command",
    "structured_outputs_config": "not checked against vLLM's fields: pass it in a --launch-command",
}
TEST_KNOB_PREFIX = "inject_"  # benchmarking aids of the built-in engine (inject_step_delay_ms, ...)


def vllm_command(given: str | None, venv_command: Path = VLLM_VENV_COMMAND, option: str = "--engine vllm") -> str:
    """The vllm executable: `given`, else `venv_command` (the `make vllm` venv's) when it exists, else `vllm` on
    PATH; a ValueError when none is there (`option` names what asked for vLLM)."""
    if given is not None:
        found = shutil.which(given)
        if found is None:
            raise ValueError(f"--vllm-command {given}: no such executable")
        return str(Path(found).resolve()) if "/" in given else given
    if venv_command.is_file():
        return str(venv_command)
    if shutil.which("vllm") is None:
        raise ValueError(f"{option}: no `vllm` on PATH and no {venv_command}; run `make vllm` or give "
                         "--vllm-command PATH")
    return "vllm"


def check_vllm_model(model: str, option: str = "--engine vllm") -> str:
    """vLLM loads an HF directory (made absolute: the engine runs in the repo root) or a hub id `org/name`; our
    aliases and GGUF files are a ValueError saying how to make the directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if "/" in model and not path.exists() and not model.startswith((".", "/", "~")):
        return model  # a hub id: vLLM fetches it
    raise ValueError(f"{option} loads an HF directory or a hub id (org/name), not {model!r}; "
                     f"`bench model export-hf {shlex.quote(model)} --output-dir .models/{Path(model).stem}-hf` "
                     "(or `make vllm` for the default model) writes one")


def refused_vllm_knobs(knob_names: Iterable[str]) -> list[str]:
    """One line per knob vLLM does not take ('name (why)'); empty when it takes them all."""
    refused = []
    for name in knob_names:
        if name in VLLM_KNOBS:
            continue
        why = SERVELAB_ONLY.get(name) or ("a benchmarking aid of the built-in engine"
                                          if name.startswith(TEST_KNOB_PREFIX) else "not a knob vLLM takes")
        refused.append(f"{name} ({why})")
    return refused


def serve_template(executable: str, loads: str = "{model}") -> str:
    """`vllm serve` as a launch template (sweep/run/launcher.py) up to its knob flags: vLLM loads `loads` (template
    text: `{model}`, or a quoted directory) and serves it as `{model}`, the name the sweep's client sends."""
    return (f"{shlex.quote(executable)} serve {loads} --host {{host}} --port {{port}} "
            "--served-model-name {model}")


def vllm_weights(model: str, dtype: Any = None) -> dict[str, Any]:
    """What vLLM loads, for a run's record: the directory or hub id, its dtype knob (None: vLLM's `auto`), and
    the source a `bench model export-hf` directory was exported from (its marker), when it has one."""
    from engine.model_export import EXPORT_MARKER

    record: dict[str, Any] = {"source": model, "dtype": dtype or "auto"}
    marker = Path(model) / EXPORT_MARKER
    if marker.is_file():
        try:
            exported = json.loads(marker.read_text())
        except (OSError, ValueError):
            exported = {}
        record["exported_from"] = exported.get("source")
        record["exported_model"] = exported.get("model")
    return record
