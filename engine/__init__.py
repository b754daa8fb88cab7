"""servelab's engine: a paged, continuously batching LLM engine with vLLM's vocabulary."""

from engine.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
