"""`bench` sub-commands owned by this package. Import heavy modules inside each command."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from engine.cli_options import renamed_command

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
    groups["model"].command("prepare")(prepare_model)
    app.command("prepare-model", hidden=True)(renamed_command(prepare_model, "bench model prepare"))

    from engine.benchmarks.tensor_parallel import throughput_tp

    app.command("throughput-tp")(throughput_tp)

    from engine.benchmarks.gpu_check import gpu_check

    groups["check"].command("gpu")(gpu_check)
    app.command("gpu-check", hidden=True)(renamed_command(gpu_check, "bench check gpu"))

    from engine.benchmarks.omp_wait_policy import omp_wait_policy

    groups["lab"].command("omp-wait-policy")(omp_wait_policy)
    app.command("omp-wait-policy", hidden=True)(renamed_command(omp_wait_policy, "bench lab omp-wait-policy"))

    from engine.benchmarks.quality import quality

    groups["check"].command("quality")(quality)
    app.command("quality", hidden=True)(renamed_command(quality, "bench check quality"))

    from engine.benchmarks.decode_speed import decode_speed

    app.command("decode-speed")(decode_speed)

    from engine.benchmarks.decode_profile import decode_profile

    groups["lab"].command("decode-profile")(decode_profile)
    app.command("decode-profile", hidden=True)(renamed_command(decode_profile, "bench lab decode-profile"))

    from engine.benchmarks.structured_outputs import structured_outputs_bench

    app.command("structured-outputs")(structured_outputs_bench)

    from engine.benchmarks.spec_decode import spec_decode

    loaders = None if load_workload is None or load_texts is None else (load_workload, load_texts)
    app.command("spec-decode", context_settings={"obj": loaders})(spec_decode)
