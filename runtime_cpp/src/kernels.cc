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
#include <cstdint>
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

// custom_sdpa computes each query vector by the same sequence of operations whatever the call's row count, so
// a row of an S-row call is bit for bit that row's one-row call. A task is one KV head and a block of rows, and
// one row's query heads go together: every K and V vector is read once for them. Where the head size is a
// multiple of 8 the work runs on 8-float lanes (attend_group):
//   scores   a query against 8 keys at a time: 8 lane-wise sums down the head dimension, then a fixed tree
//            that adds each key's 8 lanes (lane_sums);
//   softmax  the maximum, then exp by a polynomial (exp8: Cephes' range reduction and coefficients), whose
//            8-lane partial sums are added by the same tree;
//   output   the weighted V rows, summed key by key.
// Two keys' lanes, or 16 floats of a V row, share one 16-float vector, and with AVX-512's 32 registers a row's
// query heads go three at a time; each lane's arithmetic is the same either way, so neither the vector width nor
// how many queries go together changes a bit. The ISA is chosen when the library loads (GCC's target_clones:
// AVX-512, else AVX2 + FMA where the CPU has them, else the baseline x86-64); one process, one machine code, so
// every call of a run rounds alike (and the AVX-512 and AVX2 builds round alike: both contract to FMA).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HYFLASH_NO_CLONES)
#define HYFLASH_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HYFLASH_CLONES
#endif
#define HYFLASH_INLINE inline __attribute__((always_inline))

constexpr int kLanes = 8;
typedef float f8 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t i8 __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef float f8x2 __attribute__((vector_size(2 * kLanes * sizeof(float))));  // two f8 side by side

HYFLASH_INLINE f8 load8(const float* p) { f8 v; std::memcpy(&v, p, sizeof v); return v; }
HYFLASH_INLINE void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }
HYFLASH_INLINE f8x2 load16(const float* p) { f8x2 v; std::memcpy(&v, p, sizeof v); return v; }
HYFLASH_INLINE void store16(float* p, f8x2 v) { std::memcpy(p, &v, sizeof v); }
HYFLASH_INLINE f8x2 join(f8 lo, f8 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
HYFLASH_INLINE f8 low(f8x2 x) { return __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7); }
HYFLASH_INLINE f8 high(f8x2 x) { return __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15); }
HYFLASH_INLINE f8 splat(float x) { return f8{} + x; }
HYFLASH_INLINE f8 vmax(f8 a, f8 b) { return a > b ? a : b; }

// (x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, x6+x7, y4+y5, y6+y7)
HYFLASH_INLINE f8 pairs(f8 x, f8 y) {
  return __builtin_shufflevector(x, y, 0, 2, 8, 10, 4, 6, 12, 14) + __builtin_shufflevector(x, y, 1, 3, 9, 11, 5, 7, 13, 15);
}

// out[r] = the sum of a[r]'s 8 lanes, for r < 8, added in one fixed order: (0+1)+(2+3), then + ((4+5)+(6+7))
HYFLASH_INLINE f8 lane_sums(const f8* a) {
  const f8 c0 = pairs(pairs(a[0], a[1]), pairs(a[2], a[3])), c1 = pairs(pairs(a[4], a[5]), pairs(a[6], a[7]));
  return __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}

HYFLASH_INLINE float lane_sum(f8 a) {
  const f8 parts[kLanes] = {a};
  return lane_sums(parts)[0];
}

HYFLASH_INLINE float lane_max(f8 a) {
  float best = a[0];
  for (int i = 1; i < kLanes; ++i) best = std::max(best, a[i]);
  return best;
}

// e^x for x <= 0 (a score minus its row's maximum), by Cephes' expf (a few ulp); below -86 it gives e^-86 (4e-38, nothing
// beside the row's 1 for its maximum)
HYFLASH_INLINE f8 exp8(f8 x) {
  x = x < splat(-86.f) ? splat(-86.f) : x;
  const f8 magic = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer held in the low bits
  const f8 t = x * 1.44269504088896341f + magic, n = t - magic;
  const f8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  f8 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  return (f8)((i8)p + ((i8)t - (i8)magic) * (1 << 23));  // p * 2^n: n added to the exponent
}

// p[0..keys) <- softmax of p[0..keys) (the block past `keys` is scratch)
HYFLASH_INLINE void softmax8(float* p, int64_t keys) {
  const int64_t padded = (keys + kLanes - 1) / kLanes * kLanes;
  for (int64_t j = keys; j < padded; ++j) p[j] = -INFINITY;
  f8 best = splat(-INFINITY);
  for (int64_t j = 0; j < padded; j += kLanes) best = vmax(best, load8(p + j));
  const f8 top = splat(lane_max(best));
  f8 total = {};
  for (int64_t j = 0; j < padded; j += kLanes) {
    const i8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const f8 e = (lane + static_cast<int32_t>(j)) < static_cast<int32_t>(keys) ? exp8(load8(p + j) - top) : f8{};
    store8(p + j, e);
    total += e;
  }
  const f8 inv = splat(1.f / lane_sum(total));
  for (int64_t j = 0; j < padded; j += kLanes) store8(p + j, load8(p + j) * inv);
}

// out[0..C*8) = sum over j < keys of p[j] * v_j, key by key in registers
template <int64_t C>
HYFLASH_INLINE void weighted8(const float* p, int64_t keys, const float* v, int64_t stride, float* out) {
  f8 o[C] = {};
  for (int64_t j = 0; j < keys; ++j) {
    const f8 pj = splat(p[j]);
    const float* row = v + j * stride;
    for (int64_t c = 0; c < C; ++c) o[c] += pj * load8(row + c * kLanes);
  }
  for (int64_t c = 0; c < C; ++c) store8(out + c * kLanes, o[c]);
}

HYFLASH_INLINE void weighted8_any(const float* p, int64_t keys, const float* v, int64_t stride, int64_t d, float* out) {
  for (int64_t x = 0; x + 4 * kLanes <= d; x += 4 * kLanes) weighted8<4>(p, keys, v + x, stride, out + x);
  for (int64_t x = d / (4 * kLanes) * (4 * kLanes); x < d; x += kLanes) weighted8<1>(p, keys, v + x, stride, out + x);
}

// Scores of B queries q[0..B) against the 8 keys `rows` (their entries j0..j0+8 of dst[b]): lane r of a key
// block is key r's sum down the head dimension, added by lane_sums. Each K vector is loaded once for the B
// queries; a query's lanes take the same operations for any B.
template <int B>
HYFLASH_INLINE void scores8(const float* const* q, const float* const* rows, int64_t d, float* const* dst) {
  f8x2 acc[B][kLanes / 2] = {};  // keys 2m and 2m + 1 side by side
  for (int64_t x = 0; x < d; x += kLanes) {
    f8x2 qx[B];
    for (int b = 0; b < B; ++b) {
      const f8 q8 = load8(q[b] + x);
      qx[b] = join(q8, q8);
    }
    for (int m = 0; m < kLanes / 2; ++m) {
      const f8x2 kx = join(load8(rows[2 * m] + x), load8(rows[2 * m + 1] + x));
      for (int b = 0; b < B; ++b) acc[b][m] += qx[b] * kx;
    }
  }
  for (int b = 0; b < B; ++b) {
    f8 lanes[kLanes];
    for (int m = 0; m < kLanes / 2; ++m) lanes[2 * m] = low(acc[b][m]), lanes[2 * m + 1] = high(acc[b][m]);
    store8(dst[b], lane_sums(lanes));
  }
}

// out[b][0..C*16) = sum over j < keys of p[b][j] * v_j for B queries with the same keys: each V vector loaded
// once for the B of them, each query's sums key by key as weighted8's
template <int B, int64_t C>
HYFLASH_INLINE void weighted16(const float* const* p, int64_t keys, const float* v, int64_t stride, float* const* out) {
  f8x2 o[B][C] = {};
  for (int64_t j = 0; j < keys; ++j) {
    f8x2 pj[B];
    for (int b = 0; b < B; ++b) pj[b] = f8x2{} + p[b][j];
    const float* row = v + j * stride;
    for (int64_t c = 0; c < C; ++c) {
      const f8x2 vx = load16(row + c * 2 * kLanes);
      for (int b = 0; b < B; ++b) o[b][c] += pj[b] * vx;
    }
  }
  for (int b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) store16(out[b] + c * 2 * kLanes, o[b][c]);
}

// The queries [i, i + B) of attend_group, which attend to the same keys: scores, softmax, output
template <int B>
HYFLASH_INLINE void attend_bunch(const float* q, int64_t keys, const float* k, const float* v, int64_t stride,
                                 int64_t d, const float* zeros, float* score, int64_t span, float* const* out) {
  const float* qs[B];
  float* ps[B];
  for (int b = 0; b < B; ++b) qs[b] = q + b * d, ps[b] = score + b * span;
  for (int64_t j0 = 0; j0 < keys; j0 += kLanes) {
    const float* rows[kLanes];
    float* dst[B];
    for (int r = 0; r < kLanes; ++r) rows[r] = j0 + r < keys ? k + (j0 + r) * stride : zeros;
    for (int b = 0; b < B; ++b) dst[b] = ps[b] + j0;
    scores8<B>(qs, rows, d, dst);
  }
  for (int b = 0; b < B; ++b) softmax8(ps[b], keys);
  if (d == 64) {
    weighted16<B, 4>(ps, keys, v, stride, out);
  } else if (d == 128) {
    weighted16<B, 8>(ps, keys, v, stride, out);
  } else {
    for (int b = 0; b < B; ++b) weighted8_any(ps[b], keys, v, stride, d, out[b]);
  }
}

// The nq queries of one KV head (already scaled; query i attends to keys 0..keys[i]-1, keys[] ascending; d a
// multiple of 8), with its K and V rows `stride` floats apart: each query's arithmetic is what it would be alone
// (its scores 8 keys at a time, rows past the last key read `zeros`; its softmax; its V rows summed key by key).
// Queries with the same keys (one row's query heads) go `bunch` at a time, every K and V vector read once for
// them: 3 where the CPU has AVX-512's 32 vector registers, else 1. `score` holds nq rows of `span` floats (the
// last query's keys rounded up to 8).
HYFLASH_CLONES void attend_group(const float* q, int64_t nq, const int64_t* keys, const float* k, const float* v,
                                 int64_t stride, int64_t d, const float* zeros, float* score, int64_t span,
                                 float* const* out, int bunch) {
  for (int64_t i = 0; i < nq;) {
    int64_t n = 1;
    while (n < bunch && i + n < nq && keys[i + n] == keys[i]) ++n;
    const float* qi = q + i * d;
    float* si = score + i * span;
    if (n == 3) attend_bunch<3>(qi, keys[i], k, v, stride, d, zeros, si, span, out + i);
    else if (n == 2) attend_bunch<2>(qi, keys[i], k, v, stride, d, zeros, si, span, out + i);
    else attend_bunch<1>(qi, keys[i], k, v, stride, d, zeros, si, span, out + i);
    i += n;
  }
}

// 3 on x86-64 CPUs with AVX-512 (attend_group's bunches), else 1; a build may fix it (-DHYFLASH_BUNCH=N: the
// tests check that it changes no bit)
int bunch_size() {
#if defined(HYFLASH_BUNCH)
  return HYFLASH_BUNCH;
#elif defined(__x86_64__) && defined(__GNUC__)
  static const int size = __builtin_cpu_supports("avx512f") ? 3 : 1;
  return size;
#else
  return 1;
#endif
}

// The same for any d, one float at a time (head sizes that are not a multiple of 8)
void attend_scalar(const float* q, const float* k, const float* v, int64_t stride, int64_t keys, int64_t d,
                   float* score, float* out) {
  float best = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    float dot = 0.f;
    for (int64_t x = 0; x < d; ++x) dot += q[x] * k[j * stride + x];
    best = std::max(best, score[j] = dot);
  }
  float total = 0.f;
  for (int64_t j = 0; j < keys; ++j) total += score[j] = std::exp(score[j] - best);
  const float inv = 1.f / total;
  std::fill_n(out, d, 0.f);
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t x = 0; x < d; ++x) out[x] += score[j] * inv * v[j * stride + x];
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
  if (k.size(0) != b || v.size(0) != b || k.size(3) != d || v.size(1) != t || v.size(2) != hkv || v.size(3) != d || hkv == 0 || hq == 0 || hq % hkv != 0 ||
      out.size(0) != b || out.size(1) != s || out.size(2) != hq || out.size(3) != d || start_pos < 0 ||
      start_pos + s > t)
    return fail(ctx, "custom_sdpa: shapes do not agree"), out;
  const float factor = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t group = hq / hkv, stride = hkv * d;
  const bool vectors = d % kLanes == 0;
  const float *qp = q.const_data_ptr<float>(), *kp = k.const_data_ptr<float>(), *vp = v.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  // one task per (batch, KV head, block of rows): the queries that read one KV head's rows. The rows are split
  // so that the threads get at least two tasks each and a task holds at most 24 queries (8 rows of SmolLM2).
  const int64_t heads = b * hkv, want = 2 * std::max<int64_t>(1, executorch::extension::get_thread_count());
  const int64_t per = std::max<int64_t>(1, std::min((s * heads + want - 1) / want, std::max<int64_t>(1, 24 / group)));
  const int64_t blocks = (s + per - 1) / per;
  const int bunch = bunch_size();
  executorch::extension::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<int64_t> keys;
    thread_local std::vector<float*> outs;
    const int64_t span = (start_pos + s + kLanes - 1) / kLanes * kLanes, most = per * group;
    // scores and the scaled queries (each written before it is read), then a row of zero keys
    if (scratch.size() < static_cast<size_t>(most * (span + d) + d)) scratch.resize(most * (span + d) + d);
    keys.resize(most);
    outs.resize(most);
    float *score = scratch.data(), *query = score + most * span, *zeros = query + most * d;
    std::fill_n(zeros, d, 0.f);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / blocks, r0 = task % blocks * per, r1 = std::min(s, r0 + per);
      const int64_t bi = head / hkv, g = head % hkv, nq = (r1 - r0) * group;
      const float *kh = kp + (bi * t * hkv + g) * d, *vh = vp + (bi * t * hkv + g) * d;
      for (int64_t i = 0; i < nq; ++i) {  // query i: row r0 + i / group, query head g * group + i % group
        const int64_t at = ((bi * s + r0 + i / group) * hq + g * group + i % group) * d;
        for (int64_t x = 0; x < d; ++x) query[i * d + x] = qp[at + x] * factor;
        keys[i] = start_pos + r0 + i / group + 1;
        outs[i] = op + at;
      }
      if (vectors) {
        attend_group(query, nq, keys.data(), kh, vh, stride, d, zeros, score, span, outs.data(), bunch);
      } else {
        for (int64_t i = 0; i < nq; ++i) attend_scalar(query + i * d, kh, vh, stride, keys[i], d, score, outs[i]);
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
