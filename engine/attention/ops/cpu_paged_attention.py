"""The C++ paged-attention decode kernel for the CPU (cpu_paged_attention.cpp): JIT-built once, cached on disk.

`load_cpu_decode_kernel()` builds the extension with torch.utils.cpp_extension.load (g++ and ninja, -O3
-march=native -fopenmp) the first time a process asks, into `extension_dir()`: $TORCH_EXTENSIONS_DIR when set, else
~/.cache/servelab/torch_extensions, in a folder named for the Python and torch versions and a hash of the CPU's
flags (a native build must not be reused on another CPU). Later starts find the library there and only load it.
A build logs one line with its time. When the build or the load fails (no compiler, bad headers), it warns once
with the reason and returns None for the rest of the process: the caller uses the torch decode path.

`python -m engine.attention.ops.cpu_paged_attention` builds it ahead (`make install` runs it) and says where.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_paged_attention.cpp")
EXTENSION_NAME = "servelab_cpu_attention"
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
STALE_LOCK_SECONDS = 600  # a build lock this old belongs to a build that was killed: cpp_extension would wait forever

DecodeKernel = Callable[..., None]
_loaded: tuple[DecodeKernel | None] | None = None  # memo: (kernel or None), None = not tried yet in this process


def _cpu_flags_hash() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def extension_dir() -> Path:
    """Where the extension is built and cached (one folder per Python, torch and CPU flags)."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "servelab" / "torch_extensions")
    python, version = f"py{sys.version_info[0]}{sys.version_info[1]}", torch.__version__.replace("+", "_")
    return Path(base) / f"{EXTENSION_NAME}-{python}-torch{version}-cpu{_cpu_flags_hash()}"


def _libraries(directory: Path) -> dict[Path, float]:
    return {path: path.stat().st_mtime for path in directory.glob(f"{EXTENSION_NAME}*.so")}


def _build() -> DecodeKernel:
    """Build (or find built) and load the extension; raises when that fails."""
    from torch.utils import cpp_extension

    directory = extension_dir()
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
        logger.warning("removing a stale build lock %s (a build that was killed)", lock)
        lock.unlink(missing_ok=True)
    before = _libraries(directory)
    start = time.perf_counter()
    cpp_extension.load(
        name=EXTENSION_NAME, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
        build_directory=str(directory), is_python_module=False, verbose=False,
    )  # fmt: skip
    if _libraries(directory) != before:
        seconds = time.perf_counter() - start
        logger.info("built the CPU paged-attention kernel in %.1f s (cached in %s)", seconds, directory)
    return torch.ops.servelab_cpu.paged_decode_attention


def load_cpu_decode_kernel() -> DecodeKernel | None:
    """torch.ops.servelab_cpu.paged_decode_attention, built on first use; None (warned once) when it cannot be."""
    global _loaded
    if _loaded is None:
        try:
            _loaded = (_build(),)
        except Exception as error:  # noqa: BLE001 - any build or load failure means: use the torch path
            reason = " ".join(str(error).split())
            if len(reason) > 600:
                reason = reason[:200] + " ... " + reason[-400:]
            logger.warning(
                "the CPU paged-attention kernel is unavailable (%s: %s); decode attention uses the torch path",
                type(error).__name__, reason,
            )  # fmt: skip
            _loaded = (None,)
    return _loaded[0]


def reset_for_tests() -> None:
    """Forget this process's load attempt, so the next call tries again (the fallback tests force a failure)."""
    global _loaded
    _loaded = None


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[cpu-kernel] %(message)s")
    kernel = load_cpu_decode_kernel()
    if kernel is None:
        print("[cpu-kernel] not built: the engine will use the torch decode attention on the CPU")
    else:
        print(f"[cpu-kernel] ready in {extension_dir()}")
    return 0  # no compiler is not an install error: the engine falls back


if __name__ == "__main__":
    raise SystemExit(main())
