"""An executor that runs no model: each step advances a virtual clock by the cost model's time for its shape.

EngineCore(config, executor=SimulatedExecutor(...)) is the real engine core with the real Scheduler, KV manager
and block pool; only the forward pass is replaced. The logits it returns put all their mass on one token, over a
small vocabulary (`vocab_size`, 8 by default) rather than the model's: building and arg-maxing full-vocabulary
rows every step would cost more CPU than the scheduler itself and change nothing the simulation measures. With
greedy sampling and `ignore_eos` (how `bench sweep` runs a workload to its lengths) a token's value changes no
scheduling decision: only how many tokens each request gets does, and that is the same as with the model.
"""

from __future__ import annotations

import torch

from engine.executor.cost_model import CostModel, StepShape
from engine.scheduler_output import SchedulerOutput


class VirtualClock:
    """Seconds of simulated time; the executor advances it, the simulation driver reads it and jumps it forward."""

    def __init__(self) -> None:
        self.now = 0.0


class SimulatedExecutor:
    def __init__(
        self,
        cost_model: CostModel,
        num_blocks: int,
        max_model_len: int,
        clock: VirtualClock | None = None,
        vocab_size: int = 8,
        token_id: int = 1,
        eos_token_id: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"the simulated KV cache needs at least one block, got {num_blocks}")
        if not 0 <= token_id < vocab_size or token_id == eos_token_id:
            raise ValueError(f"token_id must be a non-EOS id below vocab_size={vocab_size}, got {token_id}")
        self.cost_model = cost_model
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.eos_token_ids = [eos_token_id]
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")
        self.forward_mode = "simulated (no model)"
        self.clock = clock if clock is not None else VirtualClock()
        self.token_id = token_id
        self.num_steps = 0
        self.busy_time = 0.0  # simulated seconds spent in steps
        self._rows = torch.zeros(0, vocab_size)

    def determine_num_blocks(self, extra_block_bytes: int = 0) -> int:
        """The fixed size it was built with (the simulation refuses speculative decoding, so no draft KV)."""
        return self.num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        if num_blocks != self.num_blocks:
            raise ValueError(f"the simulated KV cache has {self.num_blocks} blocks, not {num_blocks}")

    def step_time(self, scheduler_output: SchedulerOutput) -> float:
        return self.cost_model.step_time(StepShape.of(scheduler_output))

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """Advance the clock by the step's predicted time; `logits_rows.num_rows` one-hot rows on `token_id`."""
        seconds = self.step_time(scheduler_output)
        self.clock.now += seconds
        self.busy_time += seconds
        self.num_steps += 1
        rows = scheduler_output.logits_rows.num_rows
        if self._rows.shape[0] < rows:  # grown, never rebuilt per step
            self._rows = torch.zeros(max(rows, 2 * self._rows.shape[0]), self.vocab_size)
            self._rows[:, self.token_id] = 1.0
        return self._rows[:rows]
