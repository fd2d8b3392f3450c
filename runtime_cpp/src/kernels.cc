// The target's two cache kernels, registered with ExecuTorch's kernel registry at load time:
//   llama::update_cache.out(value, cache, start_pos)  writes value [B, S, H, D] into cache [B, T, H, D]
//                                                      at rows start_pos..start_pos+S-1;
//   llama::custom_sdpa.out(q, k, v, start_pos, ...)   causal attention of q [B, S, Hq, D] over the cache
//                                                      rows 0..start_pos+i for query row i (GQA: query
//                                                      head h reads KV head h / (Hq / Hkv)).
// They implement the schemas of ExecuTorch's extension/llm/custom_ops (what the .pte's target methods call; the
// manifest lists them under cache.pte.kernels), for the case the export emits: float32, no mask, causal.
// Rows past start_pos + S are never read, so attention costs what the committed context costs.
// Written for this project (the stock ExecuTorch libraries do not carry these kernels; see
// docs/deploy.md); tested against the Python ops through the runner's token-for-token tests.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

namespace hyflash::kernels {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

namespace {

bool is_bshd(const Tensor& t) { return t.dim() == 4 && t.scalar_type() == ScalarType::Float; }

bool fail(KernelRuntimeContext& ctx, const char* what) {
  ET_LOG(Error, "hyflash kernels: %s", what);
  ctx.fail(Error::InvalidArgument);
  return false;
}

// out[x] = sum over j < n of p[j] * v[j * stride + x]: with D fixed the sums stay in registers
template <int D>
void weighted_sum(const float* p, int64_t n, const float* v, int64_t stride, float* out) {
  float o[D] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j], *row = v + j * stride;
#pragma omp simd
    for (int x = 0; x < D; ++x) o[x] += pj * row[x];
  }
  std::copy(o, o + D, out);
}

void weighted_sum_any(const float* p, int64_t n, const float* v, int64_t stride, int64_t d, float* out) {
  std::fill_n(out, d, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j], *row = v + j * stride;
#pragma omp simd
    for (int64_t x = 0; x < d; ++x) out[x] += pj * row[x];
  }
}

}  // namespace

Tensor& update_cache_out(KernelRuntimeContext& ctx, const Tensor& value, Tensor& cache, int64_t start_pos,
                         Tensor& out) {
  if (!is_bshd(value) || !is_bshd(cache)) return fail(ctx, "update_cache: float32 [B, S, H, D] tensors only"), out;
  const int64_t b = value.size(0), s = value.size(1), row = value.size(2) * value.size(3), t = cache.size(1);
  if (cache.size(0) != b || cache.size(2) * cache.size(3) != row || start_pos < 0 || start_pos + s > t)
    return fail(ctx, "update_cache: the rows do not fit the cache"), out;
  const float* src = value.const_data_ptr<float>();
  float* dst = cache.mutable_data_ptr<float>();
  for (int64_t i = 0; i < b; ++i)
    std::memcpy(dst + (i * t + start_pos) * row, src + i * s * row, sizeof(float) * s * row);
  return out;
}

Tensor& custom_sdpa_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        int64_t start_pos, const std::optional<Tensor>& attn_mask, double dropout_p,
                        bool is_causal, std::optional<double> scale, Tensor& out) {
  if (!is_bshd(q) || !is_bshd(k) || !is_bshd(v) || !is_bshd(out)) return fail(ctx, "custom_sdpa: float32 [B, S, H, D] only"), out;
  if (attn_mask.has_value() || !is_causal || dropout_p != 0.0)
    return fail(ctx, "custom_sdpa: only causal attention without a mask or dropout (what hyflash exports)"), out;
  const int64_t b = q.size(0), s = q.size(1), hq = q.size(2), d = q.size(3);
  const int64_t t = k.size(1), hkv = k.size(2);
  if (k.size(0) != b || v.size(0) != b || k.size(3) != d || v.size(1) != t || v.size(2) != hkv || v.size(3) != d || hkv == 0 || hq % hkv != 0 ||
      out.size(0) != b || out.size(1) != s || out.size(2) != hq || out.size(3) != d || start_pos < 0 ||
      start_pos + s > t)
    return fail(ctx, "custom_sdpa: shapes do not agree"), out;
  const float factor = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t group = hq / hkv;
  const float *qp = q.const_data_ptr<float>(), *kp = k.const_data_ptr<float>(), *vp = v.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  // One task per (batch, KV head): its nq = S x group query vectors share every K and V row they read.
  // Scores for blocks of 16 queries at once, key by key, vectorised across the queries (Q transposed,
  // scaled); with few queries (decode) a dot product per query and key. Then a softmax per query over
  // its causal keys, and its weighted sum of V rows.
  executorch::extension::parallel_for(0, b * hkv, 1, [&](int64_t begin, int64_t end) {
    constexpr int kBlock = 16;
    thread_local std::vector<float> qt_buf, score_buf;
    const int64_t nq = s * group, keys = start_pos + s, padded = (nq + kBlock - 1) / kBlock * kBlock;
    qt_buf.resize(d * padded);
    score_buf.resize(nq * keys);
    // plain pointers from here: every use of a thread_local object goes through its init wrapper
    float *qt = qt_buf.data(), *score = score_buf.data();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / hkv, g = task % hkv;
      auto query = [&](int64_t qi) { return qp + ((bi * s + qi / group) * hq + g * group + qi % group) * d; };
      auto key_row = [&](const float* base, int64_t j) { return base + ((bi * t + j) * hkv + g) * d; };
      if (nq >= 8) {  // blocks of kBlock queries: the inner loop is one fixed-width vector
        std::fill_n(qt, d * padded, 0.f);
        for (int64_t qi = 0; qi < nq; ++qi)
          for (int64_t x = 0; x < d; ++x) qt[x * padded + qi] = query(qi)[x] * factor;
        for (int64_t b0 = 0; b0 < nq; b0 += kBlock)
          for (int64_t j = 0; j < keys; ++j) {
            const float* krow = key_row(kp, j);
            float a[kBlock] = {};
            for (int64_t x = 0; x < d; ++x) {
              const float kx = krow[x], *col = qt + x * padded + b0;
#pragma omp simd
              for (int q = 0; q < kBlock; ++q) a[q] += kx * col[q];
            }
            for (int64_t q = 0; q < kBlock && b0 + q < nq; ++q) score[(b0 + q) * keys + j] = a[q];
          }
      } else {  // few queries (decode): a dot product per query and key
        for (int64_t j = 0; j < keys; ++j) {
          const float* krow = key_row(kp, j);
          for (int64_t qi = 0; qi < nq; ++qi) {
            const float* qrow = query(qi);
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t x = 0; x < d; ++x) dot += qrow[x] * krow[x];
            score[qi * keys + j] = dot * factor;
          }
        }
      }
      for (int64_t qi = 0; qi < nq; ++qi) {  // softmax over keys 0..start_pos+i (causal)
        float* row = score + qi * keys;
        const int64_t n = start_pos + qi / group + 1;
        const float best = *std::max_element(row, row + n);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < n; ++j) total += row[j] = std::exp(row[j] - best);
        const float inv = 1.f / total;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      }
      for (int64_t qi = 0; qi < nq; ++qi) {  // the weighted V rows, summed in registers where d is 64 or 128
        const float* p = score + qi * keys;
        const int64_t n = start_pos + qi / group + 1;
        float* orow = op + (query(qi) - qp);
        if (d == 64) weighted_sum<64>(p, n, vp + (bi * t * hkv + g) * d, hkv * d, orow);
        else if (d == 128) weighted_sum<128>(p, n, vp + (bi * t * hkv + g) * d, hkv * d, orow);
        else weighted_sum_any(p, n, vp + (bi * t * hkv + g) * d, hkv * d, d, orow);
      }
    }
  });
  return out;
}

// Registered under a specialized kernel key (float32, contiguous 4-D: what the export emits), not as the
// fallback: ExecuTorch's own build of these kernels (the wheel's custom_ops library, which every in-process
// export loads) registers the fallback, and a name registered twice under one key aborts the process. With
// both loaded, a method resolving these ops prefers the specialized key: ours. The key lists the tensors of
// the call as the program serializes it: the arguments in schema order (a None attn_mask is not one), then
// out, then the returned tensor (out again). update_cache's out is the 1-element placeholder its meta
// function returns. Read back from an exported model.pte by the tests (gen_oplist's kernel metadata).
namespace {
constexpr char kUpdateCache[] = "llama::update_cache.out";
constexpr char kCustomSdpa[] = "llama::custom_sdpa.out";
// value, cache, out, returned
constexpr char kUpdateCacheKey[] = "v1/6;0,1,2,3|6;0,1,2,3|6;0|6;0";
// query, key, value, out, returned
constexpr char kCustomSdpaKey[] = "v1/6;0,1,2,3|6;0,1,2,3|6;0,1,2,3|6;0,1,2,3|6;0,1,2,3";

using executorch::extension::WrapUnboxedIntoFunctor;
using executorch::runtime::Kernel;
using executorch::runtime::KernelKey;
using executorch::runtime::register_kernel;

const auto registered_update_cache = register_kernel(Kernel(
    kUpdateCache, KernelKey(kUpdateCacheKey), WrapUnboxedIntoFunctor<EXECUTORCH_FN_TYPE(update_cache_out, kUpdateCache)>::call));
const auto registered_custom_sdpa = register_kernel(Kernel(
    kCustomSdpa, KernelKey(kCustomSdpaKey), WrapUnboxedIntoFunctor<EXECUTORCH_FN_TYPE(custom_sdpa_out, kCustomSdpa)>::call));
}  // namespace

}  // namespace hyflash::kernels

// The library's stamp: the ExecuTorch version it was built against, which the Python runtime reads from the
// file before loading it (the kernels' ABI is that version's).
extern "C" __attribute__((used)) const char hyflash_kernels_stamp[] =
    "hyflash-kernels executorch=" HYFLASH_EXECUTORCH_VERSION;
