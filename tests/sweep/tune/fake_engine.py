"""A fake OpenAI engine for the tuner tests: `bench lab mock-server`, plus a fault chosen by its knob value.

    python fake_engine.py --port P --max-num-seqs N --faults 3=crash,5=oom,7=hang,9=oomkill

With `--max-num-seqs` named in `--faults`, the first completion request sets the fault off while it streams:
`crash` exits with code 1, `oom` writes PyTorch's CUDA out-of-memory error and exits with code 1, `oomkill` is
SIGKILLed as by the kernel's OOM killer, and `hang` stops answering anything (its event loop blocks; SIGTERM still
ends it). Any other value serves like the mock. With `--pid-dir D` it leaves an empty file `D/<its pid>`, so a
test can check that every engine ever launched is gone. The tuner launches it through `--launch-command`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from sweep.mock.server import MockConfig, MockServer  # noqa: E402

FAULTS = ("crash", "oom", "oomkill", "hang")
FAULT_DELAY_S = 0.02  # the stream (10 ms a token) is under way when the fault strikes


def strike(fault: str) -> None:
    if fault == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(3600)
    if fault == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
    if fault == "oomkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)


class FaultyServer(MockServer):
    def __init__(self, config: MockConfig, fault: str | None) -> None:
        super().__init__(config)
        self.fault = fault

    async def generate(self, conn, raw: bytes, arrival: float, chat: bool) -> None:  # type: ignore[no-untyped-def]
        if self.fault is not None:
            asyncio.get_running_loop().call_later(FAULT_DELAY_S, strike, self.fault)
            self.fault = None
        await super().generate(conn, raw, arrival, chat)


async def serve(config: MockConfig, fault: str | None) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    server = FaultyServer(config, fault)
    async with await loop.create_server(server.protocol, config.host, config.port):
        await stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--faults", default="", help="VALUE=FAULT,... with FAULT one of " + ", ".join(FAULTS))
    parser.add_argument("--pid-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.pid_dir is not None:
        args.pid_dir.mkdir(parents=True, exist_ok=True)
        (args.pid_dir / str(os.getpid())).touch()
    faults = {int(k): v for k, _, v in (item.partition("=") for item in args.faults.split(",") if item)}
    assert set(faults.values()) <= set(FAULTS), faults
    print(f"fake engine: max_num_seqs={args.max_num_seqs} fault={faults.get(args.max_num_seqs)}", flush=True)
    asyncio.run(serve(MockConfig(port=args.port, ttft_ms=1, itl_ms=10), faults.get(args.max_num_seqs)))


if __name__ == "__main__":
    main()
