// Attention of a few query rows against a long KV cache on the CPU, streaming every key and value
// once. The rows of one KV head (its GQA query heads times the new tokens, folded) are scored
// together against each key as it passes, so a key is read once for all of them; the keys are cut
// into blocks that the threads take in turn, each keeping an online-softmax partial (max, sum,
// weighted values) that a final pass merges. A variant returns each key's attention probability
// for queries whose log-sum-exp is known (the recall index's refresh), at the same read rate.
//
// Rows are ordered (group g, new token i) -> g * n + i. New token i (of n, the last n positions of
// the keys) sees keys [0, T - n + i]: the causal block at the end of the cache.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kBlock = 512;  // keys per task: a block's scores and values stay in the core's L2
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 16 floats as one value: GCC and Clang lower it to whatever SIMD the processor has (one AVX-512
// register, two AVX2 registers, four NEON registers), so the code is portable and still vectorised.
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // an unaligned load or store
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 load(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store(float* p, v16 x) { *reinterpret_cast<v16u*>(p) = x; }
inline v16 splat(float x) { return v16{} + x; }

// exp(x) for x <= 0 (scores minus their max): Cody-Waite range reduction and a degree-6
// polynomial, about 1 ulp; below -87 it flushes to about 1e-38 (nothing, beside the row's max).
inline v16 exp_nonpositive(v16 x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v16 n = (x * 1.44269504088896341f + magic) - magic;
  const v16 r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  v16 p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i16 bits = (__builtin_convertvector(n, i16) + 127) << 23;
  return p * reinterpret_cast<const v16&>(bits);
}

// The lane sums of 16 vectors as one vector (lane j = the sum of a[j]): four levels of shuffles
// and adds, about three operations a sum instead of a horizontal reduction each.
inline v16 transpose_sum(v16* a) {
  const i16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const i16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const i16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const i16 hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const i16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const i16 hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const i16 lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const i16 hi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  v16 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo8) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi8);
  for (int i = 0; i < 4; ++i) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], lo4) + __builtin_shuffle(b[2 * i], b[2 * i + 1], hi4);
  for (int i = 0; i < 2; ++i) d[i] = __builtin_shuffle(c[2 * i], c[2 * i + 1], lo2) + __builtin_shuffle(c[2 * i], c[2 * i + 1], hi2);
  return __builtin_shuffle(d[0], d[1], lo1) + __builtin_shuffle(d[0], d[1], hi1);
}

// Keys or values [j0, j0 + width) of one head as float32 rows of d: the rows themselves when they
// are float32, else converted into `scratch`.
template <typename T>
const float* as_float(const T* src, int64_t stride, int64_t width, int64_t d, float* scratch, int64_t& out_stride) {
  if constexpr (std::is_same_v<T, float>) {
    out_stride = stride;
    return src;
  } else {
    for (int64_t j = 0; j < width; ++j)
      for (int64_t i = 0; i < d; ++i) scratch[j * d + i] = static_cast<float>(src[j * stride + i]);
    out_stride = d;
    return scratch;
  }
}

// Transpose 16 vectors in place (a[i][j] <- a[j][i]): four rounds that swap the off-diagonal
// blocks of size 8, 4, 2 and 1, two shuffles a pair of vectors each.
inline void transpose16(v16* a) {
  static const i16 lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                            {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                            {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                            {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
  static const i16 hi[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                            {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                            {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                            {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
  for (int round = 0, h = 8; round < 4; ++round, h /= 2) {
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const v16 x = a[i], y = a[i + h];
      a[i] = __builtin_shuffle(x, y, lo[round]);
      a[i + h] = __builtin_shuffle(x, y, hi[round]);
    }
  }
}

// Scores of rows against 16 keys, two ways, both into s[r * kBlock + jj]:
// - few rows: per row, 16 dot products (C FMAs each) summed across lanes together;
// - 16 rows (a tile, zero-padded): the rows in the lanes, qt = the tile's queries as [d][16], one
//   FMA per dimension and key with the key's element broadcast, then one transpose of the 16x16
//   result. No reductions: it pays from about 8 rows.
template <int C>
inline void scores16_few(const float* q, int64_t rows, const float* k, int64_t ks, float* s, bool prefetch,
                         const float* ahead, int64_t as) {
  constexpr int64_t d = C * 16;
  for (int64_t r = 0; r < rows; ++r) {
    v16 qc[C], acc[16];
    for (int c = 0; c < C; ++c) qc[c] = load(q + r * d + 16 * c);
    for (int jj = 0; jj < 16; ++jj) {
      const float* kj = k + jj * ks;
      if (prefetch && r == 0) {  // the next 16 keys and (`ahead`) these keys' values, spread among the products
        for (int c = 0; c < C; ++c) __builtin_prefetch(kj + 16 * ks + 16 * c);
        if (ahead != nullptr) {
          for (int c = 0; c < C; ++c) __builtin_prefetch(ahead + jj * as + 16 * c);
        }
      }
      v16 a = qc[0] * load(kj);
      for (int c = 1; c < C; ++c) a += qc[c] * load(kj + 16 * c);
      acc[jj] = a;
    }
    store(s + r * kBlock, transpose_sum(acc));
  }
}

template <int C>
inline void scores16_tile(const float* qt, int64_t rows, const float* k, int64_t ks, float* s, bool prefetch,
                          const float* ahead, int64_t as) {
  constexpr int64_t d = C * 16;
  v16 acc[16] = {};
  for (int64_t i = 0; i < d; ++i) {
    if (prefetch) {  // one line of the next 16 keys a dimension, and (`ahead`) these keys' values
      __builtin_prefetch(k + (16 + i / C) * ks + 16 * (i % C));
      if (ahead != nullptr && i % C == 0) {
        for (int c = 0; c < C; ++c) __builtin_prefetch(ahead + (i / C) * as + 16 * c);
      }
    }
    const v16 qi = load(qt + 16 * i);
    for (int jj = 0; jj < 16; ++jj) acc[jj] += qi * k[jj * ks + i];
  }
  transpose16(acc);  // acc[r] = row r's scores of the 16 keys
  for (int64_t r = 0; r < rows; ++r) store(s + r * kBlock, acc[r]);
}

constexpr int64_t kTileFrom = 8;  // rows in a 16-row tile from which the tile path is taken

// s[r * kBlock + j] = q_r . k_j for `rows` rows (q already scaled; qt: the same queries in tiles of
// 16 as [d][16]) and `width` keys, head size C * 16. `ahead` (may be null): rows of stride `as` to
// prefetch alongside, one per key (the same keys' values), so that memory keeps streaming while
// the scores are computed.
template <int C>
void scores(const float* q, const float* qt, int64_t rows, const float* k, int64_t ks, int64_t width, float* s,
            const float* ahead = nullptr, int64_t as = 0) {
  constexpr int64_t d = C * 16;
  int64_t j = 0;
  for (; j + 16 <= width; j += 16) {
    const float* next = ahead != nullptr ? ahead + j * as : nullptr;
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      const int64_t n = std::min<int64_t>(16, rows - r0);
      if (n >= kTileFrom) {
        scores16_tile<C>(qt + r0 * d, n, k + j * ks, ks, s + r0 * kBlock + j, r0 == 0, next, as);
      } else {
        scores16_few<C>(q + r0 * d, n, k + j * ks, ks, s + r0 * kBlock + j, r0 == 0, next, as);
      }
    }
  }
  for (; j < width; ++j) {
    const float* kj = k + j * ks;
    for (int64_t r = 0; r < rows; ++r) {
      v16 a = load(q + r * d) * load(kj);
      for (int c = 1; c < C; ++c) a += load(q + r * d + 16 * c) * load(kj + 16 * c);
      float sum = 0.0f;
      for (int l = 0; l < 16; ++l) sum += a[l];
      s[r * kBlock + j] = sum;
    }
  }
}

// The scaled queries of each head, [heads, rows, d], and the same in tiles of 16 rows as [d][16]
// (zero past the last row), as `scores` takes them.
inline void scaled_queries(const float* q, int64_t heads, int64_t rows, int64_t d, float scale, std::vector<float>& qs,
                           std::vector<float>& qt) {
  const int64_t tiles = (rows + 15) / 16;
  qs.resize(heads * rows * d);
  qt.assign(heads * tiles * 16 * d, 0.0f);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) {
        const float x = q[(h * rows + r) * d + i] * scale;
        qs[(h * rows + r) * d + i] = x;
        qt[((h * tiles + r / 16) * d + i) * 16 + r % 16] = x;
      }
}

// o[r] = sum_j p[r, j] v_j for `rows` rows (a multiple of the tile), head size C * 16: a tile of
// rows keeps its outputs in registers while the values stream past.
// `ahead` (may be null): `ahead_rows` rows of stride `as` to prefetch while the first tile runs
// (the next block's keys).
template <int C>
void weighted_values(const float* p, int64_t rows, const float* v, int64_t vs, int64_t width, float* o,
                     const float* ahead = nullptr, int64_t as = 0, int64_t ahead_rows = 0) {
  constexpr int64_t d = C * 16, tile = 16 / C;
  for (int64_t r0 = 0; r0 < rows; r0 += tile) {
    v16 acc[tile][C] = {};
    for (int64_t j = 0; j < width; ++j) {
      if (r0 == 0 && j < ahead_rows) {
        for (int c = 0; c < C; ++c) __builtin_prefetch(ahead + j * as + 16 * c);
      }
      v16 vc[C];
      for (int c = 0; c < C; ++c) vc[c] = load(v + j * vs + 16 * c);
      for (int64_t t = 0; t < tile; ++t) {
        const float w = p[(r0 + t) * kBlock + j];  // a scalar operand: broadcast inside the FMA
        for (int c = 0; c < C; ++c) acc[t][c] += w * vc[c];
      }
    }
    for (int64_t t = 0; t < tile; ++t)
      for (int c = 0; c < C; ++c) store(o + (r0 + t) * d + 16 * c, acc[t][c]);
  }
}

// Last key (exclusive) that row r sees: new token r % n sees keys [0, total - n + r % n].
inline int64_t row_end(int64_t r, int64_t n, int64_t total) { return total - n + (r % n) + 1; }

// Row r's scores s[0, width) -> exp(s - max) over the `visible` first, 0 past them; returns (max, sum).
inline std::pair<float, float> softmax_block(float* s, int64_t width, int64_t visible) {
  visible = std::clamp<int64_t>(visible, 0, width);
  v16 top = splat(kNegInf);
  int64_t j = 0;
  for (; j + 16 <= visible; j += 16) {
    const v16 x = load(s + j);
    top = x > top ? x : top;
  }
  float mx = kNegInf;
  for (int l = 0; l < 16; ++l) mx = std::max(mx, top[l]);
  for (; j < visible; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  j = 0;
  if (visible > 0) {
    v16 acc = {};
    for (; j + 16 <= visible; j += 16) {
      const v16 e = exp_nonpositive(load(s + j) - mx);
      store(s + j, e);
      acc += e;
    }
    for (int l = 0; l < 16; ++l) sum += acc[l];
    for (; j < visible; ++j) {
      v16 x = splat(s[j] - mx);
      s[j] = exp_nonpositive(x)[0];
      sum += s[j];
    }
  }
  for (; j < width; ++j) s[j] = 0.0f;
  return {mx, sum};
}

template <typename T, int C>
void attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, int64_t n,
                    at::Tensor& out, at::Tensor& lse) {
  constexpr int64_t d = C * 16, tile = 16 / C;
  const int64_t heads = q.size(0), rows = q.size(1), total = k.size(1);
  const int64_t padded = (rows + tile - 1) / tile * tile;  // the values' tiles see zero weights past rows
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const int64_t kh = k.stride(0), kt = k.stride(1), vh = v.stride(0), vt = v.stride(1);
  // per (head, block): each row's max and sum, and its weighted values
  std::vector<float> part_m(heads * blocks * rows), part_l(heads * blocks * rows);
  std::vector<float> part_o(heads * blocks * padded * d);
  std::vector<float> qs, qt;
  scaled_queries(q.data_ptr<float>(), heads, rows, d, static_cast<float>(scale), qs, qt);
  const int64_t tiles = (rows + 15) / 16;

  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(padded * kBlock, 0.0f), scratch(std::is_same_v<T, float> ? 0 : kBlock * d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, b = task % blocks;
      const int64_t j0 = b * kBlock, width = std::min(total, j0 + kBlock) - j0;
      int64_t stride;
      const float* kb = as_float(kp + h * kh + j0 * kt, kt, width, d, scratch.data(), stride);
      constexpr bool direct = std::is_same_v<T, float>;  // prefetch what the next phase reads
      scores<C>(qs.data() + h * rows * d, qt.data() + h * tiles * 16 * d, rows, kb, stride, width, s.data(),
                direct ? reinterpret_cast<const float*>(vp + h * vh + j0 * vt) : nullptr, vt);
      for (int64_t r = 0; r < rows; ++r) {
        const auto [mx, sum] = softmax_block(s.data() + r * kBlock, width, row_end(r, n, total) - j0);
        part_m[task * rows + r] = mx;
        part_l[task * rows + r] = sum;
      }
      const float* vb = as_float(vp + h * vh + j0 * vt, vt, width, d, scratch.data(), stride);
      const int64_t next = task + 1 < end && (task + 1) % blocks != 0 ? std::min(kBlock, total - j0 - width) : 0;
      weighted_values<C>(s.data(), padded, vb, stride, width, part_o.data() + task * padded * d,
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
      v16 acc[C] = {};
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = (h * blocks + b) * rows + r;
        if (part_l[at] == 0.0f) continue;  // a block this row sees none of
        const float w = std::exp(part_m[at] - top);
        sum += w * part_l[at];
        const float* src = part_o.data() + ((h * blocks + b) * padded + r) * d;
        for (int c = 0; c < C; ++c) acc[c] += w * load(src + 16 * c);
      }
      for (int c = 0; c < C; ++c) store(op + hr * d + 16 * c, acc[c] / sum);
      lp[hr] = top + std::log(sum);
    }
  });
}

template <typename T, int C>
void mass_impl(const at::Tensor& q, const at::Tensor& lse, const at::Tensor& k, double scale, int64_t n,
               at::Tensor& mass) {
  constexpr int64_t d = C * 16;
  const int64_t heads = q.size(0), rows = q.size(1), total = k.size(1);
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const float* lp = lse.data_ptr<float>();
  const T* kp = k.data_ptr<T>();
  const int64_t kh = k.stride(0), kt = k.stride(1);
  float* mp = mass.data_ptr<float>();  // [heads, n, total]
  std::vector<float> qs, qt;
  scaled_queries(q.data_ptr<float>(), heads, rows, d, static_cast<float>(scale), qs, qt);
  const int64_t tiles = (rows + 15) / 16;

  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(rows * kBlock), scratch(std::is_same_v<T, float> ? 0 : kBlock * d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, b = task % blocks;
      const int64_t j0 = b * kBlock, width = std::min(total, j0 + kBlock) - j0;
      int64_t stride;
      const float* kb = as_float(kp + h * kh + j0 * kt, kt, width, d, scratch.data(), stride);
      scores<C>(qs.data() + h * rows * d, qt.data() + h * tiles * 16 * d, rows, kb, stride, width, s.data());
      // new token i's mass: the sum over its rows g * n + i (the query heads of the group), which
      // all see the same keys
      const int64_t groups = rows / n;
      for (int64_t i = 0; i < n; ++i) {
        float* dst = mp + (h * n + i) * total + j0;
        const int64_t visible = std::clamp<int64_t>(row_end(i, n, total) - j0, 0, width);
        int64_t j = 0;
        for (; j + 16 <= visible; j += 16) {
          v16 acc = {};
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

// Calls f with the head size as a count of 16-float chunks, for the sizes the kernel is built for.
template <typename T, typename F>
void dispatch_head(int64_t d, F&& f) {
  switch (d) {
    case 16: f.template operator()<T, 1>(); break;
    case 32: f.template operator()<T, 2>(); break;
    case 64: f.template operator()<T, 4>(); break;
    case 128: f.template operator()<T, 8>(); break;
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

}  // namespace

TORCH_LIBRARY(sparsespec_cpu, m) {
  m.def("few_rows_attention(Tensor q, Tensor k, Tensor v, float scale, int n) -> (Tensor, Tensor)");
  m.def("attention_mass(Tensor q, Tensor lse, Tensor k, float scale, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsespec_cpu, CPU, m) {
  m.impl("few_rows_attention", few_rows_attention);
  m.impl("attention_mass", attention_mass);
}
