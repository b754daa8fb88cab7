"""EngineCore: the token-ids-only loop. step() = schedule → one forward pass → grammar bitmask → sample → update."""

from __future__ import annotations

import copy
import logging
import time

import torch

from engine.config import EngineConfig
from engine.executor import Executor
from engine.model_runner import ModelRunner
from engine.outputs import EngineCoreOutput, Logprob, SchedulerStats
from engine.prompt_logprobs import attach_prompt_logprobs, take_prompt_logprobs
from engine.request import Request
from engine.sampler import Sampler, SamplingMetadata
from engine.scheduler import Scheduler
from engine.spec_decode import SpeculativeDecoder
from engine.structured_output.manager import StructuredOutputManager, load_xgrammar_backend

logger = logging.getLogger(__name__)

_COMPILE_POLL_S = 0.05  # an engine whose only requests wait for grammars checks its inputs this often


class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor | None = None) -> None:
        """`executor` runs the model; the default is an in-process ModelRunner built from `config`, or with
        tensor_parallel_size > 1 a MultiprocExecutor (one worker process per rank)."""
        if executor is None and config.parallel_config.tensor_parallel_size > 1:
            from engine.executor.multiproc_executor import MultiprocExecutor

            executor = MultiprocExecutor(config)
        self.model_executor: Executor = executor if executor is not None else ModelRunner(config)
        self.config = config
        runner = self.model_executor
        self.max_model_len: int = runner.max_model_len  # the config's, resolved when it was built
        self.eos_token_ids: list[int] = list(runner.eos_token_ids)
        self.vocab_size: int = runner.vocab_size
        self.forward_mode: str = runner.forward_mode  # "compiled in 8.7 s" or "eager (reason)"
        # NoSpeculation when off. A draft model loads before the sizing: its weights and KV share the target's budget.
        self.spec_decoder = SpeculativeDecoder.from_config(config)
        self.num_gpu_blocks = runner.determine_num_blocks(extra_block_bytes=self.spec_decoder.draft_block_bytes)
        runner.initialize_kv_cache(self.num_gpu_blocks)
        self.spec_decoder.initialize_kv_cache(self.num_gpu_blocks)
        self.scheduler = Scheduler(config, self.num_gpu_blocks)
        self.sampler = Sampler(runner.device, config.model_config.seed)
        self._generators: dict[str, torch.Generator] = {}  # per seeded request, dropped when it finishes
        self._step_delay_s = config.scheduler_config.inject_step_delay_ms / 1000.0
        self.structured_output_manager = StructuredOutputManager(
            lambda: load_xgrammar_backend(config, self.vocab_size, self.eos_token_ids),
            self.vocab_size,
            config=config.structured_outputs_config,
        )
        self.scheduler.structured_output_manager = self.structured_output_manager

    def add_request(self, request: Request) -> None:
        """Queue a request built by engine.processor.Processor (which validated its token ids, seed and EOS ids);
        raises ValueError (and keeps nothing) if it can never run in this KV cache."""
        self.scheduler.add_request(request)
        self.structured_output_manager.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish the requests now (status FINISHED_ABORTED) and free their KV blocks."""
        for request in self.scheduler.finish_requests(request_ids):
            self._generators.pop(request.request_id, None)
        self.structured_output_manager.remove(request_ids)
        self.spec_decoder.free(request_ids)

    def step(self) -> list[EngineCoreOutput]:
        if not self.scheduler.has_unfinished_requests():
            return []
        failed = self._finish_failed_grammars()
        self.spec_decoder.propose(self.scheduler.running, self._generators)
        scheduler_output = self.scheduler.schedule()
        self.spec_decoder.after_schedule(scheduler_output, self.scheduler.requests)
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        self.structured_output_manager.rebuild(scheduler_output.preempted_request_ids)
        if scheduler_output.is_empty:
            if not self.scheduler.running:
                if self.structured_output_manager.num_tracked or failed:  # idle until a grammar compiles
                    self.structured_output_manager.wait_for_compiles(_COMPILE_POLL_S)
                    return failed
                raise RuntimeError("the scheduler can admit no waiting request into an idle engine (a bug)")
            return failed
        sampling = scheduler_output.sampling_requests()
        layout = scheduler_output.logits_rows
        logits = take_prompt_logprobs(scheduler_output, self.model_executor.execute_model(scheduler_output))
        if self._step_delay_s:
            spin(self._step_delay_s)
        sampled_token_ids: list[list[int]] = []
        logprobs: list[list[list[Logprob]] | None] | None = None
        if sampling:
            rows = [(s.request, s.spec_token_ids[:j]) for s in sampling for j in range(1 + len(s.spec_token_ids))]
            metadata = SamplingMetadata.build(
                [request for request, _ in rows],
                self.vocab_size,
                logits.device,
                self._generators,
                draft_prefixes=[drafts for _, drafts in rows],
            )
            grammar = self.structured_output_manager.fill_bitmask(sampling, layout)
            if grammar is not None:
                metadata.grammar_bitmask, metadata.grammar_rows = grammar
            sampler_output = self.spec_decoder.sample(self.sampler, logits, metadata, sampling)
            logprobs = []
            for index, scheduled in enumerate(sampling):
                rows_of = layout.sample_rows(index)
                accepted = accept_drafts(scheduled.spec_token_ids, sampler_output.sampled_token_ids[rows_of])
                sampled_token_ids.append(accepted)
                self.spec_decoder.observe(scheduled, accepted)
                row_logprobs = sampler_output.logprobs[rows_of.start : rows_of.start + len(accepted)]
                logprobs.append(None if row_logprobs[0] is None else row_logprobs)  # type: ignore[arg-type]
        outputs = self.scheduler.update_from_output(scheduler_output, sampled_token_ids, logprobs)
        attach_prompt_logprobs(scheduler_output, outputs)
        self.structured_output_manager.advance(sampling)
        self.spec_decoder.free([output.request_id for output in outputs if output.finish_reason is not None])
        return failed + outputs

    def _finish_failed_grammars(self) -> list[EngineCoreOutput]:
        """Abort the requests whose grammar failed to compile (the API validated it, so this is rare); the
        compiler's message is the output's stop_reason."""
        failed = self.structured_output_manager.failed_compiles()
        if not failed:
            return []
        outputs = []
        for request in self.scheduler.finish_requests(list(failed)):
            logger.error("request %s: %s", request.request_id, failed[request.request_id])
            outputs.append(
                EngineCoreOutput(
                    request.request_id, [], finish_reason="abort", stop_reason=failed[request.request_id],
                    timing=request.timing, num_prompt_tokens=request.num_prompt_tokens,
                )
            )  # fmt: skip
        self.structured_output_manager.remove(list(failed))
        return outputs

    def check_health(self) -> None:
        """Raise if the executor can no longer run steps (a tensor-parallel rank died); an executor without
        `check_health` runs in this process and is healthy while this runs."""
        check = getattr(self.model_executor, "check_health", None)
        if check is not None:
            check()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        stats = self.scheduler.get_stats()
        stats.spec_decoding_stats = copy.deepcopy(self.spec_decoder.stats)
        return stats

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()


def accept_drafts(drafts: list[int], row_tokens: list[int]) -> list[int]:
    """The tokens a step adds: each draft while it equals the target's token at its row, then the target's token
    at the first row that disagrees (or the bonus row after the last draft).

    Exact for greedy rows, and for sampled rows when a draft is a point mass (prompt lookup): accepting the sample
    x ~ p when x equals the draft d accepts with probability p(d), and on rejection x is distributed as p
    restricted to tokens other than d, which is what rejection sampling prescribes for q = delta(d).
    """
    num_accepted = 0
    while num_accepted < len(drafts) and drafts[num_accepted] == row_tokens[num_accepted]:
        num_accepted += 1
    return drafts[:num_accepted] + [row_tokens[num_accepted]]


def spin(seconds: float) -> None:
    """Busy-wait, not sleep: a sub-millisecond sleep overshoots by its wake-up latency (measured: a 0.25 ms sleep
    slowed 1.5 ms steps by 35-46 %), and a real slow-down costs CPU time too."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
