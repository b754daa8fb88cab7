"""Engine knobs as `bench` options under vLLM's flag names, declared once for serve, throughput and sweep.

Each is `None` by default: an unset knob keeps the engine config's own default.
"""

from __future__ import annotations

from typing import Annotated

import typer

ENGINE_PANEL = "Engine knobs"

Dtype = Annotated[str | None, typer.Option(help="auto | float32 | bfloat16 | float16", rich_help_panel=ENGINE_PANEL)]
Device = Annotated[str | None, typer.Option(help="auto | cpu | cuda", rich_help_panel=ENGINE_PANEL)]
MaxModelLen = Annotated[
    int | None, typer.Option(help="Context length (default: the model's).", rich_help_panel=ENGINE_PANEL)
]
MaxNumSeqs = Annotated[int | None, typer.Option(help="Most requests in one batch.", rich_help_panel=ENGINE_PANEL)]
MaxNumBatchedTokens = Annotated[
    int | None, typer.Option(help="Token budget of one engine step.", rich_help_panel=ENGINE_PANEL)
]
EnablePrefixCaching = Annotated[
    bool | None,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="Reuse KV blocks of shared prefixes.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
EnableChunkedPrefill = Annotated[
    bool | None,
    typer.Option(
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="Split long prompts across steps.",
        rich_help_panel=ENGINE_PANEL,
    ),
]
BlockSize = Annotated[int | None, typer.Option(help="Tokens per KV block.", rich_help_panel=ENGINE_PANEL)]
GpuMemoryUtilization = Annotated[
    float | None,
    typer.Option(
        help="Memory fraction for weights + activations + KV cache (CPU: of available RAM).",
        rich_help_panel=ENGINE_PANEL,
    ),
]
NumGpuBlocksOverride = Annotated[
    int | None, typer.Option(help="KV-cache size in blocks (skips memory sizing).", rich_help_panel=ENGINE_PANEL)
]
