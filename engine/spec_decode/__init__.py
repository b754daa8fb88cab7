"""Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the exact rejection sampler.

`SpeculativeDecoder` is what EngineCore calls: `propose` before the scheduler plans a step (it fills
`Request.spec_token_ids`), `sample` for the step's logits rows, `observe` with each request's accepted tokens, and
`free` when requests finish or are preempted; with speculation off it is `NoSpeculation`, which does
nothing. The multi-token step contract itself (scheduling drafts, KV slots,
logits rows, accept_drafts) is the engine's: docs/ARCHITECTURE.md, "The step contract".
The knob's parsed form, `SpeculativeConfig`, is in config.py. Importing the package (or config.py) loads no torch:
the decoder loads on first use of `SpeculativeDecoder` / `NoSpeculation`, so engine/config.py can import the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.spec_decode.speculative_decoder import NoSpeculation, SpeculativeDecoder

__all__ = ["NoSpeculation", "SpeculativeDecoder"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from engine.spec_decode import speculative_decoder

        return getattr(speculative_decoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
