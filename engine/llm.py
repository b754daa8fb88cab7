"""The offline API, shaped like vLLM's: `LLM(model, **knobs).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

PromptType = str | dict[str, Any]


def _prompt_of(prompt: Any) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return str(prompt["prompt"])
    raise TypeError(
        f"a prompt must be a string or a dict with 'prompt_token_ids' (or 'prompt'), got {type(prompt).__name__}"
    )


class LLM:
    def __init__(self, model: str = "smollm2-135m", **knobs: Any) -> None:
        self.llm_engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=model, **knobs))
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        progress: bool | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; one RequestOutput per prompt, in the prompts' order, holding the
        prompt's n completions (SamplingParams.n) in index order.

        `progress` is an alias of `use_tqdm` (vLLM's name); either False hides the progress bar.
        """
        prompt_list = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        if sampling_params is None:
            params_list = [SamplingParams()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"{len(params_list)} sampling_params for {len(prompt_list)} prompts")
        engine = self.llm_engine
        request_ids: list[str] = []
        try:
            for prompt, params in zip(prompt_list, params_list, strict=True):
                request_id = str(next(self._request_counter))
                engine.add_request(request_id, _prompt_of(prompt), params)
                request_ids.append(request_id)
        except (ValueError, TypeError) as error:
            engine.abort_request(request_ids)  # leave the engine as it was
            raise type(error)(f"prompt {len(request_ids)}: {error}") from error
        finished = self._run(len(request_ids), show=use_tqdm if progress is None else progress)
        return [finished[request_id] for request_id in request_ids]

    def _run(self, num_requests: int, show: bool) -> dict[str, RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        num_prompt_tokens = num_output_tokens = 0
        start = time.perf_counter()
        with Progress(
            TextColumn("[bold]Processed prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[speed]}"),
            console=Console(stderr=True),
            disable=not show,
            transient=False,
        ) as bar:
            task = bar.add_task("generate", total=num_requests, speed="")
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        num_prompt_tokens += len(output.prompt_token_ids)
                        num_output_tokens += sum(len(completion.token_ids) for completion in output.outputs)
                        bar.advance(task)
                elapsed = max(time.perf_counter() - start, 1e-9)
                speed = f"input {num_prompt_tokens / elapsed:.1f} tok/s, output {num_output_tokens / elapsed:.1f} tok/s"
                bar.update(task, speed=speed)
        return finished
