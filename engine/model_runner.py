"""The model runner: loads the model, owns the paged KV cache, and runs one forward pass per engine step.

Device and dtype: `device=auto` is cuda when available, else cpu. `dtype=auto` is the checkpoint's
torch_dtype on cuda (bfloat16 for converted GGUFs) and float32 on the CPU, where float32 is both the
reference numerics and the precision the CPU benchmarks use. `--dtype bfloat16` on the CPU is the faster
choice on CPUs with native bfloat16 (AVX512-BF16 / AMX; ~1.4x the float32 output tok/s in
docs/BENCHMARKS.md), not token-identical to float32; on other CPUs it is emulated, and the runner warns.

KV cache dtype: `kv_cache_dtype=auto` stores K/V in the model dtype; `bfloat16` stores them in bfloat16 (the
backends' KV write casts, their reads cast back to the compute dtype), so a block of a float32 model costs half
the bytes and the same budget holds about twice the blocks. The rounding reaches attention where K/V are read
back from the cache: decodes and prefill chunks with cached context (in the torch backend the chunk's own tokens
too, in the triton backend only its context); a prefill without cached context attends over its fresh K/V.

KV cache sizing (`determine_num_blocks`), unless `num_gpu_blocks_override` is set; the bytes are per rank:
* `kv_cache_memory_bytes`, where set (vLLM's knob), on either device; on the CPU it must fit the RAM available
  after the weights loaded (all ranks' caches together).
* cuda: a profiling forward at max_num_batched_tokens measures the peak memory of weights + activations;
  the KV cache gets `gpu_memory_utilization * total - peak - memory held by others` (per rank: one device each).
* cpu: the smaller of a fixed cap, min(CPU_KV_CACHE_DEFAULT_BYTES, CPU_KV_CACHE_DEFAULT_FRACTION * MemAvailable),
  and `gpu_memory_utilization * MemAvailable` minus the weights and an estimate of the activations at
  max_num_batched_tokens; MemAvailable is read before the weights load, the weights after they loaded, and both
  are split evenly over the tensor-parallel ranks that share the RAM. The cap keeps a shared machine usable
  (vLLM's CPU build caps its KV space the same way, VLLM_CPU_KVCACHE_SPACE, 4 GiB by default).
Either way the pool is capped at what max_num_seqs sequences of max_model_len tokens can ever use, and the
start-up log line names the limit that decided it. With a draft
model (speculative decoding) its weights are loaded before the sizing, so they count as the target's do, and
each block costs the target's KV bytes plus the draft's (`extra_block_bytes`): the draft holds as many blocks.

Invariant: every slot the attention backend reads is finite. The cache is allocated uninitialised (on
the CPU this leaves untouched pages uncommitted), and a block is zeroed when a step writes its first
slot: a sequence enters a fresh block only at offset 0, and blocks shared through the prefix cache are
full.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.attention import get_attention_backend, resolve_attention_backend
from engine.config import CPU_KV_CACHE_DEFAULT_BYTES, CPU_KV_CACHE_DEFAULT_FRACTION, ConfigError, EngineConfig
from engine.distributed import get_tensor_model_parallel_world_size, get_tp_group
from engine.model_files import gguf_source, load_hf_config, resolve_model
from engine.model_input import ModelInput, prepare_model_input
from engine.model_loader import load_model
from engine.models import ArchConfig
from engine.models.compilation import compile_forward
from engine.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use --device cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: torch.dtype) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    return checkpoint_dtype if device.type == "cuda" else torch.float32


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's storage dtype: the model dtype for `auto`, else the named one."""
    return model_dtype if name == "auto" else _DTYPES[name]


def _cpu_has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an op missing in this torch build
        return False


def _mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def format_bytes(num_bytes: float) -> str:
    """1.50 GiB, 12.0 MiB, 1024 bytes: the start-up line's and the errors' unit."""
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB" if num_bytes >= 2**20 else f"{int(num_bytes)} bytes"


@dataclass(frozen=True)
class KVCacheBudget:
    """This rank's bytes for its KV cache, and the limit that set them (for the start-up line)."""

    bytes: int
    limit: str


class ModelRunner:
    def __init__(self, config: EngineConfig, attention_backend: str | None = None) -> None:
        self.config = config
        mc = config.model_config
        self.device = resolve_device(mc.device)
        self.model_path = resolve_model(mc.model)
        hf_config = load_hf_config(self.model_path)
        self.arch = ArchConfig.from_hf(hf_config)
        self.dtype = resolve_dtype(mc.dtype, self.device, self.arch.torch_dtype)
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and not _cpu_has_native_bf16():
            logger.warning("dtype bfloat16: this CPU has no native bfloat16 (oneDNN emulates it; float32 is faster)")
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.cache_config.kv_cache_dtype, self.dtype)
        assert mc.max_model_len is not None, "EngineConfig resolves max_model_len against the model"
        self.max_model_len: int = mc.max_model_len
        self.block_size = config.cache_config.block_size
        self.vocab_size = self.arch.vocab_size
        self.eos_token_ids = self._eos_token_ids()
        torch.manual_seed(mc.seed)
        if self.device.type == "cpu" and config.parallel_config.cpu_threads is not None:
            torch.set_num_threads(config.parallel_config.cpu_threads)
        # On the CPU, gpu_memory_utilization is a fraction of the RAM available before the weights load, so
        # it covers weights + activations + KV cache as on a GPU.
        # With tensor parallelism the ranks share the RAM: each reads it before any loads (and, in
        # _kv_budget_bytes, after all have loaded), so every rank sees the same figures and takes 1/tp of the budget.
        self._mem_available_before_weights = _mem_available_bytes() if self.device.type == "cpu" else 0
        get_tp_group().barrier()
        self.model, _, _ = load_model(
            str(self.model_path), self.dtype, self.device, self.max_model_len, quantization=mc.quantization,
            group_size=mc.quantization_group_size, skip=mc.skipped_layers, gguf=gguf_source(mc.model),
        )  # fmt: skip
        arch, tp_size = self.arch, get_tensor_model_parallel_world_size()
        self.num_kv_heads = arch.get_num_kv_heads(tp_size)  # this rank's: its KV cache holds only these
        num_heads, head_dim = arch.get_num_attention_heads(tp_size), arch.head_dim
        self.attention_backend = resolve_attention_backend(
            attention_backend or mc.attention_backend, self.device.type
        )  # the argument overrides the knob
        self.attn_backend = get_attention_backend(self.attention_backend)(
            num_heads, self.num_kv_heads, head_dim, head_dim**-0.5, self.block_size
        )
        if self.attention_backend == "triton":  # the fused norm and activation kernels come with it
            from engine.layers.triton_fused import use_triton_fused_layers

            use_triton_fused_layers(self.model)
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        # How the forward runs, for the start-up line: "compiled in 8.7 s" or "eager (reason)".
        self.forward_mode = compile_forward(
            self.model, self._warm_up, enforce_eager=mc.enforce_eager, device=self.device,
            report=get_tp_group().rank_in_group == 0,
        )  # fmt: skip

    def _eos_token_ids(self) -> list[int]:
        ids = list(self.arch.eos_token_ids)
        generation_config = self.model_path / "generation_config.json"
        if generation_config.is_file():
            import json

            eos = json.loads(generation_config.read_text()).get("eos_token_id")
            for token in [eos] if isinstance(eos, int) else eos or []:
                if token not in ids:
                    ids.append(token)
        return ids

    @property
    def block_bytes(self) -> int:
        """Bytes of KV one block holds across all layers, for this rank's KV heads."""
        arch = self.arch
        per_token = 2 * self.num_kv_heads * arch.head_dim * self.kv_cache_dtype.itemsize
        return arch.num_hidden_layers * per_token * self.block_size

    def determine_num_blocks(self, extra_block_bytes: int = 0) -> int:
        """How many KV blocks fit the memory budget when each also costs `extra_block_bytes` (a draft model's)."""
        cc, sc = self.config.cache_config, self.config.scheduler_config
        bytes_per_block = self.block_bytes + extra_block_bytes
        if cc.num_gpu_blocks_override is not None:
            num_blocks, limit = cc.num_gpu_blocks_override, "num_gpu_blocks_override"
        else:
            budget = self.kv_cache_budget()
            blocks_per_seq = -(-self.max_model_len // self.block_size)
            by_budget, by_sequences = budget.bytes // bytes_per_block, sc.max_num_seqs * blocks_per_seq
            num_blocks = min(by_budget, by_sequences)
            limit = budget.limit
            if by_sequences < by_budget:
                limit = f"max_num_seqs={sc.max_num_seqs} x max_model_len={self.max_model_len}, under {limit}"
            if num_blocks < blocks_per_seq:
                draft = f" (each block also holds {extra_block_bytes} bytes of draft KV)" if extra_block_bytes else ""
                raise ConfigError(
                    f"the KV cache ({limit}) has room for {max(num_blocks, 0) * self.block_size} tokens{draft}, "
                    f"fewer than one sequence of max_model_len={self.max_model_len}: lower --max-model-len, raise "
                    "--kv-cache-memory-bytes or --gpu-memory-utilization, or set --num-gpu-blocks-override"
                )
        logger.info(
            "KV cache: %d blocks of %d tokens = %d tokens, %s%s per rank (%s, %s); limit: %s",
            num_blocks,
            self.block_size,
            num_blocks * self.block_size,
            format_bytes(num_blocks * bytes_per_block),
            " with the draft's" if extra_block_bytes else "",
            str(self.kv_cache_dtype).removeprefix("torch."),
            self.device,
            limit,
        )
        return int(num_blocks)

    def kv_cache_budget(self) -> KVCacheBudget:
        """This rank's KV cache bytes before the max_num_seqs cap (see the module docstring). With tensor
        parallelism on the CPU every rank calls it: it waits for all of them to have loaded their weights."""
        cc = self.config.cache_config
        explicit = cc.kv_cache_memory_bytes
        utilization = cc.gpu_memory_utilization
        if self.device.type == "cuda":
            if explicit is not None:
                return KVCacheBudget(explicit, f"kv_cache_memory_bytes={format_bytes(explicit)}")
            torch.cuda.reset_peak_memory_stats(self.device)
            self.profile_run()
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            held_by_others = total - free - torch.cuda.memory_reserved(self.device)
            return KVCacheBudget(
                int(total * utilization - peak - held_by_others), f"gpu_memory_utilization={utilization} of the GPU"
            )
        before = self._mem_available_before_weights
        tp_group = get_tp_group()
        tp_group.barrier()
        after = _mem_available_bytes()
        ranks = tp_group.world_size
        per_rank = f" / {ranks} ranks" if ranks > 1 else ""
        if explicit is not None:
            if explicit * ranks > after:
                raise ConfigError(
                    f"kv_cache_memory_bytes={format_bytes(explicit)} per rank x {ranks} rank(s) exceeds the RAM "
                    f"available after the weights loaded ({format_bytes(after)}); lower --kv-cache-memory-bytes"
                )
            return KVCacheBudget(explicit, f"kv_cache_memory_bytes={format_bytes(explicit)}")
        weights_and_runtime = max(before - after, 0)  # every rank's
        by_utilization = int((before * utilization - weights_and_runtime) / ranks - self._cpu_activation_bytes())
        cap = int(min(CPU_KV_CACHE_DEFAULT_BYTES, CPU_KV_CACHE_DEFAULT_FRACTION * before) / ranks)
        if cap <= by_utilization:
            return KVCacheBudget(cap, (
                f"the CPU default, min({format_bytes(CPU_KV_CACHE_DEFAULT_BYTES)}, "
                f"{CPU_KV_CACHE_DEFAULT_FRACTION:g} x MemAvailable {format_bytes(before)}){per_rank}; "
                "set --kv-cache-memory-bytes to change it"
            ))  # fmt: skip
        return KVCacheBudget(by_utilization, (
            f"gpu_memory_utilization={utilization} x MemAvailable {format_bytes(before)} less the weights and "
            f"activations{per_rank}"
        ))  # fmt: skip

    def _cpu_activation_bytes(self) -> int:
        arch, sc = self.arch, self.config.scheduler_config
        tokens = sc.max_num_batched_tokens
        per_token = 6 * arch.hidden_size + 3 * arch.intermediate_size
        longest = min(tokens, self.max_model_len)
        scores = arch.num_attention_heads * longest * longest
        logits = min(tokens, sc.max_num_seqs) * arch.vocab_size
        return (tokens * per_token + scores) * self.dtype.itemsize + logits * 4

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at max_num_batched_tokens (fresh prefills, no KV cache) plus the sampling rows."""
        sc = self.config.scheduler_config
        remaining, query_lens = sc.max_num_batched_tokens, []
        while remaining > 0 and len(query_lens) < sc.max_num_seqs:
            query_lens.append(min(remaining, self.max_model_len))
            remaining -= query_lens[-1]
        hidden = self._dummy_forward(query_lens)
        self.model.compute_logits(hidden[: min(hidden.shape[0], sc.max_num_seqs)])

    @torch.inference_mode()
    def _warm_up(self, num_tokens: int) -> None:
        """The compile's warm-up: one fresh prefill of `num_tokens` tokens, no KV cache."""
        self._dummy_forward([num_tokens])

    def _dummy_forward(self, query_lens: list[int]) -> torch.Tensor:
        """The hidden states of fresh prefills of `query_lens` tokens (token id 0), with no KV cache."""
        num_tokens = sum(query_lens)
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in query_lens])
        slots = torch.full((num_tokens,), -1, dtype=torch.long, device=self.device)
        tables = [[0] * -(-n // self.block_size) for n in query_lens]
        metadata = self.attn_backend.build_metadata(query_lens, query_lens, tables, slots, self.device)
        self.model.bind_kv_caches(None)
        try:
            return self.model(input_ids, positions, self.attn_backend, metadata)
        finally:
            if self.kv_caches:
                self.model.bind_kv_caches(self.kv_caches)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        shape = self.attn_backend.kv_cache_shape(num_blocks)
        layers = self.arch.num_hidden_layers
        self.kv_caches = [torch.empty(shape, dtype=self.kv_cache_dtype, device=self.device) for _ in range(layers)]
        self.num_blocks = num_blocks
        self.model.bind_kv_caches(self.kv_caches)

    def check_health(self) -> None:
        """In-process: the model runs in this very process, so there is nothing that can have died."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """One forward pass over every scheduled token; float32 logits per scheduled request in batch order: its
        prompt-logprob rows, then its sampling rows (the last known token's, then one per draft), as
        `scheduler_output.logits_rows` lays them out."""
        return self.execute_model_input(prepare_model_input(scheduler_output, self.block_size))

    @torch.inference_mode()
    def execute_model_input(self, model_input: ModelInput) -> torch.Tensor:
        """The forward pass of a prepared step (every tensor-parallel rank runs the same one); its sample rows'
        float32 logits."""
        if not self.kv_caches:
            raise RuntimeError("initialize_kv_cache must run before execute_model")
        device = self.device
        self._zero_entered_blocks(torch.from_numpy(model_input.entered_blocks))
        slot_mapping = torch.from_numpy(model_input.slot_mapping).to(device)
        metadata = self.attn_backend.build_metadata(
            model_input.query_lens, model_input.seq_lens, model_input.block_tables, slot_mapping, device
        )
        rows = torch.from_numpy(model_input.sample_rows).to(device)
        ids, positions = torch.from_numpy(model_input.input_ids).to(device), torch.from_numpy(model_input.positions)
        hidden = self.model(ids, positions.to(device), self.attn_backend, metadata, output_rows=rows)
        return self.model.compute_logits(hidden).float()

    def _zero_entered_blocks(self, block_ids: torch.Tensor) -> None:
        if block_ids.numel() == 0:
            return
        block_ids = block_ids.to(self.device)
        for cache in self.kv_caches:
            cache.index_fill_(2, block_ids, 0)
