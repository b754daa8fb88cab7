"""`bench` sub-commands owned by this package. Import heavy modules inside each command."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from engine.benchmarks.throughput import WorkloadLoader


def register(
    app: typer.Typer,
    groups: dict[str, typer.Typer],
    load_workload: WorkloadLoader | None = None, load_texts: WorkloadLoader | None = None
) -> None:
    """Add this package's commands to the `bench` app; `bench throughput --workload` draws its lengths with
    `load_workload` (it reaches the command as its context's `obj`), `bench spec-decode` also takes text workloads
    from `load_texts`."""
    from engine.entrypoints.cli import serve

    app.command("serve")(serve)

    from engine.benchmarks.throughput import prepare_model, throughput

    app.command("throughput", context_settings={"obj": load_workload})(throughput)
    app.command("prepare-model")(prepare_model)

    from engine.benchmarks.tensor_parallel import throughput_tp

    app.command("throughput-tp")(throughput_tp)

    from engine.benchmarks.gpu_check import gpu_check

    app.command("gpu-check")(gpu_check)

    from engine.benchmarks.omp_wait_policy import omp_wait_policy

    app.command("omp-wait-policy")(omp_wait_policy)

    from engine.benchmarks.quality import quality

    app.command("quality")(quality)

    from engine.benchmarks.decode_speed import decode_speed

    app.command("decode-speed")(decode_speed)

    from engine.benchmarks.decode_profile import decode_profile

    app.command("decode-profile")(decode_profile)

    from engine.benchmarks.structured_outputs import structured_outputs_bench

    app.command("structured-outputs")(structured_outputs_bench)

    from engine.benchmarks.spec_decode import spec_decode

    loaders = None if load_workload is None or load_texts is None else (load_workload, load_texts)
    app.command("spec-decode", context_settings={"obj": loaders})(spec_decode)
