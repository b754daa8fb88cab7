"""A point's prompts as the client sends them: the workload's requests (workloads.load, or a text workload, or a
replayed trace) synthesized to exact lengths, each with its structured-output constraint; and, after the point,
whether each constrained output validated."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.point.client import PromptRequest
from sweep.point.records import RequestRecord
from workloads.structured import make_constraint, output_is_valid

if TYPE_CHECKING:
    from sweep.point.runner import WorkloadConfig
    from workloads.spec import SynthesizedPrompt


def prompt_requests(
    synthesized: list[SynthesizedPrompt], workload: WorkloadConfig | None = None, seed: int = 0
) -> list[PromptRequest]:
    """The client's requests, numbered in order; with `workload`, each carries its structured-output constraint
    (the spec's schema, or one drawn for `workload.structured_output`)."""
    return [
        PromptRequest(index=i, prompt=s.prompt, messages=s.messages, input_len=s.input_len, output_len=s.output_len,
                      constraint=None if workload is None else make_constraint(
                          i, s.schema, workload.structured_output, workload.structured_output_shape, seed,
                          output_len=s.output_len), request_class=getattr(s, "request_class", None))
        for i, s in enumerate(synthesized)
    ]  # fmt: skip


def is_trace_file(workload: WorkloadConfig) -> bool:
    """Whether the workload is a trace file (not a shipped mix): only then does loading it need a tokenizer."""
    import workloads

    return workload.workload not in workloads.shipped_names() and Path(workload.workload).expanduser().is_file()


def workload_specs(workload: WorkloadConfig, n: int, seed: int, tokenizer: Any = None) -> tuple[list[Any], Any]:
    """(specs, fit report) of the workload's first `n` requests, fitted to its max_model_len (`workloads.load`);
    a trace file needs the `tokenizer`."""
    import workloads

    specs = workloads.load(
        workload.workload,
        num_requests=n,
        seed=seed,
        input_len=workload.input_len,
        output_len=workload.output_len,
        range_ratio=workload.range_ratio,
        max_model_len=workload.max_model_len,
        fit_policy=workload.fit_policy,
        **({"tokenizer": tokenizer} if tokenizer is not None else {}),
    )
    return specs, workloads.last_fit_report() if hasattr(workloads, "last_fit_report") else None


def build_prompts(
    workload: WorkloadConfig, tokenizer: Any, n: int, salt: str, seed_offset: int = 0
) -> tuple[list[Any], list[PromptRequest], Any]:
    """(specs, prompts, fit report) of `n` requests of the workload."""
    import workloads

    seed = workload.seed + seed_offset
    if workloads.is_text_workload(workload.workload):
        from workloads.text_workloads import text_prompts

        specs, texts = text_prompts(
            workload.workload, workload.endpoint, workload.output_len, tokenizer, n, seed, salt
        )
        return specs, prompt_requests(texts), None
    specs, fit_report = workload_specs(workload, n, seed, tokenizer if is_trace_file(workload) else None)
    synthesized = workloads.synthesize(specs, tokenizer, endpoint=workload.endpoint, seed=seed, salt=salt)
    return specs, prompt_requests(synthesized, workload, seed), fit_report


def replay_prompts(
    workload: WorkloadConfig, tokenizer: Any, time_scale: float, num_prompts: int | None, duration: float | None,
    salt: str,
) -> tuple[list[Any], list[PromptRequest], Any, list[float]]:
    """(specs, prompts, fit report, send offsets) of the trace's first requests, replayed at `time_scale`
    (workloads.replay)."""
    from workloads.replay import replay_requests

    specs, synthesized, fit_report, offsets = replay_requests(
        workload.workload, tokenizer, time_scale, num_prompts, duration, workload.seed, workload.endpoint, salt,
        max_model_len=workload.max_model_len, fit_policy=workload.fit_policy,
    )  # fmt: skip
    return specs, prompt_requests(synthesized), fit_report, offsets


def tag_classes(records: list[RequestRecord], prompts: dict[int, Any]) -> None:
    """Give every record its prompt's request class (`prompts` by index), for per-class SLOs."""
    for record in records:
        record.request_class = getattr(prompts.get(record.index), "request_class", None)


def check_slo_classes(
    workload: WorkloadConfig, slo: dict[str, float] | None, n: int | None, tokenizer: Any = None
) -> None:
    """ValueError when the SLO names a class that none of the workload's first `n` requests carries (a typo would
    otherwise judge no request by that class's limits)."""
    import workloads
    from sweep.point.benchmark_metrics import slo_classes

    wanted = slo_classes(slo)
    if not wanted:
        return
    present: list[str] = []
    if workloads.prompt_files.is_prompt_workload(workload.workload):  # a prompt file's rows may carry classes
        present = workloads.prompt_files.read_prompt_file(workload.workload).classes
    elif workloads.text_mixtures.is_text_mixture(workload.workload):  # its rows' classes and its components' names
        present = workloads.text_mixtures.mixture_classes(workload.workload, workload.seed)
    elif not workloads.is_text_workload(workload.workload):
        specs, _ = workload_specs(workload, n, workload.seed, tokenizer if is_trace_file(workload) else None)
        present = sorted({s.request_class for s in specs if s.request_class is not None})
    unknown = [name for name in wanted if name not in present]
    if unknown:
        none = "it carries none (a trace's class column, a prompt file's class field, or a mixture)"
        have = f"its classes are {present}" if present else none
        raise ValueError(f"--slo names unknown class(es) {unknown}: workload {workload.workload!r}: {have}")


def check_outputs(records: list[RequestRecord], prompts: dict[int, Any]) -> None:
    """Set `output_valid` on every successful request that carried a constraint (`prompts` by index)."""
    for record in records:
        prompt = prompts.get(record.index)
        constraint = getattr(prompt, "constraint", None)
        if constraint is not None and record.success:
            record.output_valid = output_is_valid(constraint, record.generated_text)
