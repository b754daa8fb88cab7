"""Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the exact rejection sampler.

`SpeculativeDecoder` is what EngineCore calls: `propose` before the scheduler plans a step (it fills
`Request.spec_token_ids`), `sample` for the step's logits rows, `observe` with each request's accepted tokens, and
`free` when requests finish or are preempted; with speculation off it is `NoSpeculation`, which does
nothing. The multi-token step contract itself (scheduling drafts, KV slots,
logits rows, accept_drafts) is the engine's: docs/ARCHITECTURE.md, "The step contract".
"""

from engine.spec_decode.speculative_decoder import NoSpeculation, SpeculativeDecoder

__all__ = ["NoSpeculation", "SpeculativeDecoder"]
