"""The engine's side of structured outputs, as vLLM v1's StructuredOutputManager.

* Compiling: a request with `sampling_params.structured_outputs` starts (or joins) the compile of its grammar on a
  background thread, with the engine's `structured_outputs_config` defaults filled in where the request left a
  field unset (structured_output/config.py); compiled grammars are cached by (kind, spec), so a repeated schema
  costs nothing. Until its grammar is ready the request waits in status WAITING_FOR_FSM and the scheduler passes
  over it; other requests run. The tokenizer and xgrammar's vocabulary tables are loaded on that thread too, on
  the first structured request.
* Masking: each step, `fill_bitmask` fills one bitmask row per sampling row (the step's `LogitsRows`) of every
  constrained request (the row after draft j sees the grammar advanced through drafts 0..j-1, then rolled back);
  unconstrained rows are not touched (the sampler applies the mask to the constrained rows only).
* Advancing: a matcher has consumed exactly its request's output tokens. `advance` feeds it the tokens the step
  appended (accepted drafts and the target's token), never a rejected draft. After a preemption the matcher is
  rebuilt from those output tokens (`rebuild`).

Per request, RequestTiming records the grammar wait (`grammar_compile_time`: from add_request until the compiled
grammar was ready, 0 for a cached grammar) and the time spent filling its bitmask rows (`grammar_bitmask_time`
over `num_grammar_bitmask_steps` steps).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig
from engine.request import Request, RequestStatus
from engine.scheduler_output import LogitsRows, ScheduledRequest
from engine.structured_output.backend_xgrammar import XgrammarBackend, compiler_message
from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

CompileResult = tuple[Any, float]  # (xgrammar CompiledGrammar, time.monotonic() when it was ready)


@dataclass
class GrammarState:
    """One request's grammar: the compile it waits on, then its matcher."""

    future: Future[CompileResult]
    added_time: float
    matcher: Any = None  # xgrammar GrammarMatcher, built when the request first samples
    num_accepted: int = 0  # output tokens the matcher has consumed
    broken: bool = False  # the matcher refused a token (only if a row had no allowed token): unconstrained since


class StructuredOutputManager:
    def __init__(
        self,
        load_backend: Callable[[], XgrammarBackend],
        vocab_size: int,
        max_cache_entries: int = 512,
        config: StructuredOutputsConfig | None = None,
    ) -> None:
        """`load_backend` builds the xgrammar backend (tokenizer included); it runs once, on the compile thread.
        `config` (the engine's `structured_outputs_config`) fills in what a request's params leave unset."""
        self.config = config or StructuredOutputsConfig()
        self._load_backend = load_backend
        self._backend: XgrammarBackend | None = None
        self.vocab_size = vocab_size
        self.max_cache_entries = max_cache_entries
        self._executor: ThreadPoolExecutor | None = None
        self._cache: OrderedDict[tuple[str, str], Future[CompileResult]] = OrderedDict()
        self._lock = threading.Lock()  # the backend is built once, by whichever compile comes first
        self._states: dict[str, GrammarState] = {}
        self.num_compiles = 0  # grammars compiled (cache misses)

    # ------------------------------------------------------------------------------------------- compiling

    def add_request(self, request: Request) -> None:
        """Start (or join) the compile of `request`'s grammar; it waits in WAITING_FOR_FSM until that is done."""
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        future = self._compile(self.config.apply(params))
        self._states[request.request_id] = GrammarState(future, time.monotonic())
        if not self.grammar_ready(request):
            request.status = RequestStatus.WAITING_FOR_FSM

    def _compile(self, params: StructuredOutputsParams) -> Future[CompileResult]:
        key = params.key
        future = self._cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self._cache.move_to_end(key)
            return future
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-grammar-compile")
        future = self._executor.submit(self._compile_now, params)
        self.num_compiles += 1
        self._cache[key] = future
        while len(self._cache) > self.max_cache_entries:
            self._cache.popitem(last=False)
        return future

    def _compile_now(self, params: StructuredOutputsParams) -> CompileResult:
        with self._lock:
            if self._backend is None:
                self._backend = self._load_backend()
        return self._backend.compile(params), time.monotonic()

    def grammar_ready(self, request: Request) -> bool:
        """Whether `request` may be scheduled: its grammar compiled (or it has none). On the first True for a
        request that waited, its status goes back to WAITING and its grammar wait is recorded."""
        state = self._states.get(request.request_id)
        if state is None:
            return True
        if not state.future.done() or state.future.exception() is not None:
            return False
        if request.timing.grammar_compile_time is None:
            ready_time = state.future.result()[1]
            request.timing.grammar_compile_time = max(0.0, ready_time - state.added_time)
        if request.status == RequestStatus.WAITING_FOR_FSM:
            request.status = RequestStatus.WAITING
        return True

    def failed_compiles(self) -> dict[str, str]:
        """request id → the compiler's message, for every tracked request whose grammar failed to compile."""
        failed = {}
        for request_id, state in self._states.items():
            if state.future.done() and (error := state.future.exception()) is not None:
                failed[request_id] = f"grammar compilation failed: {compiler_message(error)}"  # type: ignore[arg-type]
        return failed

    def wait_for_compiles(self, timeout_s: float) -> None:
        """Block until some pending compile finishes or `timeout_s` passes (an engine with nothing else to run)."""
        pending = [s.future for s in self._states.values() if not s.future.done()]
        if pending:
            wait_futures(pending, timeout=timeout_s, return_when="FIRST_COMPLETED")

    # ------------------------------------------------------------------------------------------- masking

    def fill_bitmask(
        self, sampling: Sequence[ScheduledRequest], layout: LogitsRows
    ) -> tuple[torch.Tensor, list[int]] | None:
        """The step's bitmask ([num sampling rows, ceil(V/32)] int32, xgrammar's layout) and the sampling rows it
        constrains (`layout`'s, `sampling` being the step's sampling requests); None when none is constrained."""
        constrained: list[tuple[ScheduledRequest, GrammarState, int]] = []
        for scheduled, first_row in zip(sampling, layout.sample_starts, strict=True):
            state = self._states.get(scheduled.request.request_id)
            if state is not None and not state.broken:
                constrained.append((scheduled, state, first_row))
        if not constrained:
            return None
        assert self._backend is not None, "a constrained request was scheduled before its grammar compiled"
        bitmask = self._backend.allocate_bitmask(layout.num_sampling_rows)
        rows: list[int] = []
        for scheduled, state, first_row in constrained:
            start = time.perf_counter()
            request = scheduled.request
            self._sync(request.request_id, state, request)
            matcher, drafts = state.matcher, scheduled.spec_token_ids
            num_advanced = 0
            for j in range(len(drafts) + 1):
                if state.broken or matcher.is_terminated():
                    break  # after an EOS the grammar allows nothing more: leave the row unconstrained
                matcher.fill_next_token_bitmask(bitmask, first_row + j)
                rows.append(first_row + j)
                # A draft the grammar refuses cannot be sampled at its row, so the rows after it are never kept.
                if j == len(drafts) or not matcher.accept_token(drafts[j]):
                    break
                num_advanced += 1
            if num_advanced:
                matcher.rollback(num_advanced)
            request.timing.grammar_bitmask_time += time.perf_counter() - start
            request.timing.num_grammar_bitmask_steps += 1
        return bitmask, rows

    # ------------------------------------------------------------------------------------------- advancing

    def advance(self, sampling: Sequence[ScheduledRequest]) -> None:
        """After the scheduler appended the step's tokens: feed them to the matchers; forget finished requests."""
        for scheduled in sampling:
            request = scheduled.request
            state = self._states.get(request.request_id)
            if state is None:
                continue
            if request.is_finished:
                del self._states[request.request_id]
            elif state.matcher is not None:
                self._sync(request.request_id, state, request)

    def rebuild(self, request_ids: Sequence[str]) -> None:
        """Preempted requests: reset their matchers; the next step replays their output tokens into them."""
        for request_id in request_ids:
            state = self._states.get(request_id)
            if state is not None and state.matcher is not None:
                state.matcher.reset()
                state.num_accepted = 0
                state.broken = False

    def remove(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._states.pop(request_id, None)

    def _sync(self, request_id: str, state: GrammarState, request: Request) -> None:
        """Make the matcher have consumed exactly `request.output_token_ids`."""
        if state.matcher is None:
            assert self._backend is not None
            state.matcher = self._backend.new_matcher(state.future.result()[0])
        for token in request.output_token_ids[state.num_accepted :]:
            if state.broken or state.matcher.is_terminated():
                break
            if not state.matcher.accept_token(token):
                logger.warning("request %s: the grammar refused token %d; no longer constrained", request_id, token)
                state.broken = True
        state.num_accepted = request.num_output_tokens

    @property
    def num_tracked(self) -> int:
        return len(self._states)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def load_xgrammar_backend(config: EngineConfig, vocab_size: int, eos_token_ids: list[int]) -> XgrammarBackend:
    """The backend for the engine's model: its tokenizer (`tokenizer` knob, else the model's)."""
    from engine.tokenizer import get_tokenizer

    model_config = config.model_config
    return XgrammarBackend(get_tokenizer(model_config.tokenizer or model_config.model), vocab_size, eos_token_ids)
