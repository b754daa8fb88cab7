"""Tensor-parallel ranks are forked unless CUDA is initialised (vLLM's rule): `LLM(..., tensor_parallel_size=2)` in a
plain script with no main guard works, token-identical to one rank; where the ranks must be spawned, a script
without the guard fails at once with an error that names it, not with multiprocessing's bootstrap traceback."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.executor.start_method import GUARD, check_not_bootstrapping, worker_start_method

REPO = Path(__file__).resolve().parents[3]

# No `if __name__ == "__main__":` anywhere: the engine is built at import, as in a first script.
PLAIN_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from engine import LLM, SamplingParams

    torch.set_num_threads(2)
    prompts = [{"prompt_token_ids": [1, 5, 9, 13, 2, 7]}, {"prompt_token_ids": [3, 4, 8]}]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    knobs = dict(dtype="float32", max_model_len=64, num_gpu_blocks_override=16)

    def greedy(llm):
        return [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]

    one = greedy(LLM("tiny-random", **knobs))  # the parent's own OpenMP pool runs before the fork
    torch.randn(256, 256) @ torch.randn(256, 256)
    llm = LLM("tiny-random", tensor_parallel_size=2, **knobs)
    two = greedy(llm)
    print(json.dumps({"start_method": llm.llm_engine.engine_core.model_executor.start_method,
                      "tp1": one, "tp2": two}))
    """
)


def run_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "plain.py"
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # A fork that deadlocked (a lock or a thread pool copied mid-use) would hang here: the timeout fails it.
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_forked_by_default_spawned_with_a_warning_once_cuda_is_initialised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert worker_start_method() == "fork"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with caplog.at_level(logging.WARNING, logger="engine.executor.start_method"):
        assert worker_start_method() == "spawn"
    assert "CUDA is initialised" in caplog.text and GUARD in caplog.text


def test_starting_workers_while_a_spawned_child_imports_main_names_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    check_not_bootstrapping("the workers")  # an ordinary process: nothing to say
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=GUARD):
        check_not_bootstrapping("the workers")


@pytest.mark.slow
def test_a_plain_script_runs_two_ranks_token_identical_to_one(tmp_path: Path) -> None:
    result = run_script(tmp_path, PLAIN_SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["start_method"] == "fork"
    assert out["tp2"] == out["tp1"] and all(len(tokens) == 3 for tokens in out["tp1"])


@pytest.mark.slow
def test_spawned_ranks_of_a_script_without_the_guard_fail_at_once_naming_it(tmp_path: Path) -> None:
    """CUDA initialised (simulated, in the script and so in its spawned copies): the ranks are spawned, each
    imports the script again, and the engine it builds there stops with the guard's name."""
    script = "import torch\ntorch.cuda.is_initialized = lambda: True\n" + PLAIN_SCRIPT.replace(
        "one = greedy(LLM(\"tiny-random\", **knobs))", "one = []"
    )
    result = run_script(tmp_path, script)
    assert result.returncode != 0
    assert GUARD in result.stderr
    assert "EngineDeadError" in result.stderr and "died" in result.stderr  # the parent's error, with the hint
    assert "freeze_support" not in result.stderr and "bootstrapping phase" not in result.stderr
