"""Batched sampling in vLLM's order, one tensor op per feature over the whole batch.

Order: grammar bitmask → raw logprobs (if asked) → min_tokens → penalties → greedy argmax → temperature
→ min_p → top-k/top-p → random sample. Logprobs are taken from the raw (bitmask-only) logits, as vLLM
does by default.

Rows: one per logits row, so a request that verifies k drafts has k + 1 consecutive rows; row j sees the
request's drafts before it as output tokens (penalties, min_tokens).

Per-request seeds: a seeded request owns a torch.Generator, advanced by exactly two uniforms per logits row of
that request, rows in position order (2 * (k + 1) in a step with k drafts), whether or not the row's token is
kept. Its samples therefore depend on its own tokens and drafts only, never on which requests share its batch;
unseeded rows draw from the engine-wide generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.outputs import Logprob
from engine.request import Request

_GREEDY_EPS = 1e-5  # same threshold as SamplingParams.is_greedy


@dataclass
class SamplingMetadata:
    """Everything the sampler needs for one step's rows, as batch tensors (row i = request i)."""

    temperature: torch.Tensor  # [B] float32; rows below _GREEDY_EPS are greedy
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None  # [B] int64, vocab_size where disabled; None if no row uses it
    top_p: torch.Tensor | None = None  # [B] float32, 1.0 where disabled
    min_p: torch.Tensor | None = None  # [B] float32, 0.0 where disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # random seeded rows only
    # Penalties (None when no row uses any): prompt/output token ids padded with vocab_size.
    prompt_token_ids: torch.Tensor | None = None  # [B, P] int64
    output_token_ids: torch.Tensor | None = None  # [B, O] int64
    repetition_penalties: torch.Tensor | None = None  # [B]
    frequency_penalties: torch.Tensor | None = None  # [B]
    presence_penalties: torch.Tensor | None = None  # [B]
    # (rows, token ids) masked to -inf: EOS and stop ids of requests still short of min_tokens.
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None = None
    num_logprobs: list[int | None] = field(default_factory=list)  # per row; None = not asked
    # Packed int32 [B, ceil(V/32)], bit set = allowed; filled by a grammar matcher (structured output).
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] | None = None  # the rows the bitmask constrains; None: every row

    @property
    def max_num_logprobs(self) -> int | None:
        asked = [n for n in self.num_logprobs if n is not None]
        return max(asked) if asked else None

    @classmethod
    def build(
        cls,
        requests: Sequence[Request],
        vocab_size: int,
        device: torch.device,
        generators: dict[str, torch.Generator],
        draft_prefixes: Sequence[list[int]] | None = None,
    ) -> SamplingMetadata:
        """Row i samples for `requests[i]` after its drafts `draft_prefixes[i]` (default: none).

        `generators` maps request id → its Generator; missing ones for seeded requests are created.
        """
        prefixes = draft_prefixes if draft_prefixes is not None else [[]] * len(requests)
        outputs = [r.output_token_ids + p if p else r.output_token_ids for r, p in zip(requests, prefixes, strict=True)]
        params = [request.sampling_params for request in requests]
        greedy = [p.is_greedy for p in params]

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        temperatures = [0.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)]
        metadata = cls(
            temperature=column(temperatures, torch.float32),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            num_logprobs=[p.logprobs for p in params],
        )
        random_params = [p for p, g in zip(params, greedy, strict=True) if not g]
        if any(p.top_k > 0 for p in random_params):
            metadata.top_k = column([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.int64)
        if any(p.top_p < 1.0 for p in random_params):
            metadata.top_p = column([p.top_p for p in params], torch.float32)
        if any(p.min_p > 0.0 for p in random_params):
            metadata.min_p = column([p.min_p for p in params], torch.float32)
        for row, request in enumerate(requests):
            seed = request.sampling_params.seed
            if seed is None or greedy[row]:
                continue
            if request.request_id not in generators:
                generators[request.request_id] = torch.Generator(device=device).manual_seed(seed)
            metadata.generators[row] = generators[request.request_id]
        if any(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty for p in params):
            metadata.prompt_token_ids = _pad([r.prompt_token_ids for r in requests], vocab_size, device)
            metadata.output_token_ids = _pad(outputs, vocab_size, device)
            metadata.repetition_penalties = column([p.repetition_penalty for p in params], torch.float32)
            metadata.frequency_penalties = column([p.frequency_penalty for p in params], torch.float32)
            metadata.presence_penalties = column([p.presence_penalty for p in params], torch.float32)
        rows, token_ids = [], []
        for row, request in enumerate(requests):
            p = request.sampling_params
            if len(outputs[row]) >= p.min_tokens:
                continue
            banned = set(p.stop_token_ids)
            if not p.ignore_eos and request.eos_token_id is not None:
                banned.add(request.eos_token_id)
            banned = {t for t in banned if 0 <= t < vocab_size}
            rows += [row] * len(banned)
            token_ids += sorted(banned)
        if rows:
            metadata.min_tokens_mask = (column(rows, torch.int64), column(token_ids, torch.int64))
        return metadata


@dataclass
class SamplerOutput:
    sampled_token_ids: list[int]  # one per row
    logprobs: list[list[Logprob] | None]  # per row: sampled token's Logprob, then the top-N; None if not asked


def process_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 logits after the grammar bitmask, min_tokens and penalties, and the log-softmax the logprobs report
    (taken after the bitmask, before min_tokens and penalties; None when no row asks for logprobs). A row whose
    grammar allows only the tokens min_tokens bans keeps them: the grammar is complete, so the request stops."""
    logits = logits.to(torch.float32)
    if metadata.grammar_bitmask is not None:
        logits = apply_token_bitmask(logits, metadata.grammar_bitmask, metadata.grammar_rows)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if metadata.max_num_logprobs is not None else None
    if metadata.min_tokens_mask is not None:
        masked = logits.index_put(metadata.min_tokens_mask, torch.tensor(float("-inf"), device=logits.device))
        if metadata.grammar_bitmask is not None:
            # A grammar that allows only stop tokens is complete and wins over min_tokens: masking them too would
            # leave the row nothing to sample.
            nothing_left = torch.isneginf(masked).all(dim=-1, keepdim=True)
            masked = torch.where(nothing_left, logits, masked)
        logits = masked
    if metadata.prompt_token_ids is not None:
        logits = apply_penalties(logits, metadata)
    return logits, raw_logprobs


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        # Unseeded random rows draw from this engine-wide generator (reproducible per engine seed).
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        logits, raw_logprobs = process_logits(logits, metadata)
        sampled = self.sample(logits, metadata)
        logprobs = gather_logprobs(raw_logprobs, sampled, metadata.num_logprobs) if raw_logprobs is not None else None
        return SamplerOutput(sampled.tolist(), logprobs or [None] * len(metadata.num_logprobs))

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            assert greedy is not None
            return greedy
        logits, is_greedy = warp_logits(logits, metadata)
        sampled = sample_categorical(
            logits, draw_uniforms(self.generator, metadata.generators, logits.shape[0], logits.device)
        )
        return sampled if greedy is None else torch.where(is_greedy, greedy, sampled)


def warp_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature (greedy rows divide by 1), then min-p, then top-k/top-p: the distribution a random row samples
    from. Returns the warped logits and the rows' is-greedy mask."""
    is_greedy = metadata.temperature < _GREEDY_EPS
    logits = logits / torch.where(is_greedy, 1.0, metadata.temperature).unsqueeze(1)
    if metadata.min_p is not None:
        logits = apply_min_p(logits, metadata.min_p)
    if metadata.top_k is not None or metadata.top_p is not None:
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
    return logits, is_greedy


def draw_uniforms(
    generator: torch.Generator, seeded: dict[int, torch.Generator], num_rows: int, device: torch.device
) -> torch.Tensor:
    """The step's random draws, [num_rows, 2]: two uniforms per row, rows in position order, from the engine-wide
    `generator`; a seeded row (`seeded[row]`) takes its two from its own request's generator instead. The sampler and
    the rejection sampler both draw through this, so a seeded request's stream is the same with or without drafts."""
    uniforms = torch.rand(num_rows, 2, generator=generator, device=device)
    for row, row_generator in seeded.items():
        uniforms[row] = torch.rand(2, generator=row_generator, device=device)
    return uniforms


def sample_categorical(logits: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Exact inverse-CDF sampling from softmax(logits), two uniforms [B, 2] per row, no host sync.

    Two levels — first a block of `block` tokens by its total weight, then a token inside it — so only
    one exp and one sum pass touch the whole vocabulary: on the CPU this is ~8x cheaper than an
    exponential race (vocab-sized random draws) or a vocab-long cumsum. Zero-weight tokens are never
    picked: the search takes the first cumulative weight strictly above the target.
    """
    batch, vocab = logits.shape
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp_()
    num_blocks = -(-vocab // block)
    if num_blocks * block != vocab:
        weights = torch.nn.functional.pad(weights, (0, num_blocks * block - vocab))
    blocks = weights.view(batch, num_blocks, block)
    block_cdf = blocks.sum(dim=-1).cumsum_(dim=-1)
    target = uniforms[:, :1].to(block_cdf.dtype) * block_cdf[:, -1:]
    block_index = torch.searchsorted(block_cdf, target, right=True).clamp_(max=num_blocks - 1)
    inner_cdf = blocks.gather(1, block_index.unsqueeze(-1).expand(batch, 1, block)).squeeze(1).cumsum_(dim=-1)
    target = uniforms[:, 1:].to(inner_cdf.dtype) * inner_cdf[:, -1:]
    inner_index = torch.searchsorted(inner_cdf, target, right=True).clamp_(max=block - 1)
    return (block_index * block + inner_index).squeeze(1).clamp_(max=vocab - 1)


def _pad(rows: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.int64, device=device).view(
        len(rows), width
    )


def _bin_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] occurrence counts of the (padded with vocab_size) token ids."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """vLLM semantics: repetition over prompt + output (divide positive logits, multiply negative ones);
    frequency (× count) and presence (× seen) over the output only."""
    assert metadata.prompt_token_ids is not None and metadata.output_token_ids is not None
    assert metadata.repetition_penalties is not None
    assert metadata.frequency_penalties is not None and metadata.presence_penalties is not None
    vocab_size = logits.shape[1]
    output_counts = _bin_counts(metadata.output_token_ids, vocab_size)
    output_seen = output_counts > 0
    seen = output_seen | (_bin_counts(metadata.prompt_token_ids, vocab_size) > 0)
    repetition = torch.where(seen, metadata.repetition_penalties.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = logits - metadata.frequency_penalties.unsqueeze(1) * output_counts
    return logits - metadata.presence_penalties.unsqueeze(1) * output_seen


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p × the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, num_candidates: int = 1024
) -> torch.Tensor:
    """Keep the k largest logits (ties with the k-th kept), then the smallest set whose probability
    reaches p (the top token always survives), as vLLM does.

    A full-vocabulary sort costs ~8x a top-`num_candidates` selection on the CPU, so the candidates are
    tried first; the exact sort only runs when some row's kept set could reach past them."""
    if num_candidates < logits.shape[1]:
        out = _top_k_top_p_candidates(logits, top_k, top_p, num_candidates)
        if out is not None:
            return out
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth_index = (logits_sort.shape[1] - top_k).clamp_(min=0).unsqueeze(1)
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort = logits_sort.masked_fill(logits_sort < kth_value, float("-inf"))
    if top_p is not None:
        cumulative = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        logits_sort = logits_sort.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, logits_idx, logits_sort)


def _top_k_top_p_candidates(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, num_candidates: int
) -> torch.Tensor | None:
    """apply_top_k_top_p over the top `num_candidates` logits; None when that is not provably exact."""
    vocab = logits.shape[1]
    values, indices = logits.topk(num_candidates, dim=-1)  # descending
    restricted = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    keep = torch.ones_like(values, dtype=torch.bool)
    if top_k is not None:
        has_top_k = top_k < vocab
        if bool((has_top_k & (top_k > num_candidates)).any()):
            return None
        kth_value = values.gather(1, (top_k.clamp(max=num_candidates) - 1).unsqueeze(1))
        keep &= ~has_top_k.unsqueeze(1) | (values >= kth_value)
        restricted |= has_top_k
    if top_p is not None:
        masked = values.masked_fill(~keep, float("-inf"))
        # After top-k the distribution is renormalised over the kept tokens (all among the candidates).
        log_norm = logits.logsumexp(dim=-1, keepdim=True)
        if top_k is not None:
            log_norm = torch.where(restricted.unsqueeze(1), masked.logsumexp(dim=-1, keepdim=True), log_norm)
        probs = (masked - log_norm).exp()
        inclusive = probs.cumsum(dim=-1)
        has_top_p = top_p < 1.0
        # Exact only if the candidates' mass reaches p: every token past them is then dropped.
        if bool((has_top_p & (inclusive[:, -1] < top_p)).any()):
            return None
        keep &= ~has_top_p.unsqueeze(1) | (inclusive - probs < top_p.unsqueeze(1))
        restricted |= has_top_p
    out = torch.full_like(logits, float("-inf")).scatter_(1, indices, values.masked_fill(~keep, float("-inf")))
    return torch.where(restricted.unsqueeze(1), out, logits)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
    """-inf where the packed int32 bitmask [B, ceil(V/32)] has a 0 bit (xgrammar's layout), in place, in `rows` only
    (default: every row); other rows are left bit-identical. xgrammar's kernel: ~5x faster than unpacking the bits
    with torch ops on the CPU."""
    import xgrammar as xgr

    if rows is not None and not rows:
        return logits
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[1], indices=rows)
    return logits


def gather_logprobs(
    logprobs: torch.Tensor, sampled: torch.Tensor, num_logprobs: list[int | None]
) -> list[list[Logprob] | None]:
    """Per row: the sampled token (with its rank, 1 = most likely) followed by that row's top-N."""
    max_n = max(n for n in num_logprobs if n is not None)
    token_logprobs = logprobs.gather(1, sampled.unsqueeze(1))
    ranks = (logprobs >= token_logprobs).sum(dim=-1)
    top_values, top_indices = logprobs.topk(max_n, dim=-1) if max_n > 0 else (None, None)
    token_logprobs_list, ranks_list, sampled_list = token_logprobs.squeeze(1).tolist(), ranks.tolist(), sampled.tolist()
    top_values_list = top_values.tolist() if top_values is not None else None
    top_indices_list = top_indices.tolist() if top_indices is not None else None
    out: list[list[Logprob] | None] = []
    for row, n in enumerate(num_logprobs):
        if n is None:
            out.append(None)
            continue
        entries = [Logprob(sampled_list[row], token_logprobs_list[row], ranks_list[row])]
        if n > 0:
            assert top_values_list is not None and top_indices_list is not None
            entries += [Logprob(top_indices_list[row][i], top_values_list[row][i], i + 1) for i in range(n)]
        out.append(entries)
    return out
