// y = x W^T (+ b) for a few rows x [R, in] against a weight W [out, in] on the CPU, in float32,
// reading W once per call for all the rows: a decode step (one row), a verification block (k + 1
// rows) and a batch's step (B rows) each stream the weights once.
//
// Every output y[r, o] is computed the same way whatever R is and wherever row r sits: W-lane
// partial sums over the input in chunk order (one FMA chain per lane), a fixed tree across the
// lanes, then the input's tail (past the last whole chunk) in order, then the bias. A row's result
// therefore does not depend on the rows computed with it, so a block of k + 1 rows gives, bit for
// bit, what k + 1 one-row steps give.
//
// Register blocking: a tile of RT rows x OB outputs keeps RT * OB accumulators in registers while
// the OB weight rows stream past (OB weight chunks and RT input chunks loaded per RT * OB FMAs);
// further row tiles re-read the same OB weight rows from L1. The outputs are shared among the
// threads in blocks, each thread streaming its own part of W.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <type_traits>
#include <utility>

#ifndef SPARSESPEC_LIB
#define SPARSESPEC_LIB sparsespec_cpu
#endif

namespace {

#if defined(__AVX512F__)
constexpr int W = 16;
constexpr int RT = 4;  // rows a tile: 16 of the 32 vector registers hold accumulators
#else
constexpr int W = 8;
constexpr int RT = 2;  // rows a tile: 8 of the 16 vector registers hold accumulators
#endif
constexpr int OB = 4;              // outputs a tile
constexpr int64_t kTaskOutputs = 64;  // outputs a thread takes at a time

typedef float vf __attribute__((vector_size(W * 4)));
typedef float vfu __attribute__((vector_size(W * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }

// Lanes [h, 2h) moved onto lanes [0, h) (the rest don't matter): one level of the lane tree.
template <int H, size_t... L>
constexpr vi down_mask(std::index_sequence<L...>) {
  return vi{static_cast<int>((L + H) % W)...};
}

// The sum of a vector's lanes by a fixed tree (halves added until one lane is left).
template <int H = W / 2>
inline float tree_sum(vf x) {
  if constexpr (H == 0) {
    return x[0];
  } else {
    constexpr vi m = down_mask<H>(std::make_index_sequence<W>{});
    return tree_sum<H / 2>(x + __builtin_shuffle(x, m));
  }
}

// y[r, o0 + j] for r < T rows and j < OB outputs (o0 + j < out).
#ifndef PF_BLOCKS
#define PF_BLOCKS 4
#endif
template <int T>
inline void tile(const float* x, int64_t xs, const float* w, int64_t in, int64_t outs, const float* bias, float* y,
                 int64_t ys, const float* w_end) {
  const int64_t chunks = in / W;
  vf acc[T][OB] = {};
  const float* wr[OB];
  for (int j = 0; j < OB; ++j) wr[j] = w + std::min<int64_t>(j, outs - 1) * in;  // past the end: repeat a row
  for (int64_t c = 0; c < chunks; ++c) {
    if (PF_BLOCKS > 0 && T != 0 && (c * W) % 16 == 0) {
      for (int j = 0; j < OB; ++j) {
        const float* p = wr[j] + c * W + PF_BLOCKS * OB * in;
        if (p < w_end) __builtin_prefetch(p, 0, 2);
      }
    }
    vf wc[OB];
    for (int j = 0; j < OB; ++j) wc[j] = load(wr[j] + c * W);
    for (int t = 0; t < T; ++t) {
      const vf xc = load(x + t * xs + c * W);
      for (int j = 0; j < OB; ++j) acc[t][j] += xc * wc[j];
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < OB && j < outs; ++j) {
      float s = tree_sum(acc[t][j]);
      for (int64_t i = chunks * W; i < in; ++i) s += x[t * xs + i] * wr[j][i];
      if (bias != nullptr) s += bias[j];
      y[t * ys + j] = s;
    }
  }
}

// The tiles of a product of `rows` rows and `out` outputs: blocks of kTaskOutputs outputs shared
// among the threads, each block's outputs OB at a time, its rows RT at a time and then one by one.
// `fn(std::integral_constant<int, T>, r, o, outs)` computes the tile of T rows from r and outs
// outputs from o. Every kernel here takes its tiles from this one loop, so a row's result depends
// on nothing but its own tile's arithmetic.
template <typename Fn>
void for_each_tile(int64_t rows, int64_t out, Fn&& fn) {
  at::parallel_for(0, (out + kTaskOutputs - 1) / kTaskOutputs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o_end = std::min(out, (task + 1) * kTaskOutputs);
      for (int64_t o = task * kTaskOutputs; o < o_end; o += OB) {
        const int64_t outs = std::min<int64_t>(OB, o_end - o);
        int64_t r = 0;
        for (; r + RT <= rows; r += RT) fn(std::integral_constant<int, RT>{}, r, o, outs);
        for (; r < rows; ++r) fn(std::integral_constant<int, 1>{}, r, o, outs);
      }
    }
  });
}

void linear_impl(const float* x, int64_t rows, int64_t xs, const float* w, int64_t in, int64_t out, const float* bias,
                 float* y, int64_t ys) {
  for_each_tile(rows, out, [&](auto t, int64_t r, int64_t o, int64_t outs) {
    tile<decltype(t)::value>(x + r * xs, xs, w + o * in, in, outs, bias != nullptr ? bias + o : nullptr,
                             y + r * ys + o, ys, w + out * in);
  });
}

at::Tensor few_rows_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "few_rows_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "few_rows_linear: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "few_rows_linear: x [R, in], w [out, in]");
  TORCH_CHECK(x.stride(1) == 1 && w.is_contiguous(), "few_rows_linear: contiguous rows of x, contiguous w");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == w.size(0),
                "few_rows_linear: bias [out] float32");
    b = bias->data_ptr<float>();
  }
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  linear_impl(x.data_ptr<float>(), x.size(0), x.stride(0), w.data_ptr<float>(), w.size(1), w.size(0), b,
              y.data_ptr<float>(), y.stride(0));
  return y;
}


// -- block-quantized weights: the same products, the weights decoded in registers ----------------
// GGUF's Q4_1 and Q8_0 layouts, in blocks of 32 inputs: Q4_1 keeps 16 bytes of 4-bit codes (byte i:
// input i in the low nibble, input i + 16 in the high one), an fp16 scale d and an fp16 minimum m,
// w = d * q + m; Q8_0 keeps 32 signed bytes and an fp16 scale, w = d * q. Decoded in float32, d * q
// is exact (an 11-bit mantissa times a 4- or 8-bit code) and the one rounding of d * q + m is the
// one the float32 model's own dequantization makes, so for a checkpoint stored in these formats the
// decoded weights are the float32 weights bit for bit. The products then run the float32 kernel's
// order (W-lane FMA chains over the input in chunk order, the same lane tree), so they give its
// outputs bit for bit: a draft in these formats reads fewer bytes than
// float32 (6.4x for Q4_1 and 3.8x for Q8_0, scales included) and loses nothing.
constexpr int64_t kBlock = 32;


template <bool Q4>
struct BlockFormat {
  static constexpr int64_t kBytes = Q4 ? kBlock / 2 : kBlock;  // code bytes a block
  // chunk c (W inputs) of a block as floats: the codes, not yet scaled. Widened with the x86 zero- /
  // sign-extending loads: GCC lowers a vector conversion from bytes lane by lane through scalar code.
  static inline vf codes(const uint8_t* block, int c) {
    const int first = c * W;  // inputs [first, first + W) of the block
#if defined(__AVX512F__)
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + (Q4 ? 0 : first)));
    __m512i v = Q4 ? _mm512_cvtepu8_epi32(raw) : _mm512_cvtepi8_epi32(raw);
    if constexpr (Q4) v = first < 16 ? _mm512_and_si512(v, _mm512_set1_epi32(15)) : _mm512_srli_epi32(v, 4);
    return reinterpret_cast<vf>(_mm512_cvtepi32_ps(v));
#elif defined(__AVX2__)
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + (Q4 ? first % 16 : first)));
    __m256i v = Q4 ? _mm256_cvtepu8_epi32(raw) : _mm256_cvtepi8_epi32(raw);
    if constexpr (Q4) v = first < 16 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
    return reinterpret_cast<vf>(_mm256_cvtepi32_ps(v));
#else
    vf out;
    for (int i = 0; i < W; ++i) {
      const int k = first + i;
      out[i] = Q4 ? static_cast<float>(k < 16 ? block[k] & 15 : block[k - 16] >> 4)
                  : static_cast<float>(static_cast<int8_t>(block[k]));
    }
    return out;
#endif
  }
};

template <bool Q4, int T>
inline void block_tile(const float* x, int64_t xs, const uint8_t* q, const _Float16* d, const _Float16* m, int64_t in,
                       int64_t outs, const float* bias, float* y, int64_t ys, const uint8_t* q_end) {
  using F = BlockFormat<Q4>;
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = blocks * F::kBytes;
  vf acc[T][OB] = {};
  int64_t rj[OB];
  for (int j = 0; j < OB; ++j) rj[j] = std::min<int64_t>(j, outs - 1);  // past the end: repeat a row
  for (int64_t g = 0; g < blocks; ++g) {
    if (PF_BLOCKS > 0) {
      for (int j = 0; j < OB; ++j) {
        const uint8_t* p = q + (rj[j] + PF_BLOCKS * OB) * row_bytes + g * F::kBytes;
        if (p < q_end) __builtin_prefetch(p, 0, 2);
      }
    }
    float dj[OB], mj[OB];
    for (int j = 0; j < OB; ++j) {
      dj[j] = static_cast<float>(d[rj[j] * blocks + g]);
      mj[j] = Q4 ? static_cast<float>(m[rj[j] * blocks + g]) : 0.0f;
    }
    for (int c = 0; c < kBlock / W; ++c) {
      vf xc[T];
      for (int t = 0; t < T; ++t) xc[t] = load(x + t * xs + g * kBlock + c * W);
      for (int j = 0; j < OB; ++j) {
        const vf code = F::codes(q + rj[j] * row_bytes + g * F::kBytes, c);
        const vf wc = Q4 ? code * dj[j] + mj[j] : code * dj[j];
        for (int t = 0; t < T; ++t) acc[t][j] += xc[t] * wc;
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < OB && j < outs; ++j) {
      float s = tree_sum(acc[t][j]);
      if (bias != nullptr) s += bias[j];
      y[t * ys + j] = s;
    }
  }
}

template <bool Q4>
void block_linear_impl(const float* x, int64_t rows, int64_t xs, const uint8_t* q, const _Float16* d,
                       const _Float16* m, int64_t in, int64_t out, const float* bias, float* y, int64_t ys) {
  const int64_t row_bytes = in / kBlock * BlockFormat<Q4>::kBytes;
  const int64_t blocks = in / kBlock;
  const uint8_t* q_end = q + out * row_bytes;
  for_each_tile(rows, out, [&](auto t, int64_t r, int64_t o, int64_t outs) {
    block_tile<Q4, decltype(t)::value>(x + r * xs, xs, q + o * row_bytes, d + o * blocks, Q4 ? m + o * blocks : nullptr,
                                       in, outs, bias != nullptr ? bias + o : nullptr, y + r * ys + o, ys, q_end);
  });
}

// x [R, in] float32 against a block-quantized weight of `out` rows: codes uint8 [out, in / 32 * bytes],
// scales (and Q4_1's minimums) float16 [out, in / 32].
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const c10::optional<at::Tensor>& mins, const c10::optional<at::Tensor>& bias) {
  const bool q4 = mins.has_value() && mins->defined();
  TORCH_CHECK(x.device().is_cpu() && codes.device().is_cpu(), "block_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, "block_linear: x [R, in] float32");
  const int64_t in = x.size(1), out = codes.size(0);
  TORCH_CHECK(in % kBlock == 0, "block_linear: the input size must be a multiple of 32");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2 &&
                  codes.size(1) == in / kBlock * (q4 ? kBlock / 2 : kBlock),
              "block_linear: codes uint8 [out, in / 32 * block bytes]");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.numel() == out * (in / kBlock),
              "block_linear: scales float16 [out, in / 32]");
  if (q4)
    TORCH_CHECK(mins->scalar_type() == at::kHalf && mins->is_contiguous() && mins->numel() == out * (in / kBlock),
                "block_linear: minimums float16 [out, in / 32]");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out,
                "block_linear: bias [out] float32");
    b = bias->data_ptr<float>();
  }
  auto y = at::empty({x.size(0), out}, x.options());
  const auto* d = reinterpret_cast<const _Float16*>(scales.data_ptr<at::Half>());
  if (q4) {
    const auto* m = reinterpret_cast<const _Float16*>(mins->data_ptr<at::Half>());
    block_linear_impl<true>(x.data_ptr<float>(), x.size(0), x.stride(0), codes.data_ptr<uint8_t>(), d, m, in, out, b,
                            y.data_ptr<float>(), y.stride(0));
  } else {
    block_linear_impl<false>(x.data_ptr<float>(), x.size(0), x.stride(0), codes.data_ptr<uint8_t>(), d, nullptr, in,
                             out, b, y.data_ptr<float>(), y.stride(0));
  }
  return y;
}

}  // namespace

#define SPARSESPEC_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define SPARSESPEC_IMPL(ns, m) TORCH_LIBRARY_IMPL(ns, CPU, m)

SPARSESPEC_FRAGMENT(SPARSESPEC_LIB, m) {
  m.def("few_rows_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("block_linear(Tensor x, Tensor codes, Tensor scales, Tensor? mins, Tensor? bias) -> Tensor");
}

SPARSESPEC_IMPL(SPARSESPEC_LIB, m) {
  m.impl("few_rows_linear", few_rows_linear);
  m.impl("block_linear", block_linear);
}
