"""`bench compare --target NAME=SPEC`: the spec grammar, and each target as the sweep's launch settings.

A spec is one of `engine[:KNOB=V,...]` (the built-in engine, `bench serve`, with these engine knobs),
`ref:GITREF[:KNOB=V,...]` (this repository at a git ref, served by its own `bench serve` from a temporary
worktree), `cmd:TEMPLATE` (any launch template with {model} {host} {port}, as sweep/run/launcher.py),
`url:http://HOST:PORT` (a server already running; nothing is launched), `llama.cpp` (llama.cpp's OpenAI
server from the `llama-cpp-python[server]` package, on the model's GGUF) or `vllm[:KNOB=V,...]` (a real `vllm serve`
on the HF directory `--vllm-model` names, served under the `--model` name the client sends, with these knobs as
vLLM's flags; a knob vLLM lacks is refused by name, sweep/run/vllm_engine.py).

Each target's run records the weights it served (`target_weights`): the engine's GGUF or HF directory and dtype,
llama.cpp's GGUF, vLLM's directory and the source its `bench model export-hf` marker names; unknown for cmd and url.

llama.cpp's server takes no `ignore_eos`: its outputs may end at EOS before --output-len (its TPOT is per token
all the same; the compare table gives the mean output length). It runs one request at a time, started with
`--interrupt_requests False` so concurrent streams queue rather than interrupt each other (see
tests/sweep/run/test_llama_cpp_server.py). It has no /health: it is ready once /v1/models answers. It streams
no usage, so its token counts come from re-tokenising the streamed text (the sweep client does so).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import KnobSpec, engine_knobs, knob_args
from sweep.run.launcher import escape
from sweep.run.vllm_engine import refused_vllm_knobs, serve_template, vllm_weights

REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("engine", "ref", "cmd", "url", "llama.cpp", "vllm")
KNOBBED = ("engine", "ref", "vllm")  # the kinds that take KNOB=V,...
LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
LLAMA_CPP_HEALTH = "/v1/models"
LLAMA_CPP_THREADS = 2  # its default --n_threads without a --cpu-threads knob
SHARED_KNOBS = ("model", "tokenizer")  # the workload's: one for every target
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a target's name is its run directory's name


class TargetError(ValueError):
    """A --target that cannot run; the message names the target and the fix."""


@dataclass(frozen=True)
class Target:
    """One compared server: `kind` is one of KINDS; `value` the ref, template or URL (empty for engine, llama.cpp
    and vllm); `knobs` its own engine knobs (over the command's); `extra_args` appended to its server command."""

    name: str
    kind: str
    value: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise TargetError(f"target name {self.name!r}: use letters, digits, '.', '_' or '-' (it names a directory)")
        if self.kind not in KINDS:
            raise TargetError(f"target {self.name}: unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind not in KNOBBED and self.knobs:
            raise TargetError(f"target {self.name}: a {self.kind} target takes no engine knobs (only engine:, ref: "
                              "and vllm:)")  # fmt: skip
        if self.kind == VLLM and (refused := refused_vllm_knobs(self.knobs)):
            raise TargetError(f"target {self.name}: vLLM does not take {'; '.join(refused)}")
        if self.kind in ("ref", "cmd", "url") and not self.value:
            raise TargetError(f"target {self.name}: {self.kind}: needs a value, e.g. {_EXAMPLES[self.kind]}")
        if self.kind == "url" and not re.match(r"^https?://[^/\s]+", self.value):
            raise TargetError(f"target {self.name}: url: takes http://HOST:PORT, got {self.value!r}")

    @property
    def launched(self) -> bool:
        return self.kind != "url"

    def describe(self) -> str:
        """The spec as the user would write it (for logs and the run's recorded command)."""
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs.items())
        head = {"engine": "engine", LLAMA_CPP: LLAMA_CPP, VLLM: VLLM}.get(self.kind, f"{self.kind}:{self.value}")
        tail = f":{knobs}" if knobs else ""
        extra = f" {shlex.join(self.extra_args)}" if self.extra_args else ""
        return head + tail + extra


_EXAMPLES = {"ref": "ref:HEAD~1", "cmd": "'cmd:vllm serve {model} --port {port}'", "url": "url:http://127.0.0.1:8000"}


def parse_knobs(text: str, target: str) -> dict[str, Any]:
    """'quantization=int8,max_num_seqs=8' -> {'quantization': 'int8', 'max_num_seqs': 8}, checked against the
    engine's knobs and their types."""
    specs = engine_knobs()
    knobs: dict[str, Any] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name = name.strip()
        if not sep or not name or not value.strip():
            raise TargetError(f"target {target}: engine knobs are KNOB=V,KNOB=V (vLLM names), got {text!r}")
        if name not in specs:
            raise TargetError(f"target {target}: {name!r} is not an engine knob; the knobs are {', '.join(specs)}")
        if name in knobs:
            raise TargetError(f"target {target}: knob {name} is given twice")
        if name in SHARED_KNOBS:
            raise TargetError(f"target {target}: every target serves the same --{name.replace('_', '-')}; "
                              "set it once for all")  # fmt: skip
        knobs[name] = knob_value(specs[name], value.strip(), target)
    return knobs


def knob_value(spec: KnobSpec, text: str, target: str) -> Any:
    try:
        return spec.parse_text(text)
    except ValueError as e:
        raise TargetError(f"target {target}: {spec.name}={text}: {e}") from None


def parse_target(text: str) -> Target:
    """'NAME=SPEC' -> Target (a TargetError says what is wrong)."""
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or not name or not spec:
        raise TargetError(f"--target takes NAME=SPEC (e.g. base=engine, int8=engine:quantization=int8), got {text!r}")
    if spec == LLAMA_CPP:
        return Target(name, LLAMA_CPP)
    if spec.startswith(LLAMA_CPP + ":"):
        raise TargetError(f"target {name}: llama.cpp takes no knobs (spec: llama.cpp)")
    kind, _, rest = spec.partition(":")
    if kind in ("engine", VLLM):
        return Target(name, kind, knobs=parse_knobs(rest, name) if rest else {})
    if kind == "ref":
        ref, _, knobs = rest.partition(":")
        return Target(name, "ref", ref, parse_knobs(knobs, name) if knobs else {})
    if kind == "cmd":
        return Target(name, "cmd", rest)
    if kind == "url":
        host_port, _, extra = rest.partition("://")
        if extra.count(":") > 1 or "=" in extra:
            raise TargetError(f"target {name}: a url target takes no engine knobs (the server is already running)")
        return Target(name, "url", rest.rstrip("/").removesuffix("/v1"))
    raise TargetError(f"target {name}: unknown spec {spec!r}; use engine[:K=V,...], ref:GITREF[:K=V,...], "
                      "cmd:TEMPLATE, url:http://HOST:PORT, llama.cpp or vllm[:K=V,...]")  # fmt: skip


def check_targets(targets: list[Target]) -> None:
    """At least two, names unique, llama.cpp installed where one is asked for."""
    if len(targets) < 2:
        raise TargetError("give at least two --target NAME=SPEC (the first is the baseline)")
    names = [t.name for t in targets]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise TargetError(f"target name(s) given twice: {', '.join(duplicates)}")
    if any(t.kind == LLAMA_CPP for t in targets) and importlib.util.find_spec("llama_cpp") is None:
        raise TargetError("a llama.cpp target needs llama.cpp's server: pip install 'llama-cpp-python[server]'")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TargetError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_ref(ref: str) -> str:
    """The commit of `ref` in this repository (a TargetError if there is none)."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except TargetError:
        raise TargetError(f"{ref!r} is not a commit of the repository at {REPO_ROOT}") from None


@contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A temporary detached worktree of `ref`, removed afterwards."""
    commit = resolve_ref(ref)
    path = Path(tempfile.mkdtemp(prefix=f"servelab-compare-{commit[:8]}-"))
    _git("worktree", "add", "--detach", "--force", str(path), commit)
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path))


def llama_cpp_command(gguf: Path, alias: str, port: int | str, threads: int, n_ctx: int) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--interrupt_requests", "False"]  # fmt: skip


def llama_cpp_template(model: str, knobs: dict[str, Any], n_ctx: int) -> str:
    """llama.cpp's server on `model`'s GGUF as a launch template (its port and alias substituted by the launcher)."""
    from engine.model_files import gguf_source

    gguf = gguf_source(model)
    if gguf is None:
        raise TargetError(f"a llama.cpp target serves a GGUF: --model is smollm2-135m or a .gguf path, not {model!r}")
    argv = llama_cpp_command(gguf, "\0model", "\0port", int(knobs.get("cpu_threads") or LLAMA_CPP_THREADS), n_ctx)
    placeholders = {"\0model": "{model}", "\0port": "{port}"}
    return " ".join(placeholders.get(a) or shlex.quote(escape(a)) for a in argv)


def vllm_template(executable: str, hf_dir: str, knobs: dict[str, Any], extra_args: tuple[str, ...] = ()) -> str:
    """`vllm serve HF_DIR --host --port --served-model-name {model} <knob flags>` as a launch template."""
    head = serve_template(escape(executable), shlex.quote(escape(hf_dir)))
    return " ".join([head, *(shlex.quote(escape(a)) for a in [*knob_args(knobs), *extra_args])])


def target_weights(target: Target, model: str, knobs: dict[str, Any], vllm_model: str | None) -> dict[str, Any]:
    """The weights the target serves, for its run's config.json: `source` (a GGUF file, an HF directory or hub id,
    or an alias; None: unknown, a cmd or url target's own) and the dtype (and quantization) it runs them in."""
    from engine.model_files import gguf_source

    if target.kind == VLLM:
        assert vllm_model is not None
        return vllm_weights(vllm_model, knobs.get("dtype"))
    if target.kind in ("cmd", "url"):
        return {"source": None}
    gguf = gguf_source(model)
    path = Path(model).expanduser()
    source = str(gguf) if gguf is not None else str(path.resolve()) if path.is_dir() else model
    if target.kind == LLAMA_CPP:
        return {"source": source, "dtype": "as stored in the GGUF"}
    record: dict[str, Any] = {"source": source, "dtype": knobs.get("dtype") or "auto"}
    if knobs.get("quantization") not in (None, "none"):
        record["quantization"] = knobs["quantization"]
    return record


def launch_template(target: Target, model: str, knobs: dict[str, Any], worktree: Path | None, n_ctx: int,
                    vllm: tuple[str, str] | None = None) -> str | None:
    """The target's launch template; None for the built-in engine (the launcher's own command) and a URL.
    `vllm` is (executable, HF directory) for a vllm target.

    A ref runs its worktree's `bench serve` (`python -P` keeps the current directory off sys.path, so
    PYTHONPATH picks the worktree's code over the installed one)."""
    extra = [shlex.quote(escape(a)) for a in target.extra_args]
    if target.kind == "cmd":
        return " ".join([target.value, *extra])
    if target.kind == LLAMA_CPP:
        return llama_cpp_template(model, knobs, n_ctx)
    if target.kind == VLLM:
        assert vllm is not None
        return vllm_template(*vllm, knobs, target.extra_args)
    if target.kind == "ref":
        assert worktree is not None
        argv = ["env", f"PYTHONPATH={worktree}", sys.executable, "-P", "-m", "cli", "serve"]
    elif target.kind == "engine" and extra:
        argv = [sys.executable, "-m", "cli", "serve"]
    else:
        return None
    head = " ".join(shlex.quote(escape(a)) for a in argv) + " {model} --host {host} --port {port}"
    return " ".join([head, *(shlex.quote(escape(a)) for a in knob_args(knobs)), *extra])
