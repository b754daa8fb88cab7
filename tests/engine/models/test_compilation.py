"""The compiled forward's switches and its fallback (engine/models/compilation.py); no compiler runs here.

The compiled path itself (HF equivalence, regions against eager, no recompile) is tests/engine/
test_llm_equivalence_compiled.py: it compiles, so it is slow.
"""

from __future__ import annotations

import logging

import pytest
import torch

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.models import compilation
from engine.models.compilation import ENFORCE_EAGER_ENV, INDUCTOR_CACHE_ENV, eager_reason, inductor_cache_dir


def runner(**knobs: object) -> ModelRunner:
    return ModelRunner(EngineConfig.from_kwargs(model="tiny-random", dtype="float32", max_model_len=64, **knobs))


def test_eager_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENFORCE_EAGER_ENV, raising=False)
    cpu = torch.device("cpu")
    assert eager_reason(False, cpu) is None
    assert eager_reason(True, cpu) == "--enforce-eager"
    cuda_reason = "torch.compile is used on the CPU only, this forward runs on cuda"
    assert eager_reason(False, torch.device("cuda")) == cuda_reason
    monkeypatch.setenv(ENFORCE_EAGER_ENV, "0")
    assert eager_reason(False, cpu) is None
    monkeypatch.setenv(ENFORCE_EAGER_ENV, "1")
    assert eager_reason(False, cpu) == f"{ENFORCE_EAGER_ENV}=1"


def test_the_suite_runs_engines_eagerly() -> None:
    assert runner().forward_mode == "eager (--enforce-eager)"  # the default
    assert runner(enforce_eager=False).forward_mode == f"eager ({ENFORCE_EAGER_ENV}=1)"  # tests/conftest.py


def test_the_inductor_cache_is_servelabs_unless_the_user_set_one(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    assert inductor_cache_dir() == str(tmp_path / "inductor")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/elsewhere")
    assert inductor_cache_dir() == "/elsewhere"


def test_a_failed_compile_runs_eagerly_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(method: object, **options: object) -> object:
        def compiled(*args: object) -> object:  # inductor fails at the first call, as without a C++ compiler
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

        return compiled

    monkeypatch.delenv(ENFORCE_EAGER_ENV)
    monkeypatch.setattr(compilation.torch, "compile", no_compiler)
    monkeypatch.setattr(compilation, "_fallback_reported", False)
    eager = runner(enforce_eager=True)
    with caplog.at_level(logging.WARNING, logger="engine.models.compilation"):
        # a second model in the process (a draft) does not repeat it
        first, second = runner(enforce_eager=False), runner(enforce_eager=False)
    reason = "torch.compile failed: RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    assert first.forward_mode == second.forward_mode == f"eager ({reason})"
    assert [r.getMessage() for r in caplog.records] == [
        f"{reason}; running the forward eagerly (--enforce-eager skips the attempt)"
    ]
    assert all("pre_attention" not in layer.__dict__ for layer in first.model.layers)  # the layers' own methods
    with torch.inference_mode():
        torch.testing.assert_close(first._dummy_forward([5]), eager._dummy_forward([5]), rtol=0, atol=0)
