"""A fake `vllm` executable for tests of commands that launch vLLM (`bench tune --engine vllm`, `bench compare
--target NAME=vllm`): `vllm serve` with vLLM's flags (argparse exits 2 on any other) that records each call's flags
and serves the in-process mock server (sweep/mock/server.py) on the asked port."""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_MAX_LEN = 2048
FAKE_VLLM = '''#!{python}
"""A fake `vllm serve`: vLLM's flags (argparse exits 2 on any other), its refusal of a long max_model_len."""
import argparse, json, os, subprocess, sys
parser = argparse.ArgumentParser(prog="vllm")
parser.add_argument("command", choices=["serve"])
parser.add_argument("model")
for flag in ("--host", "--served-model-name", "--dtype"):
    parser.add_argument(flag)
for flag in ("--port", "--max-num-seqs", "--max-model-len", "--max-num-batched-tokens"):
    parser.add_argument(flag, type=int)
parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
parser.add_argument("--speculative-config", type=json.loads)
args = parser.parse_args()
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(vars(args)) + "\\n")
if args.max_model_len and args.max_model_len > {max_len}:
    print("(APIServer pid=%d) INFO starting" % os.getpid(), flush=True)
    print("(APIServer pid=%d) ValueError: User-specified max_model_len (%d) is greater than the derived "
          "max_model_len (max_position_embeddings={max_len})" % (os.getpid(), args.max_model_len), flush=True)
    sys.exit(1)
child = subprocess.Popen([sys.executable, "-m", "sweep.mock.server", "--host", args.host, "--port", str(args.port),
                          "--ttft-ms", "1", "--itl-ms", "1"])
open(os.path.join({pids!r}, str(child.pid)), "w").close()
sys.exit(child.wait())
'''


def fake_vllm(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The fake vllm executable, the file it appends each call's flags to, and the directory of its children's pids."""
    calls, pids = tmp_path / "calls.jsonl", tmp_path / "pids"
    pids.mkdir()
    path = tmp_path / "vllm"
    path.write_text(FAKE_VLLM.format(python=sys.executable, calls=str(calls), pids=str(pids), max_len=FAKE_MAX_LEN))
    path.chmod(0o755)
    return path, calls, pids
