"""`bench` sub-commands owned by this package. Import heavy modules inside each command.

Top level: serve, throughput (with --vary). Groups: `bench model prepare`, `bench model export-hf`, `bench check
gpu`, `bench check quality`, `bench lab decode-profile`, `bench lab omp-wait-policy`, `bench lab structured-outputs`.
The old names are hidden aliases that print the new spelling; throughput-tp, decode-speed and spec-decode run their
old code (engine/lab/), now spelled `bench throughput --vary`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from engine.cli_options import renamed_command

if TYPE_CHECKING:
    from engine.benchmarks.throughput_run import WorkloadLoader


def register(
    app: typer.Typer,
    groups: dict[str, typer.Typer],
    load_workload: WorkloadLoader | None = None, load_texts: WorkloadLoader | None = None
) -> None:
    """Add this package's commands to the `bench` app; `bench throughput --workload` draws its lengths with
    `load_workload` and its text prompts with `load_texts` (they reach the command as its context's `obj`)."""
    from engine.entrypoints.cli import serve

    app.command("serve")(serve)

    from engine.benchmarks.throughput import prepare_model, throughput
    from engine.benchmarks.throughput_run import WorkloadLoaders

    loaders = None if load_workload is None or load_texts is None else WorkloadLoaders(load_workload, load_texts)
    app.command("throughput", context_settings={"obj": loaders})(throughput)
    groups["model"].command("prepare")(prepare_model)
    groups["model"].command("export-hf")(export_hf)
    app.command("prepare-model", hidden=True)(renamed_command(prepare_model, "bench model prepare"))

    from engine.benchmarks.gpu_check import gpu_check
    from engine.benchmarks.quality_command import quality

    groups["check"].command("gpu")(gpu_check)
    groups["check"].command("quality")(quality)
    app.command("gpu-check", hidden=True)(renamed_command(gpu_check, "bench check gpu"))
    app.command("quality", hidden=True)(renamed_command(quality, "bench check quality"))

    from engine.lab.decode_profile import decode_profile
    from engine.lab.omp_wait_policy import omp_wait_policy
    from engine.lab.structured_outputs import structured_outputs_bench

    for name, command in (("decode-profile", decode_profile), ("omp-wait-policy", omp_wait_policy),
                          ("structured-outputs", structured_outputs_bench)):  # fmt: skip
        groups["lab"].command(name)(command)
        app.command(name, hidden=True)(renamed_command(command, f"bench lab {name}"))

    from engine.lab.decode_speed import decode_speed
    from engine.lab.spec_decode import spec_decode
    from engine.lab.tensor_parallel import throughput_tp

    app.command("throughput-tp", hidden=True)(
        renamed_command(throughput_tp, "bench throughput --vary tensor_parallel_size=1,2")
    )
    app.command("decode-speed", hidden=True)(renamed_command(decode_speed, DECODE_SPEED))
    spec_loaders = None if loaders is None else (loaders.lengths, loaders.texts)
    app.command("spec-decode", hidden=True, context_settings={"obj": spec_loaders})(
        renamed_command(spec_decode, SPEC_DECODE)
    )


def export_hf(
    model: str = typer.Argument("smollm2-135m", help="Model alias, HF dir, .gguf file or hub id."),
    output_dir: Path = typer.Option(..., "--output-dir", help="Where the HF directory is written (new or empty)."),
) -> None:
    """Write MODEL as a plain float32 HF directory (config without quantization_config, safetensors, tokenizer)
    that vLLM and transformers load; the weights are the ones our engine serves, each checked equal after writing.
    A second call with the same output reuses the export. Prints the directory."""
    from engine.model_export import ExportError, check_output_dir
    from engine.model_export import export_hf as run_export
    from engine.model_files import ModelNotFoundError

    def log(line: str) -> None:
        typer.echo(f"[export-hf] {line}", err=True)

    try:
        check_output_dir(output_dir.expanduser())
    except ExportError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    try:
        result = run_export(model, output_dir, log=log)
    except (ExportError, ModelNotFoundError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2 if isinstance(error, ModelNotFoundError) else 1) from error
    typer.echo(str(result.path))


DECODE_SPEED = (
    "bench throughput --vary dtype=float32,bfloat16 --vary quantization=none,int8,int4 --num-prompts 3 "
    "--max-num-seqs 1 --input-len 32 --output-len 64 --temperature 0 (median TPOT: batch-1 decode)"
)
SPEC_DECODE = (
    "bench throughput --vary num_speculative_tokens=0,2,4,6 --vary max_num_seqs=1,8 --temperature 0 "
    "--workload copy-heavy"
)
