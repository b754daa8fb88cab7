"""The API process's hand-over in `bench simulate`: when a sent request reaches the engine.

A served request is read and parsed on the API process's event loop, tokenised on its one tokenizer thread
(engine/entrypoints/api_server.py), then handed over to the engine process. Both stages are serial, so requests
sent at once reach the engine one after another, and an idle engine starts its step with the first of them
(a 2047-token prompt then prefills alone for seconds). The model, with the profile's hand-over terms
(`hand_over_per_request` a, `hand_over_per_prompt_token` b, engine/executor/cost_model.py), for requests in the
order sent:

    parsed_i    = max(send_i, parsed_{i-1}) + a                 (the event loop)
    tokenised_i = max(parsed_i, tokenised_{i-1}) + b * prompt_i  (the tokenizer thread)
    handed_i    = max(tokenised_i, parsed_j for the last j sent before tokenised_i)

The last line is the event loop's order: it parses every request that reached it before it runs the callback that
hands a tokenised one over, so a burst of short prompts reaches the engine together, after all are parsed, and
long prompts one by one as each is tokenised. Measured on smollm2-135m (docs/SIMULATE.md): a few milliseconds for
a 128-token prompt, ~10 ms for 1536 tokens, serial.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Pending:
    tokenised: float
    request: Any
    record: Any


@dataclass
class ApiProcess:
    """The serial hand-over stage in front of a simulated engine; `send` in nondecreasing time order."""

    per_request: float
    per_prompt_token: float
    _loop_free: float = -math.inf
    _tokenizer_free: float = -math.inf
    _send_times: list[float] = field(default_factory=list)
    _parsed: list[float] = field(default_factory=list)  # nondecreasing, as the loop is serial
    _pending: deque[_Pending] = field(default_factory=deque)  # in send order, which is hand-over order

    def send(self, time: float, num_prompt_tokens: int, request: Any = None, record: Any = None) -> None:
        parsed = max(time, self._loop_free) + self.per_request
        self._loop_free = parsed
        self._tokenizer_free = max(parsed, self._tokenizer_free) + self.per_prompt_token * num_prompt_tokens
        self._send_times.append(time)
        self._parsed.append(parsed)
        self._pending.append(_Pending(self._tokenizer_free, request, record))

    def hand_over_time(self, tokenised: float) -> float:
        """When a request tokenised at `tokenised` is handed over, given the requests sent so far (exact once
        every request sent before `tokenised` has been sent)."""
        last = bisect.bisect_left(self._send_times, tokenised) - 1
        return max(tokenised, self._parsed[last]) if last >= 0 else tokenised

    def next_hand_over(self) -> float | None:
        return self.hand_over_time(self._pending[0].tokenised) if self._pending else None

    def handed_over(self, now: float) -> list[tuple[float, Any, Any]]:
        """(hand-over time, request, record) of every pending request handed over by `now`, in order."""
        done = []
        while self._pending:
            time = self.hand_over_time(self._pending[0].tokenised)
            if time > now:
                break
            pending = self._pending.popleft()
            done.append((time, pending.request, pending.record))
        return done


def replay(
    send_times: Sequence[float], prompt_tokens: Sequence[int], per_request: float, per_prompt_token: float
) -> list[float]:
    """Each request's hand-over time for requests sent at `send_times` (any order), by the model above."""
    order = sorted(range(len(send_times)), key=lambda i: send_times[i])
    api = ApiProcess(per_request, per_prompt_token)
    for i in order:
        api.send(send_times[i], prompt_tokens[i], request=i)
    handed = [0.0] * len(send_times)
    for time, i, _ in api.handed_over(math.inf):
        handed[i] = time
    return handed
