"""Prompts of the text workloads (`workloads.TEXT_WORKLOADS`, e.g. copy-heavy, and the prompt files of
workloads.prompt_files: `prompts:FILE` and the shipped prompt sets, and mixtures with a prompt-file component,
workloads.text_mixtures): their point is what the prompt says, so each
request's text is sent as it is (a user message on the chat endpoint, the raw text on completions) and its input
length is counted with the target's tokenizer, chat template included."""

from __future__ import annotations

from typing import Any

from workloads.spec import RequestSpec, SynthesizedPrompt
from workloads.synthesis import chat_prompt_len

DEFAULT_OUTPUT_LEN = 128


def text_prompts(
    name: str, endpoint: str, output_len: int | None, tokenizer: Any, n: int, seed: int, salt: str
) -> tuple[list[RequestSpec], list[SynthesizedPrompt]]:
    """`n` requests of the text workload `name` for `endpoint` (completions | chat). A non-empty `salt` starts every
    prompt (`[salt] `), so a point does not hit the prefix cache the previous point warmed with the same texts."""
    import workloads
    from workloads.prompt_files import is_prompt_workload, prompt_file_prompts
    from workloads.text_mixtures import is_text_mixture, mixture_prompts

    if is_prompt_workload(name):
        return prompt_file_prompts(name, endpoint, output_len, tokenizer, n, seed, salt)
    if is_text_mixture(name):
        return mixture_prompts(name, endpoint, output_len, tokenizer, n or workloads.DEFAULT_NUM_REQUESTS, seed, salt)
    texts = workloads.load_texts(name, num_requests=n, seed=seed, output_len=output_len or DEFAULT_OUTPUT_LEN)
    specs: list[RequestSpec] = []
    prompts: list[SynthesizedPrompt] = []
    for request in texts:
        text = f"[{salt}] {request.prompt}" if salt else request.prompt
        if endpoint == "chat":
            messages: list[dict] | None = [{"role": "user", "content": text}]
            prompt = None
            input_len = chat_prompt_len(tokenizer, messages)
        else:
            messages, prompt = None, text
            input_len = len(tokenizer(text, add_special_tokens=True)["input_ids"])
        specs.append(RequestSpec(input_len=input_len, output_len=request.output_len))
        prompts.append(SynthesizedPrompt(prompt, messages, input_len, request.output_len))
    return specs, prompts
