// Fused paged-attention decode for the CPU (one query token per sequence), registered as
// torch.ops.servelab_cpu.paged_decode_attention. Layout and invariants: engine/attention/cpu_backend.py.
//
// One work item is (sequence, kv_head): the `group` query heads of that KV head are loaded once as float32, then
// the sequence's blocks are walked in block-table order and each block's K and V rows are read once for all of
// them (GQA without repeated K/V). Softmax is online, rescaled once per block: running max m, running sum l and
// the float32 output accumulator are multiplied by exp(m_old - m_new) when a block raises the max. The cache may be
// float32, bfloat16 or float16 and q/out float32, bfloat16 or float16: every read is converted to float32 and
// everything accumulates in float32.
//
// Built by torch.utils.cpp_extension.load with -O3 -march=native (engine/attention/ops/cpu_paged_attention.py):
// native is fine because the JIT build runs on the machine that runs it (the cache directory's name carries a hash
// of the CPU's flags), and it lets the compiler vectorise the head_dim loops (AVX2/AVX-512). -fopenmp makes
// at::parallel_for run on torch's OpenMP pool, so torch.set_num_threads governs it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline T from_float(float x) {
  return static_cast<T>(x);  // c10::BFloat16 and c10::Half round to nearest even
}

// Rows [rows, dim] of the cache as float32: the cache itself when it is float32, else converted into `scratch`.
template <typename C>
inline const float* as_float(const C* src, int64_t n, float* scratch) {
  for (int64_t i = 0; i < n; ++i) scratch[i] = to_float(src[i]);
  return scratch;
}
template <>
inline const float* as_float<float>(const float* src, int64_t, float*) {
  return src;
}

template <typename Q, typename C>
void decode_kernel(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, const at::Tensor& token_rows, double scale_d) {
  const int64_t num_seqs = block_tables.size(0), max_blocks = block_tables.size(1);
  const int64_t num_heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = kv_cache.size(1), num_blocks = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t group = num_heads / kv_heads, num_tokens = q.size(0);
  const float scale = static_cast<float>(scale_d);
  const int64_t q_row_stride = q.stride(0);  // q may be a view into the fused q/k projection: rows apart
  const Q* q_ptr = q.data_ptr<Q>();
  Q* out_ptr = out.data_ptr<Q>();
  const C* cache = kv_cache.data_ptr<C>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* rows = token_rows.data_ptr<int32_t>();
  const int64_t block_elems = block_size * dim;
  const int64_t v_offset = kv_heads * num_blocks * block_elems;  // K at [0], V at [1]
  const int64_t items = num_seqs * kv_heads;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));

  // One task per thread, items interleaved over them so that long and short sequences spread evenly.
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(group * dim), acc(group * dim), scores(group * block_size), m(group), l(group);
    std::vector<float> k_scratch(std::is_same<C, float>::value ? 0 : block_elems);
    std::vector<float> v_scratch(std::is_same<C, float>::value ? 0 : block_elems);
    for (int64_t task = begin; task < end; ++task) {
      for (int64_t item = task; item < items; item += threads) {
        const int64_t seq = item / kv_heads, kvh = item % kv_heads;
        const int64_t seq_len = lens[seq], row = rows[seq];
        TORCH_CHECK(seq_len > 0 && seq_len <= max_blocks * block_size, "decode ", seq, ": seq_len ", seq_len,
                    " outside (0, ", max_blocks * block_size, "]");
        TORCH_CHECK(row >= 0 && row < num_tokens, "decode ", seq, ": token row ", row, " outside the batch");
        const Q* q_row = q_ptr + row * q_row_stride + kvh * group * dim;
        for (int64_t i = 0; i < group * dim; ++i) qf[i] = to_float(q_row[i]) * scale;
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        const int64_t used_blocks = (seq_len + block_size - 1) / block_size;
        for (int64_t b = 0; b < used_blocks; ++b) {
          const int64_t block = tables[seq * max_blocks + b];
          TORCH_CHECK(block >= 0 && block < num_blocks, "decode ", seq, ": block id ", block, " out of range");
          const int64_t n = std::min(block_size, seq_len - b * block_size);
          const C* k_src = cache + (kvh * num_blocks + block) * block_elems;
          const float* k = as_float<C>(k_src, n * dim, k_scratch.data());
          const float* v = as_float<C>(k_src + v_offset, n * dim, v_scratch.data());
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = qf.data() + g * dim;
            float* s = scores.data() + g * block_size;
            float block_max = -std::numeric_limits<float>::infinity();
            for (int64_t t = 0; t < n; ++t) {
              const float* kt = k + t * dim;
              float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
              for (int64_t d = 0; d < dim; ++d) dot += qg[d] * kt[d];
              s[t] = dot;
              block_max = std::max(block_max, dot);
            }
            const float new_max = std::max(m[g], block_max);
            const float alpha = std::exp(m[g] - new_max);  // 0 on the first block (m = -inf)
            float sum = 0.0f;
            for (int64_t t = 0; t < n; ++t) {
              s[t] = std::exp(s[t] - new_max);
              sum += s[t];
            }
            l[g] = l[g] * alpha + sum;
            m[g] = new_max;
            float* a = acc.data() + g * dim;
            if (alpha != 1.0f) {
#pragma omp simd
              for (int64_t d = 0; d < dim; ++d) a[d] *= alpha;
            }
            for (int64_t t = 0; t < n; ++t) {
              const float p = s[t];
              const float* vt = v + t * dim;
#pragma omp simd
              for (int64_t d = 0; d < dim; ++d) a[d] += p * vt[d];
            }
          }
        }
        Q* o = out_ptr + (row * num_heads + kvh * group) * dim;
        for (int64_t g = 0; g < group; ++g) {
          const float inv = 1.0f / l[g];
          for (int64_t d = 0; d < dim; ++d) o[g * dim + d] = from_float<Q>(acc[g * dim + d] * inv);
        }
      }
    }
  });
}

template <typename Q>
void dispatch_cache(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& tables,
                    const at::Tensor& lens, const at::Tensor& rows, double scale) {
  switch (kv_cache.scalar_type()) {
    case at::kFloat:
      return decode_kernel<Q, float>(out, q, kv_cache, tables, lens, rows, scale);
    case at::kBFloat16:
      return decode_kernel<Q, c10::BFloat16>(out, q, kv_cache, tables, lens, rows, scale);
    case at::kHalf:
      return decode_kernel<Q, c10::Half>(out, q, kv_cache, tables, lens, rows, scale);
    default:
      TORCH_CHECK(false, "paged_decode_attention: kv_cache dtype ", kv_cache.scalar_type(), " is not supported");
  }
}

// out[rows[i]] = attention of q[rows[i]] over the first seq_lens[i] tokens of block_tables[i]'s blocks.
// Rows of `out` not named in token_rows are left untouched.
void paged_decode_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& token_rows,
                            double scale) {
  TORCH_CHECK(q.device().is_cpu() && kv_cache.device().is_cpu(), "paged_decode_attention runs on CPU tensors");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "q and out must be [tokens, heads, head_dim] alike");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.size(4) == q.size(2),
              "kv_cache must be [2, kv_heads, blocks, block_size, head_dim] with q's head_dim");
  TORCH_CHECK(q.size(1) % kv_cache.size(1) == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(q.stride(2) == 1 && (q.size(1) == 1 || q.stride(1) == q.size(2)), "q's heads must be contiguous within a row");
  TORCH_CHECK(out.is_contiguous() && kv_cache.is_contiguous(), "out and kv_cache must be contiguous");
  TORCH_CHECK(out.scalar_type() == q.scalar_type(), "out must have q's dtype");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
              "block_tables must be a contiguous int32 [num_decodes, max_blocks]");
  const int64_t n = block_tables.size(0);
  for (const at::Tensor* t : {&seq_lens, &token_rows}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == n && t->scalar_type() == at::kInt && t->is_contiguous(),
                "seq_lens and token_rows must be contiguous int32 [num_decodes]");
  }
  if (n == 0) return;
  switch (q.scalar_type()) {
    case at::kFloat:
      return dispatch_cache<float>(out, q, kv_cache, block_tables, seq_lens, token_rows, scale);
    case at::kBFloat16:
      return dispatch_cache<c10::BFloat16>(out, q, kv_cache, block_tables, seq_lens, token_rows, scale);
    case at::kHalf:
      return dispatch_cache<c10::Half>(out, q, kv_cache, block_tables, seq_lens, token_rows, scale);
    default:
      TORCH_CHECK(false, "paged_decode_attention: q dtype ", q.scalar_type(), " is not supported");
  }
}

// Meta/fake tensors (torch.compile's tracing): the op only writes into `out`, so there is nothing to compute.
void paged_decode_attention_meta(at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, double) {}

}  // namespace

TORCH_LIBRARY(servelab_cpu, m) {
  m.def(
      "paged_decode_attention(Tensor(a!) out, Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor token_rows, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(servelab_cpu, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
TORCH_LIBRARY_IMPL(servelab_cpu, Meta, m) { m.impl("paged_decode_attention", &paged_decode_attention_meta); }
