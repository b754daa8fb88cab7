"""The executor seam: what EngineCore needs from whatever runs the model for it.

EngineCore schedules and samples; an executor sizes and owns the KV cache and turns one SchedulerOutput into the
logits rows the sampler needs. `ModelRunner` (engine/model_runner.py) is the in-process executor and the default.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.scheduler_output import SchedulerOutput


class Executor(Protocol):
    max_model_len: int
    eos_token_ids: list[int]
    vocab_size: int
    device: torch.device
    forward_mode: str  # for the start-up line: "compiled in 8.7 s", "eager (reason)"

    def determine_num_blocks(self, extra_block_bytes: int = 0) -> int:
        """The number of KV blocks of `cache_config.block_size` tokens the cache will hold. Each block also costs
        `extra_block_bytes` out of the same memory budget (a draft model's KV block: its pool has as many)."""
        ...

    def initialize_kv_cache(self, num_blocks: int) -> None: ...

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """float32 logits, `scheduler_output.logits_rows` of them: per scheduled request in batch order its
        prompt-logprob rows, then its sampling rows."""
        ...
