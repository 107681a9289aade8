// Attention of a few query rows against a long KV cache on the CPU, streaming every key and value
// once. The rows of one KV head (its GQA query heads times the new tokens, folded) are scored
// together against each key as it passes, so a key is read once for all of them; the keys are cut
// into blocks that the threads take in turn, each keeping an online-softmax partial (max, sum,
// weighted values) that a final pass merges. A variant returns each key's attention probability
// for queries whose log-sum-exp is known (the recall index's refresh), at the same read rate.
//
// Rows are ordered (group g, new token i) -> g * n + i. New token i (of n, the last n positions of
// the keys) sees keys [0, T - n + i]: the causal block at the end of the cache.
//
// Batch invariance. A row's output and log-sum-exp do not depend on the rows computed with it: the
// keys are cut into blocks of kBlock from the first key whatever the row count, each score is
// computed one way (scores_group), and each row's softmax, weighted sum and merge over the blocks
// run in a fixed order, adding exact zeros for keys it cannot see. New token i of a block of n
// therefore gets, bit for bit, what a one-token step over the first T - n + i + 1 keys gets.
//
// Vector width. All vector code is written for W floats, the processor's own register width: 16
// with AVX-512, 8 with AVX2 (and other targets). An earlier version fixed the width at 16 floats;
// built for AVX2 each such value is a pair of registers, its 16-lane shuffles (the reductions and
// transposes of the scores) are not AVX2 instructions and were lowered to lane-by-lane code
// through memory, and its 16 accumulators of 16 floats took all 32 halves of the register file
// before the queries and keys were loaded, so most operands were spilled to the stack: 2-8x
// slower than PyTorch's attention on AVX2-only processors. At the native width every shuffle is
// one instruction and every loop keeps its accumulators in registers (the register blocks below
// are sized for 16 registers under AVX2 and 32 under AVX-512).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

// The op namespace: the build defines it so that two builds of this file (the processor's own and
// the portable AVX2 one) can be loaded side by side.
#ifndef SPARSESPEC_LIB
#define SPARSESPEC_LIB sparsespec_cpu
#endif

namespace {

#if defined(__AVX512F__)
constexpr int W = 16;
#else
constexpr int W = 8;
#endif
constexpr int kRegisters = W == 16 ? 32 : 16;  // vector registers of the target

constexpr int64_t kBlock = 512;  // keys per task: a block's scores and values stay in the core's L2
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// W floats as one value, which GCC lowers to one register of the target.
typedef float vf __attribute__((vector_size(W * 4)));
typedef float vfu __attribute__((vector_size(W * 4), aligned(4)));  // an unaligned load or store
typedef int32_t vi __attribute__((vector_size(W * 4)));

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vfu*>(p) = x; }
inline vf splat(float x) { return vf{} + x; }
inline float lane_sum(vf x) {
  float s = 0.0f;
  for (int l = 0; l < W; ++l) s += x[l];
  return s;
}

// exp(x) for x <= 0 (scores minus their max): Cody-Waite range reduction and a degree-6
// polynomial, about 1 ulp; below -87 it flushes to about 1e-38 (nothing, beside the row's max).
inline vf exp_nonpositive(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf n = (x * 1.44269504088896341f + magic) - magic;
  const vf r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  vf p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * reinterpret_cast<const vf&>(bits);
}

// Shuffle masks over the 2W lanes of a pair (x, y), built at compile time for the target's W:
// the lanes whose index mod 2s is below s (lo) or not (hi), x's then y's (the rounds of a
// transposed sum).
template <int S, bool Hi, size_t... K>
constexpr vi halves_mask(std::index_sequence<K...>) {
  return vi{static_cast<int>((K < W / 2 ? 0 : W) + ((K % (W / 2)) / S) * 2 * S + (K % (W / 2)) % S + (Hi ? S : 0))...};
}

// The lane sums of 2S vectors, S = W/2 at the top (lane j of the result = the sum of a[j]): each
// round adds the two halves of every vector pair, halving the count, so a sum costs about three
// operations instead of a horizontal reduction each.
template <int S = W / 2>
inline vf transpose_sum(vf* a) {
  if constexpr (S == 0) {
    return a[0];
  } else {
    constexpr vi lo = halves_mask<S, false>(std::make_index_sequence<W>{});
    constexpr vi hi = halves_mask<S, true>(std::make_index_sequence<W>{});
    vf b[S];
    for (int i = 0; i < S; ++i) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi);
    return transpose_sum<S / 2>(b);
  }
}

// Keys or values [j0, j0 + width) of one head as float32 rows of d: the rows themselves when they
// are float32, else widened into `scratch`: a bfloat16 is the top half of a float32; an int8 row
// is its values times the row's scale (`sc`, one float per key: a draft's int8 view), one float32
// product per element, as its PyTorch dequantization computes it.
template <typename T>
const float* as_float(const T* src, int64_t stride, int64_t width, int64_t d, float* scratch, int64_t& out_stride,
                      const float* sc = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    out_stride = stride;
    return src;
  } else if constexpr (std::is_same_v<T, int8_t>) {
    for (int64_t j = 0; j < width; ++j) {
      const float s = sc[j];
      const int8_t* row = src + j * stride;
      float* dst = scratch + j * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(row[i]) * s;
    }
    out_stride = d;
    return scratch;
  } else {
    const uint16_t* raw = reinterpret_cast<const uint16_t*>(src);
    uint32_t* dst = reinterpret_cast<uint32_t*>(scratch);
    for (int64_t j = 0; j < width; ++j)
      for (int64_t i = 0; i < d; ++i) dst[j * d + i] = static_cast<uint32_t>(raw[j * stride + i]) << 16;
    out_stride = d;
    return scratch;
  }
}

// Prefetch one key's (or value's) row of d floats into L2, a cache line at a time. Into L2, not
// L1: a block's keys or values are prefetched a whole phase ahead (the values while the scores are
// computed, the next block's keys while the values are summed), more than L1 holds, and requests
// into L1 were measured to slow a step down where those into L2 sped it up.
inline void prefetch_row(const float* p, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) __builtin_prefetch(p + i, 0, 2);
}

// Scores of rows against W keys into s[r * kBlock + jj]: per row, W dot products (C FMAs each,
// W independent FMA chains: one chain per key would wait on each FMA's latency) summed across
// lanes together by a fixed tree. Every score is computed this one way, whatever the number of rows
// and wherever the key sits in its block (a last group of fewer than W keys is padded with zeros):
// a row's attention does not depend on the rows computed with it, so a verification block's rows
// equal, bit for bit, one-token steps' (rows in the vector lanes, one FMA per dimension and key,
// would cost fewer operations from about W / 2 rows, but sum each score in another order; keys
// across the lanes, transposed once for all rows, keep each row's order but were measured no
// faster for a verification block and slower for one new token: the transposes cost more than a
// few rows' trees). While the first row is scored the next W keys are prefetched, and (`ahead`)
// these keys' values, one cache line of each key per chunk rather than all lines at once: a burst
// of requests fills the queue of misses and stalls the loads behind it.
template <int C>
__attribute__((always_inline)) inline void scores_group(const float* q, int64_t rows, const float* k, int64_t ks, float* s, const float* ahead,
                         int64_t as, bool prefetch) {
  constexpr int64_t d = C * W;
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + r * d;
    vf acc[W] = {};
    for (int c = 0; c < C; ++c) {
      if (prefetch && r == 0 && (W * c) % 16 == 0) {  // a line of each key at a time, not all at once
        for (int jj = 0; jj < W; ++jj) {
          __builtin_prefetch(k + (W + jj) * ks + W * c, 0, 2);
          if (ahead != nullptr) __builtin_prefetch(ahead + jj * as + W * c, 0, 2);
        }
      }
      const vf qc = load(qr + W * c);
      for (int jj = 0; jj < W; ++jj) acc[jj] += qc * load(k + jj * ks + W * c);
    }
    store(s + r * kBlock, transpose_sum(acc));
  }
}

// s[r * kBlock + j] = q_r . k_j for `rows` rows (q already scaled) and `width` keys, head size
// C * W. `ahead` (may be null): rows of stride `as` to prefetch alongside, one per key (the same
// keys' values), so that memory keeps streaming while the scores are computed.
template <int C>
void scores(const float* q, int64_t rows, const float* k, int64_t ks, int64_t width, float* s,
            const float* ahead = nullptr, int64_t as = 0) {
  constexpr int64_t d = C * W;
  float padded[W * d];  // the last keys, zero-padded to a group (a block's rows of s have room for it)
  for (int64_t j = 0; j < width; j += W) {
    const float* group = k + j * ks;
    int64_t stride = ks;
    const bool whole = j + W <= width;
    if (!whole) {
      std::memset(padded, 0, sizeof(padded));
      for (int64_t jj = 0; jj < width - j; ++jj) std::memcpy(padded + jj * d, group + jj * ks, d * sizeof(float));
      group = padded;
      stride = d;
    }
    scores_group<C>(q, rows, group, stride, s + j, whole && ahead != nullptr ? ahead + j * as : nullptr, as, whole);
  }
}

// The scaled queries of each head, [heads, rows, d], as `scores` takes them.
inline void scaled_queries(const float* q, int64_t heads, int64_t rows, int64_t d, float scale, std::vector<float>& qs) {
  qs.resize(heads * rows * d);
  for (int64_t i = 0; i < heads * rows * d; ++i) qs[i] = q[i] * scale;
}

// o[r] = sum_j p[r, j] v_j for T rows, head size C * W, register-blocked: the T rows' outputs for
// CB chunks of the head stay in registers (T * CB accumulators, at most about three quarters of
// the register file, the rest for the broadcast weights and the value being read) while the
// values stream past, one pass over the keys per CB chunks. `ahead` (may be null): `ahead_rows`
// rows of stride `as` to prefetch into L2 during the first pass (the next block's keys). The first
// tile of rows (`lead`) also fetches the values kValuesAhead keys ahead into L1: the values were
// fetched into L2 while the scores were computed, and without it each new row of values stalls
// the FMAs on L2's latency.
constexpr int kAccumulators = kRegisters * 3 / 4;

// Chunks of the head a tile accumulates: as many as the accumulators allow (a power of two, as C
// is), so that the first tile of rows reads each value's row whole, front to back: split into
// passes of fewer chunks, each pass reads every row in part and the hardware prefetcher streams
// the values worse (measured slower for one new token).
template <int C>
constexpr int chunks_per_pass() {
  int cb = 1;
  while (cb * 2 <= kAccumulators && cb * 2 <= C) cb *= 2;
  return cb;
}

template <int C>
constexpr int rows_per_tile() { return std::max(1, kAccumulators / chunks_per_pass<C>()); }

constexpr int64_t kValuesAhead = 8;  // keys

template <int C, int T>
inline void values_tile(const float* p, const float* v, int64_t vs, int64_t width, float* o, bool first,
                        const float* ahead, int64_t as, int64_t ahead_rows, bool lead) {
  constexpr int CB = chunks_per_pass<C>();
  static_assert(C % CB == 0, "the head's chunks split into whole passes");
  for (int c0 = 0; c0 < C; c0 += CB) {
    vf acc[T][CB];
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < CB; ++c) acc[t][c] = first ? vf{} : load(o + t * C * W + W * (c0 + c));
    for (int64_t j = 0; j < width; ++j) {
      if (c0 == 0 && j < ahead_rows) prefetch_row(ahead + j * as, C * W);
      if (c0 == 0 && lead)  // the first tile's values a few keys ahead into L1 (the later tiles find them there)
        for (int i = 0; i < C * W; i += 16) __builtin_prefetch(v + (j + kValuesAhead) * vs + i, 0, 3);
      const float* vj = v + j * vs + W * c0;
      for (int c = 0; c < CB; ++c) {
        const vf x = load(vj + W * c);
        for (int t = 0; t < T; ++t) acc[t][c] += p[t * kBlock + j] * x;  // a scalar operand: broadcast
      }
    }
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < CB; ++c) store(o + t * C * W + W * (c0 + c), acc[t][c]);
  }
}

// values_tile over `rows` rows: whole tiles of rows_per_tile, then one tile of the rest.
template <int C, int T = rows_per_tile<C>()>
void values_rows(const float* p, int64_t rows, const float* v, int64_t vs, int64_t width, float* o, bool first,
                 const float* ahead, int64_t as, int64_t ahead_rows, bool lead = true) {
  constexpr int64_t d = C * W;
  int64_t r0 = 0;
  for (; r0 + T <= rows; r0 += T) {
    values_tile<C, T>(p + r0 * kBlock, v, vs, width, o + r0 * d, first, ahead, as, r0 == 0 ? ahead_rows : 0, lead && r0 == 0);
  }
  if constexpr (T > 1) {
    if (r0 < rows) {
      values_rows<C, T - 1>(p + r0 * kBlock, rows - r0, v, vs, width, o + r0 * d, first, ahead, as,
                            r0 == 0 ? ahead_rows : 0, lead && r0 == 0);
    }
  }
}

// o[r] = sum_j p[r, j] v_j over a block's keys, taken in slices of 16 KB of values: every tile of
// rows after the first reads a slice from L1 instead of L2, whose bandwidth would otherwise bound
// a verification pass (a tile re-reads the values once per tile of rows).
template <int C>
void weighted_values(const float* p, int64_t rows, const float* v, int64_t vs, int64_t width, float* o,
                     const float* ahead = nullptr, int64_t as = 0, int64_t ahead_rows = 0) {
  constexpr int64_t slice = std::max<int64_t>(16, 4096 / (C * W));
  for (int64_t j0 = 0; j0 < width; j0 += slice) {
    const int64_t n = std::min(slice, width - j0), pre = std::clamp<int64_t>(ahead_rows - j0, 0, n);
    values_rows<C>(p + j0, rows, v + j0 * vs, vs, n, o, j0 == 0, ahead != nullptr ? ahead + j0 * as : nullptr, as,
                   pre);
  }
}

// Last key (exclusive) that row r sees: new token r % n sees keys [0, total - n + r % n].
inline int64_t row_end(int64_t r, int64_t n, int64_t total) { return total - n + (r % n) + 1; }

// Row r's scores s[0, width) -> exp(s - max) over the `visible` first, 0 past them; returns (max, sum).
inline std::pair<float, float> softmax_block(float* s, int64_t width, int64_t visible) {
  visible = std::clamp<int64_t>(visible, 0, width);
  vf top = splat(kNegInf);
  int64_t j = 0;
  for (; j + W <= visible; j += W) {
    const vf x = load(s + j);
    top = x > top ? x : top;
  }
  float mx = kNegInf;
  for (int l = 0; l < W; ++l) mx = std::max(mx, top[l]);
  for (; j < visible; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  j = 0;
  if (visible > 0) {
    vf acc = {};
    for (; j + W <= visible; j += W) {
      const vf e = exp_nonpositive(load(s + j) - mx);
      store(s + j, e);
      acc += e;
    }
    sum = lane_sum(acc);
    for (; j < visible; ++j) {
      s[j] = exp_nonpositive(splat(s[j] - mx))[0];
      sum += s[j];
    }
  }
  for (; j < width; ++j) s[j] = 0.0f;
  return {mx, sum};
}

// k_scale, v_scale: an int8 view's per-row scales [heads, T] float32 (undefined for other types).
template <typename T, int C>
void attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, int64_t n,
                    at::Tensor& out, at::Tensor& lse, const at::Tensor& k_scale = {}, const at::Tensor& v_scale = {}) {
  constexpr int64_t d = C * W;
  const int64_t heads = q.size(0), rows = q.size(1), total = k.size(1);
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const int64_t kh = k.stride(0), kt = k.stride(1), vh = v.stride(0), vt = v.stride(1);
  const float* ksp = k_scale.defined() ? k_scale.data_ptr<float>() : nullptr;
  const float* vsp = v_scale.defined() ? v_scale.data_ptr<float>() : nullptr;
  const int64_t ksh = k_scale.defined() ? k_scale.stride(0) : 0, vsh = v_scale.defined() ? v_scale.stride(0) : 0;
  // per (head, block): each row's max and sum, and its weighted values
  // (uninitialized: every entry is written before it is read)
  std::unique_ptr<float[]> part_m(new float[heads * blocks * rows]), part_l(new float[heads * blocks * rows]);
  std::unique_ptr<float[]> part_o(new float[heads * blocks * rows * d]);
  std::vector<float> qs;
  scaled_queries(q.data_ptr<float>(), heads, rows, d, static_cast<float>(scale), qs);

  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<float[]> s(new float[rows * kBlock]);  // each block's scores are written before they are read
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : kBlock * d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, b = task % blocks;
      const int64_t j0 = b * kBlock, width = std::min(total, j0 + kBlock) - j0;
      int64_t stride;
      const float* kb = as_float(kp + h * kh + j0 * kt, kt, width, d, scratch.data(), stride,
                                 ksp != nullptr ? ksp + h * ksh + j0 : nullptr);
      constexpr bool direct = std::is_same_v<T, float>;  // prefetch what the next phase reads
      scores<C>(qs.data() + h * rows * d, rows, kb, stride, width, s.get(),
                direct ? reinterpret_cast<const float*>(vp + h * vh + j0 * vt) : nullptr, vt);
      for (int64_t r = 0; r < rows; ++r) {
        const auto [mx, sum] = softmax_block(s.get() + r * kBlock, width, row_end(r, n, total) - j0);
        part_m[task * rows + r] = mx;
        part_l[task * rows + r] = sum;
      }
      const float* vb = as_float(vp + h * vh + j0 * vt, vt, width, d, scratch.data(), stride,
                                 vsp != nullptr ? vsp + h * vsh + j0 : nullptr);
      const int64_t next = task + 1 < end && (task + 1) % blocks != 0 ? std::min(kBlock, total - j0 - width) : 0;
      weighted_values<C>(s.get(), rows, vb, stride, width, part_o.get() + task * rows * d,
                         direct ? reinterpret_cast<const float*>(kp + h * kh + (j0 + width) * kt) : nullptr, kt,
                         direct ? next : 0);
    }
  });

  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, heads * rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t hr = begin; hr < end; ++hr) {
      const int64_t h = hr / rows, r = hr % rows;
      float top = kNegInf;
      for (int64_t b = 0; b < blocks; ++b) top = std::max(top, part_m[(h * blocks + b) * rows + r]);
      vf acc[C] = {};
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = (h * blocks + b) * rows + r;
        if (part_l[at] == 0.0f) continue;  // a block this row sees none of
        const float w = std::exp(part_m[at] - top);
        sum += w * part_l[at];
        const float* src = part_o.get() + ((h * blocks + b) * rows + r) * d;
        for (int c = 0; c < C; ++c) acc[c] += w * load(src + W * c);
      }
      for (int c = 0; c < C; ++c) store(op + hr * d + W * c, acc[c] / sum);
      lp[hr] = top + std::log(sum);
    }
  });
}

template <typename T, int C>
void mass_impl(const at::Tensor& q, const at::Tensor& lse, const at::Tensor& k, double scale, int64_t n,
               at::Tensor& mass) {
  constexpr int64_t d = C * W;
  const int64_t heads = q.size(0), rows = q.size(1), total = k.size(1);
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const float* lp = lse.data_ptr<float>();
  const T* kp = k.data_ptr<T>();
  const int64_t kh = k.stride(0), kt = k.stride(1);
  float* mp = mass.data_ptr<float>();  // [heads, n, total]
  std::vector<float> qs;
  scaled_queries(q.data_ptr<float>(), heads, rows, d, static_cast<float>(scale), qs);

  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(rows * kBlock), scratch(std::is_same_v<T, float> ? 0 : kBlock * d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, b = task % blocks;
      const int64_t j0 = b * kBlock, width = std::min(total, j0 + kBlock) - j0;
      int64_t stride;
      const float* kb = as_float(kp + h * kh + j0 * kt, kt, width, d, scratch.data(), stride);
      scores<C>(qs.data() + h * rows * d, rows, kb, stride, width, s.data());
      // new token i's mass: the sum over its rows g * n + i (the query heads of the group), which
      // all see the same keys
      const int64_t groups = rows / n;
      for (int64_t i = 0; i < n; ++i) {
        float* dst = mp + (h * n + i) * total + j0;
        const int64_t visible = std::clamp<int64_t>(row_end(i, n, total) - j0, 0, width);
        int64_t j = 0;
        for (; j + W <= visible; j += W) {
          vf acc = {};
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t r = g * n + i;
            acc += exp_nonpositive(load(s.data() + r * kBlock + j) - lp[h * rows + r]);
          }
          store(dst + j, acc);
        }
        for (; j < visible; ++j) {
          float acc = 0.0f;
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t r = g * n + i;
            acc += exp_nonpositive(splat(s[r * kBlock + j] - lp[h * rows + r]))[0];
          }
          dst[j] = acc;
        }
        std::fill(dst + visible, dst + width, 0.0f);
      }
    }
  });
}

// Calls f with the head size as a count of W-float chunks, for the sizes the kernel is built for.
template <typename T, typename F>
void dispatch_head(int64_t d, F&& f) {
  switch (d) {
    case 16: f.template operator()<T, 16 / W>(); break;
    case 32: f.template operator()<T, 32 / W>(); break;
    case 64: f.template operator()<T, 64 / W>(); break;
    case 128: f.template operator()<T, 128 / W>(); break;
    default: TORCH_CHECK(false, "sparsespec_cpu: head size ", d, " is not built (16, 32, 64 or 128)");
  }
}

// Calls f<T, C> for the K/V element type T (float32 or bfloat16, as `check` allows) and head size d.
template <typename F>
void dispatch(at::ScalarType kv, int64_t d, F&& f) {
  if (kv == at::kFloat) {
    dispatch_head<float>(d, f);
  } else {
    dispatch_head<c10::BFloat16>(d, f);
  }
}

void check(const at::Tensor& q, const at::Tensor& k, const char* what) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), what, ": CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, what, ": q [Hkv, rows, D] and k [Hkv, T, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), what, ": q must be contiguous float32");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2), what, ": q and k disagree on heads or head size");
  TORCH_CHECK(k.stride(2) == 1, what, ": each key must be contiguous");
  TORCH_CHECK(k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16, what, ": K/V in float32 or bfloat16");
}

std::tuple<at::Tensor, at::Tensor> few_rows_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      double scale, int64_t n) {
  check(q, k, "few_rows_attention");
  TORCH_CHECK(v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type() && v.stride(2) == 1,
              "few_rows_attention: v must match k");
  TORCH_CHECK(n >= 1 && q.size(1) % n == 0 && n <= k.size(1), "few_rows_attention: rows must be groups of n <= T");
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1)}, q.options());
  dispatch(k.scalar_type(), q.size(2),
           [&]<typename T, int C>() { attention_impl<T, C>(q, k, v, scale, n, out, lse); });
  return {out, lse};
}

// few_rows_attention over an int8 view: k, v [Hkv, T, D] int8 with per-row float32 scales
// k_scale, v_scale [Hkv, T] (row (h, t) is k[h, t] * k_scale[h, t]). Each block's rows are
// dequantized as they stream past, so memory is read at a quarter of float32's bytes (plus the
// scales), and a row's result depends on no other row, as for float32.
std::tuple<at::Tensor, at::Tensor> few_rows_attention_int8(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& k_scale, const at::Tensor& v,
                                                           const at::Tensor& v_scale, double scale, int64_t n) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), "few_rows_attention_int8: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, "few_rows_attention_int8: q [Hkv, rows, D] and k [Hkv, T, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), "few_rows_attention_int8: q must be contiguous float32");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2), "few_rows_attention_int8: q and k disagree on heads or head size");
  TORCH_CHECK(k.scalar_type() == at::kChar && v.scalar_type() == at::kChar && v.sizes() == k.sizes() &&
                  k.stride(2) == 1 && v.stride(2) == 1,
              "few_rows_attention_int8: k and v int8 of one shape, each row contiguous");
  for (const at::Tensor* s : {&k_scale, &v_scale}) {
    TORCH_CHECK(s->scalar_type() == at::kFloat && s->dim() == 2 && s->size(0) == k.size(0) && s->size(1) == k.size(1) &&
                    s->stride(1) == 1,
                "few_rows_attention_int8: scales float32 [Hkv, T], contiguous along T");
  }
  TORCH_CHECK(n >= 1 && q.size(1) % n == 0 && n <= k.size(1), "few_rows_attention_int8: rows must be groups of n <= T");
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1)}, q.options());
  dispatch_head<int8_t>(q.size(2), [&]<typename T, int C>() {
    attention_impl<T, C>(q, k, v, scale, n, out, lse, k_scale, v_scale);
  });
  return {out, lse};
}

at::Tensor attention_mass(const at::Tensor& q, const at::Tensor& lse, const at::Tensor& k, double scale, int64_t n) {
  check(q, k, "attention_mass");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1),
              "attention_mass: lse must be contiguous float32 [Hkv, rows]");
  TORCH_CHECK(n >= 1 && q.size(1) % n == 0 && n <= k.size(1), "attention_mass: rows must be groups of n <= T");
  auto mass = at::empty({q.size(0), n, k.size(1)}, q.options());
  dispatch(k.scalar_type(), q.size(2),
           [&]<typename T, int C>() { mass_impl<T, C>(q, lse, k, scale, n, mass); });
  return mass;
}

// The vector width this build was compiled for (8: AVX2 and others, 16: AVX-512).
int64_t vector_width() { return W; }

}  // namespace

// TORCH_LIBRARY pastes its first argument into names, so the namespace macro is expanded first.
#define SPARSESPEC_DEFINE(ns, m) TORCH_LIBRARY(ns, m)
#define SPARSESPEC_IMPL(ns, m) TORCH_LIBRARY_IMPL(ns, CPU, m)

SPARSESPEC_DEFINE(SPARSESPEC_LIB, m) {
  m.def("few_rows_attention(Tensor q, Tensor k, Tensor v, float scale, int n) -> (Tensor, Tensor)");
  m.def("few_rows_attention_int8(Tensor q, Tensor k, Tensor k_scale, Tensor v, Tensor v_scale, float scale, int n) -> (Tensor, Tensor)");
  m.def("attention_mass(Tensor q, Tensor lse, Tensor k, float scale, int n) -> Tensor");
  m.def("vector_width() -> int", vector_width);
}

SPARSESPEC_IMPL(SPARSESPEC_LIB, m) {
  m.impl("few_rows_attention", few_rows_attention);
  m.impl("few_rows_attention_int8", few_rows_attention_int8);
  m.impl("attention_mass", attention_mass);
}
