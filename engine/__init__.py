"""servelab's engine: a paged, continuously batching LLM engine with vLLM's vocabulary.

`from engine import LLM, SamplingParams, StructuredOutputsParams`. LLM is imported on first use, so importing
the package (and SamplingParams) stays cheap: no torch, no transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputsParams

if TYPE_CHECKING:
    from engine.llm import LLM

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
