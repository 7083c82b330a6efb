// AVX2/FMA kernels. Compiled with -mavx2 -mfma -mf16c for this file only and chosen at run time
// when the CPU has those features.
//
// Invariance: every output is reduced in an order fixed by the model's shapes:
//  - MatMul: four 8-lane FMA accumulators over the columns (c mod 32 picks the accumulator), then
//    ((a0 + a1) + (a2 + a3)) and a fixed horizontal sum. Rows are tiled for weight reuse, but every
//    row gets the same instruction sequence, so the tile a row lands in does not matter. Threads
//    split the output columns, never a reduction.
//  - PagedAttention: the KV positions of a row are cut into fixed chunks of kKvSplit positions
//    (a property of the row's position alone); each chunk yields (max, sum, weighted V) and chunks
//    are merged in order. Threads take whole chunks.
// Shapes the vector code does not handle (columns or head_dim not a multiple of 8) go to the
// reference kernels; that choice depends on the shape only.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace vc::kernels {
namespace {

constexpr int kKvSplit = 256;  // positions per attention chunk
constexpr int kRowTile = 4;    // rows sharing one pass over a weight row
constexpr int64_t kOutGrain = 16;

inline float HSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// HSum of each of a[0..7], as lanes 0..7 of one vector: bitwise the same sums, 8 at a time.
inline __m256 HSum8(const __m256* a) {
  __m256 b[4];  // b[t] = low half + high half of a[t] | of a[t + 4]
  for (int t = 0; t < 4; ++t) {
    b[t] = _mm256_add_ps(_mm256_permute2f128_ps(a[t], a[t + 4], 0x20), _mm256_permute2f128_ps(a[t], a[t + 4], 0x31));
  }
  const auto pairs = [](__m256 x, __m256 y) {  // (x0 + x2, x1 + x3) of each 4-sum, two tokens per lane
    const __m256d xd = _mm256_castps_pd(x), yd = _mm256_castps_pd(y);
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(xd, yd)), _mm256_castpd_ps(_mm256_unpackhi_pd(xd, yd)));
  };
  return _mm256_hadd_ps(pairs(b[0], b[1]), pairs(b[2], b[3]));
}

inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline __m256 LoadBF16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 LoadF16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <DType T>
inline __m256 LoadW(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  if constexpr (T == DType::kBF16) return LoadBF16(static_cast<const uint16_t*>(base) + i);
  return LoadF16(static_cast<const uint16_t*>(base) + i);
}

// exp(x) for 8 lanes (Cephes-style range reduction and polynomial); deterministic.
inline __m256 Exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// One row tile of `R` rows against outputs [o0, o1) of w.
template <DType T, int R>
void MatMulTile(const float* x, const WeightView& w, int64_t o0, int64_t o1, float* y) {
  const int64_t cols = w.cols;
  const int64_t c32 = cols / 32 * 32;
  for (int64_t o = o0; o < o1; ++o) {
    const int64_t wrow = o * cols;
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r) {
      for (int a = 0; a < 4; ++a) acc[r][a] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    for (; c < c32; c += 32) {
      const __m256 w0 = LoadW<T>(w.data, wrow + c), w1 = LoadW<T>(w.data, wrow + c + 8);
      const __m256 w2 = LoadW<T>(w.data, wrow + c + 16), w3 = LoadW<T>(w.data, wrow + c + 24);
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * cols + c;
        acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), w1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), w2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), w3, acc[r][3]);
      }
    }
    for (int a = 0; c < cols; c += 8, ++a) {  // remaining multiples of 8: accumulators 0, 1, 2
      const __m256 wv = LoadW<T>(w.data, wrow + c);
      for (int r = 0; r < R; ++r) acc[r][a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * cols + c), wv, acc[r][a]);
    }
    for (int r = 0; r < R; ++r) {
      y[r * w.rows + o] = HSum(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
    }
  }
}

template <DType T>
void MatMulRange(const float* x, int64_t n, const WeightView& w, int64_t o0, int64_t o1, float* y) {
  int64_t r = 0;
  for (; r + kRowTile <= n; r += kRowTile) MatMulTile<T, kRowTile>(x + r * w.cols, w, o0, o1, y + r * w.rows);
  for (; r < n; ++r) MatMulTile<T, 1>(x + r * w.cols, w, o0, o1, y + r * w.rows);
}

// Partial attention of the query heads of one KV head over one chunk of positions.
struct Partial {
  float m, l;
};

class Avx2 final : public Backend {
 public:
  explicit Avx2(bool fixed_split) : fixed_split_(fixed_split) {}
  absl::string_view name() const override { return fixed_split_ ? "avx2" : "avx2-variable-split"; }

  void MatMul(const float* x, int64_t n, const WeightView& w, float* y) const override {
    if (w.cols % 8 != 0 || n == 0) return ReferenceBackend().MatMul(x, n, w, y);
    auto run = [&](int64_t o0, int64_t o1) {
      switch (w.dtype) {
        case DType::kF32: return MatMulRange<DType::kF32>(x, n, w, o0, o1, y);
        case DType::kBF16: return MatMulRange<DType::kBF16>(x, n, w, o0, o1, y);
        case DType::kF16: return MatMulRange<DType::kF16>(x, n, w, o0, o1, y);
      }
    };
    // Small jobs are not worth waking the other threads.
    if (n * w.rows * w.cols < 32768) return run(0, w.rows);
    KernelThreadPool().ParallelFor(w.rows, kOutGrain, run);
  }

  void RmsNorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps,
               float* y) const override {
    if (dim % 8 != 0) return ReferenceBackend().RmsNorm(x, n, dim, weight, eps, y);
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * dim;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < dim; i += 8) {
        const __m256 v = _mm256_loadu_ps(xr + i);
        acc = _mm256_fmadd_ps(v, v, acc);
      }
      const float inv = 1.0f / std::sqrt(HSum(acc) / static_cast<float>(dim) + eps);
      const __m256 s = _mm256_set1_ps(inv);
      for (int64_t i = 0; i < dim; i += 8) {
        _mm256_storeu_ps(y + r * dim + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), s), _mm256_loadu_ps(weight + i)));
      }
    }
  }

  void Rope(float* x, int64_t n, int heads, int head_dim, const float* cos,
            const float* sin) const override {
    const int half = head_dim / 2;
    if (half % 8 != 0) return ReferenceBackend().Rope(x, n, heads, head_dim, cos, sin);
    for (int64_t r = 0; r < n; ++r) {
      for (int h = 0; h < heads; ++h) {
        float* v = x + (r * heads + h) * head_dim;
        for (int i = 0; i < half; i += 8) {
          const __m256 c = _mm256_loadu_ps(cos + r * half + i), s = _mm256_loadu_ps(sin + r * half + i);
          const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
          _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
          _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
        }
      }
    }
  }

  void SwiGlu(const float* gate, const float* up, int64_t count, float* out) const override {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= count; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 sig = _mm256_div_ps(g, _mm256_add_ps(one, Exp256(_mm256_sub_ps(zero, g))));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(sig, _mm256_loadu_ps(up + i)));
    }
    // Each lane computes the same function, so the tail runs the vector code on a padded copy.
    if (i < count) {
      alignas(32) float g[8] = {0}, u[8] = {0}, o[8];
      for (int64_t j = i; j < count; ++j) g[j - i] = gate[j], u[j - i] = up[j];
      const __m256 gv = _mm256_load_ps(g);
      const __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(one, Exp256(_mm256_sub_ps(zero, gv))));
      _mm256_store_ps(o, _mm256_mul_ps(sig, _mm256_load_ps(u)));
      for (int64_t j = i; j < count; ++j) out[j] = o[j - i];
    }
  }

  void PagedAttention(const float* q, int64_t n, int num_heads, const AttentionRow* rows,
                      const PagedKvLayer& kv, float scale, float* out) const override {
    const int d = kv.head_dim;
    if (d % 8 != 0 || d > 256 || num_heads / kv.num_kv_heads > 16) {
      return ReferenceBackend().PagedAttention(q, n, num_heads, rows, kv, scale, out);
    }
    RunAttention(q, n, num_heads, kv.num_kv_heads, d, scale, out,
                 [&](int64_t r, int) { return static_cast<int64_t>(rows[r].kv_len); },
                 [&](int64_t r, int g) { return PagedSource{rows[r].block_table, &kv, g}; });
  }

  void CompressedAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int d,
                           const CompressedKvHead* kv, float scale, float* out) const override {
    bool vector_ok = d % 8 == 0 && d <= 256 && num_heads / num_kv_heads <= 16;
    for (int64_t i = 0; i < n * num_kv_heads && vector_ok; ++i) {
      const QuantizedKvHead& qk = kv[i].quant;
      // Quantized runs of whole key groups of whole vectors, as kernels.h requires: the float path
      // scores 8 positions per store.
      vector_ok = qk.tokens == 0 || ((qk.bits == 2 || qk.bits == 4 || qk.bits == 8) && qk.key_group % 8 == 0 &&
                                     qk.tokens % qk.key_group == 0);
    }
    if (!vector_ok) return ReferenceBackend().CompressedAttention(q, n, num_heads, num_kv_heads, d, kv, scale, out);
    RunAttention(q, n, num_heads, num_kv_heads, d, scale, out,
                 [&](int64_t r, int g) {
                   const CompressedKvHead& c = kv[r * num_kv_heads + g];
                   return static_cast<int64_t>(c.quant.tokens) + c.dense.count;
                 },
                 [&](int64_t r, int g) { return CompressedSource{&kv[r * num_kv_heads + g], d}; });
  }

 private:
  struct PagedSource {
    const int32_t* table;
    const PagedKvLayer* kv;
    int g;
    int64_t QuantizedTokens() const { return 0; }
    // K and V rows of positions [j0, j0 + n), a block at a time.
    void Rows(int64_t j0, int64_t n, const float** k, const float** v) const {
      const int64_t bs = kv->block_size, row = int64_t{kv->num_kv_heads} * kv->head_dim;
      for (int64_t i = 0; i < n;) {
        const int64_t j = j0 + i, off = j % bs, run = std::min(n - i, bs - off);
        const int64_t at = table[j / bs] * kv->block_stride + off * row + int64_t{g} * kv->head_dim;
        for (int64_t u = 0; u < run; ++u, ++i) {
          k[i] = kv->k + at + u * row;
          v[i] = kv->v + at + u * row;
        }
      }
    }
  };

  // A compressed cache's KV head: KIVI-quantized positions [0, QuantizedTokens()), then dense rows.
  struct CompressedSource {
    const CompressedKvHead* c;
    int d;
    int64_t QuantizedTokens() const { return c->quant.tokens; }
    // Dense rows of positions [j0, j0 + n), all at or past QuantizedTokens().
    void Rows(int64_t j0, int64_t n, const float** k, const float** v) const {
      const DenseKvHead& dn = c->dense;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = dn.rows[j0 + i - c->quant.tokens] * dn.stride;
        k[i] = dn.k + at;
        v[i] = dn.v + at;
      }
    }

    // Codes i0..i0+7 of a packed run (i0 a multiple of 8, so they start on a byte), as floats.
    template <int B>
    static __m256 Codes8(const uint8_t* run, int i0) {
      const uint8_t* p = run + i0 * B / 8;
      if constexpr (B == 8) {
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
      } else {
        uint32_t word;
        if constexpr (B == 4) {
          std::memcpy(&word, p, 4);
        } else {
          uint16_t half;
          std::memcpy(&half, p, 2);
          word = half;
        }
        const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
        const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts),
                                           _mm256_set1_epi32((1 << B) - 1));
        return _mm256_cvtepi32_ps(v);
      }
    }

    // Scores of quantized positions [t0, t1) (multiples of 8) for `group` query heads q [group, d]
    // into s[h * len + (t - t0)].
    void QuantScores(int64_t t0, int64_t t1, const float* q, int group, float scale, float* s, int64_t len) const {
      const QuantizedKvHead& qk = c->quant;
      switch (qk.bits) {
        case 2: return QuantScoresB<2>(t0, t1, q, group, scale, s, len);
        case 4:
          if (qk.key_group == 32 && d % 32 == 0) return QuantScores4(t0, t1, q, group, scale, s, len);
          return QuantScoresB<4>(t0, t1, q, group, scale, s, len);
        default: return QuantScoresB<8>(t0, t1, q, group, scale, s, len);
      }
    }

    // Keys are min + code * scale per channel of each key group, so q . k = sum(q * min) +
    // sum((q * scale) * code): 8 tokens per FMA, no dequantized rows.
    template <int B>
    void QuantScoresB(int64_t t0, int64_t t1, const float* q, int group, float scale, float* s, int64_t len) const {
      const QuantizedKvHead& qk = c->quant;
      const int64_t run = int64_t{qk.key_group} * qk.bits / 8;
      alignas(32) float qs[16 * 256];
      float bias[16];
      __m256 cv[256];
      int64_t current = -1;
      for (int64_t t = t0; t < t1; t += 8) {
        const int64_t gi = t / qk.key_group;
        if (gi != current) {
          current = gi;
          const float* ks = qk.k_scale + gi * d;
          const float* km = qk.k_min + gi * d;
          for (int h = 0; h < group; ++h) {
            float b = 0.0f;
            for (int ch = 0; ch < d; ++ch) {
              qs[h * d + ch] = q[h * d + ch] * ks[ch];
              b += q[h * d + ch] * km[ch];
            }
            bias[h] = b;
          }
        }
        const uint8_t* base = qk.k_codes + gi * d * run;
        const int off = static_cast<int>(t - gi * qk.key_group);
        for (int ch = 0; ch < d; ++ch) cv[ch] = Codes8<B>(base + ch * run, off);
        for (int h = 0; h < group; ++h) {
          __m256 acc = _mm256_set1_ps(bias[h]);
          for (int ch = 0; ch < d; ++ch) acc = _mm256_fmadd_ps(_mm256_set1_ps(qs[h * d + ch]), cv[ch], acc);
          _mm256_storeu_ps(s + h * len + (t - t0), _mm256_mul_ps(acc, _mm256_set1_ps(scale)));
        }
      }
    }

    // 4-bit keys in groups of 32 tokens, with integer products. Per key group and query head,
    // q * scale is rounded to integers in [-63, 63] (step a = max |q * scale| / 63), and a score
    // is a * sum(qi * code) + q . min: 16-bit multiply-adds of channel pairs for 32 tokens at once
    // (32 channels x 15 x 63 < 2^15, so 32-channel partial sums cannot overflow). Draft-only: the
    // rounding of q adds an error of at most a / 2 per channel to the 4-bit keys' own.
    void QuantScores4(int64_t t0, int64_t t1, const float* q, int group, float scale, float* s, int64_t len) const {
      const QuantizedKvHead& qk = c->quant;
      const __m128i low4 = _mm_set1_epi8(0x0f);
      alignas(32) int8_t qi[16][256];
      alignas(32) float tok[16][32];
      float step[16];
      for (int64_t g0 = t0 / 32 * 32; g0 < t1; g0 += 32) {
        const int64_t gi = g0 / 32;
        const float* ks = qk.k_scale + gi * d;
        const float* km = qk.k_min + gi * d;
        for (int h = 0; h < group; ++h) {
          const float* qh = q + h * d;
          __m256 amax = _mm256_setzero_ps(), bias = _mm256_setzero_ps();
          const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
          for (int ch = 0; ch < d; ch += 8) {
            const __m256 qv = _mm256_loadu_ps(qh + ch);
            amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_mul_ps(qv, _mm256_loadu_ps(ks + ch)), abs_mask));
            bias = _mm256_fmadd_ps(qv, _mm256_loadu_ps(km + ch), bias);
          }
          const float m = HMax(amax);
          const float a = m > 0.0f ? m / 63.0f : 1.0f;
          const __m256 inv = _mm256_set1_ps(1.0f / a);
          for (int ch = 0; ch < d; ch += 32) {
            __m256i w[4];
            for (int i = 0; i < 4; ++i) {
              const int at = ch + 8 * i;
              w[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(qh + at), _mm256_loadu_ps(ks + at)), inv));
            }
            const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
            _mm256_store_si256(reinterpret_cast<__m256i*>(&qi[h][ch]),
                               _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
          }
          step[h] = a * scale;
          const __m256 b = _mm256_set1_ps(HSum(bias) * scale);
          for (int i = 0; i < 4; ++i) _mm256_store_ps(&tok[h][8 * i], b);
        }
        const uint8_t* codes = qk.k_codes + gi * d * 16;  // 16 bytes (32 tokens) per channel
        for (int cb = 0; cb < d; cb += 32) {
          // Per channel, byte i holds tokens 2i (low nibble) and 2i + 1: split into a 256-bit row
          // of even tokens | odd tokens, interleave two channels' rows byte by byte, and multiply
          // by the pair (q_c, q_c+1). Lanes: x0 = tokens 0, 2, .., 14 | 1, 3, .., 15; x1 = 16.. | 17..
          __m256i acc[16][2];
          for (int h = 0; h < group; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_si256();
          for (int ch = cb; ch < cb + 32; ch += 2) {
            const __m128i ra = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + ch * 16));
            const __m128i rb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (ch + 1) * 16));
            const __m256i a = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(ra, 4), low4), _mm_and_si128(ra, low4));
            const __m256i b = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(rb, 4), low4), _mm_and_si128(rb, low4));
            const __m256i x0 = _mm256_unpacklo_epi8(a, b), x1 = _mm256_unpackhi_epi8(a, b);
            for (int h = 0; h < group; ++h) {
              int16_t pair;
              std::memcpy(&pair, &qi[h][ch], 2);
              const __m256i w = _mm256_set1_epi16(pair);
              acc[h][0] = _mm256_add_epi16(acc[h][0], _mm256_maddubs_epi16(x0, w));
              acc[h][1] = _mm256_add_epi16(acc[h][1], _mm256_maddubs_epi16(x1, w));
            }
          }
          for (int h = 0; h < group; ++h) {
            const __m256 st = _mm256_set1_ps(step[h]);
            for (int x = 0; x < 2; ++x) {
              const __m256 even = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc[h][x])));
              const __m256 odd = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc[h][x], 1)));
              const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
              float* out = &tok[h][16 * x];
              _mm256_store_ps(out, _mm256_fmadd_ps(_mm256_permute2f128_ps(lo, hi, 0x20), st, _mm256_load_ps(out)));
              _mm256_store_ps(out + 8, _mm256_fmadd_ps(_mm256_permute2f128_ps(lo, hi, 0x31), st, _mm256_load_ps(out + 8)));
            }
          }
        }
        const int64_t from = std::max(g0, t0), to = std::min(g0 + 32, t1);
        for (int h = 0; h < group; ++h) std::memcpy(s + h * len + (from - t0), &tok[h][from - g0], (to - from) * 4);
      }
    }

    // Dequantizes the values of quantized positions [t0, t1) into rows [t1 - t0, d] of `out`.
    void QuantValues(int64_t t0, int64_t t1, float* out) const {
      const QuantizedKvHead& qk = c->quant;
      switch (qk.bits) {
        case 2: return QuantValuesB<2>(t0, t1, out);
        case 4: return QuantValuesB<4>(t0, t1, out);
        default: return QuantValuesB<8>(t0, t1, out);
      }
    }
    template <int B>
    void QuantValuesB(int64_t t0, int64_t t1, float* out) const {
      const QuantizedKvHead& qk = c->quant;
      const int groups = d / qk.value_group, per_group = qk.value_group / 8;
      const int64_t row_bytes = int64_t{d} * B / 8;
      const __m128i low4 = _mm_set1_epi8(0x0f);
      for (int64_t t = t0; t < t1; ++t, out += d) {
        const uint8_t* row = qk.v_codes + t * row_bytes;
        const float* vs = qk.v_scale + t * groups;
        const float* vm = qk.v_min + t * groups;
        if constexpr (B == 4) {
          if (per_group % 4 == 0) {
            // 32 codes from 16 bytes: low nibbles are the even channels, high the odd ones.
            for (int c0 = 0; c0 < d; c0 += 32) {
              const __m128i r = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c0 / 2));
              const __m128i even = _mm_and_si128(r, low4), odd = _mm_and_si128(_mm_srli_epi16(r, 4), low4);
              const __m128i lo = _mm_unpacklo_epi8(even, odd), hi = _mm_unpackhi_epi8(even, odd);
              const __m256 sc = _mm256_set1_ps(vs[c0 / qk.value_group]), mn = _mm256_set1_ps(vm[c0 / qk.value_group]);
              const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
              for (int i = 0; i < 4; ++i) {
                const __m256 code = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
                _mm256_storeu_ps(out + c0 + 8 * i, _mm256_fmadd_ps(code, sc, mn));
              }
            }
            continue;
          }
        }
        for (int g = 0; g < groups; ++g) {
          const __m256 sc = _mm256_set1_ps(vs[g]), mn = _mm256_set1_ps(vm[g]);
          for (int i = g * per_group; i < (g + 1) * per_group; ++i) {
            _mm256_storeu_ps(out + 8 * i, _mm256_fmadd_ps(Codes8<B>(row, 8 * i), sc, mn));
          }
        }
      }
    }
  };

  // What one thread's attention tasks reuse: scores, row pointers, dequantized values.
  struct Scratch {
    std::vector<float> s;
    std::vector<const float*> k, v;
    std::vector<float> values;
  };

  // Tasks are (row, KV head, chunk); partials are stored per task and merged per row and head in
  // chunk order. len(r, g) is the number of positions row r's KV head g attends to; source(r, g)
  // gives their K/V rows.
  template <typename LenFn, typename SourceFn>
  void RunAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int d, float scale, float* out,
                    LenFn len_of, SourceFn source_of) const {
    const int group = num_heads / num_kv_heads;
    const int threads = KernelThreadPool().num_threads();
    const int64_t pairs = n * num_kv_heads;
    std::vector<int64_t> first_task(pairs + 1, 0), length(pairs);
    std::vector<int> split(pairs);
    int64_t positions = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      length[i] = len_of(i / num_kv_heads, static_cast<int>(i % num_kv_heads));
      int s = kKvSplit;
      if (!fixed_split_) s = std::max<int>(16, static_cast<int>(((length[i] + threads - 1) / threads + 7) / 8 * 8));
      split[i] = s;
      first_task[i + 1] = first_task[i] + std::max<int64_t>(1, (length[i] + s - 1) / s);
      positions += length[i];
    }
    const int64_t tasks = first_task[pairs];
    std::vector<Partial> part(static_cast<size_t>(tasks * group));
    std::vector<float> acc(static_cast<size_t>(tasks * group * d));

    // Tasks run chunk-major: chunk c of every (row, KV head) pair, then chunk c + 1. The rows of a
    // verify pass read the same KV, so each chunk is loaded from memory once and reused from cache
    // by the other rows. The order changes which task runs when, never what a task computes.
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(tasks));
    for (int64_t c = 0; static_cast<int64_t>(order.size()) < tasks; ++c) {
      for (int64_t i = 0; i < pairs; ++i) {
        if (first_task[i] + c < first_task[i + 1]) order.push_back(i * (int64_t{1} << 40) + c);
      }
    }
    auto run = [&](int64_t t0, int64_t t1) {
      Scratch scratch;
      for (int64_t o = t0; o < t1; ++o) {
        const int64_t i = order[o] >> 40, c = order[o] & ((int64_t{1} << 40) - 1), t = first_task[i] + c;
        const int64_t r = i / num_kv_heads;
        const int g = static_cast<int>(i % num_kv_heads);
        const int64_t j0 = c * split[i], j1 = std::min<int64_t>(length[i], j0 + split[i]);
        ChunkAttention(q + (r * num_heads + g * group) * d, group, d, source_of(r, g), j0, j1, scale, &scratch,
                       &part[t * group], &acc[t * group * d]);
      }
    };
    if (tasks >= 2 && positions >= 4096) {
      KernelThreadPool().ParallelFor(tasks, 1, run);
    } else {
      run(0, tasks);
    }

    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t r = i / num_kv_heads;
      const int g = static_cast<int>(i % num_kv_heads);
      for (int gi = 0; gi < group; ++gi) {
        float* o = out + (r * num_heads + g * group + gi) * d;
        if (length[i] == 0) {
          std::fill(o, o + d, 0.0f);
          continue;
        }
        float m = -INFINITY;
        for (int64_t t = first_task[i]; t < first_task[i + 1]; ++t) m = std::max(m, part[t * group + gi].m);
        float l = 0.0f;
        __m256 sum[32];
        for (int k = 0; k < d / 8; ++k) sum[k] = _mm256_setzero_ps();
        for (int64_t t = first_task[i]; t < first_task[i + 1]; ++t) {
          const Partial& p = part[t * group + gi];
          const float w = std::exp(p.m - m);
          l += p.l * w;
          const __m256 wv = _mm256_set1_ps(w);
          const float* a = &acc[(t * group + gi) * d];
          for (int k = 0; k < d / 8; ++k) sum[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8 * k), wv, sum[k]);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / l);
        for (int k = 0; k < d / 8; ++k) _mm256_storeu_ps(o + 8 * k, _mm256_mul_ps(sum[k], inv));
      }
    }
  }

  // Attention of `group` query heads (q [group, d]) over the source's positions [j0, j1).
  template <typename Source>
  static void ChunkAttention(const float* q, int group, int d, const Source& src, int64_t j0, int64_t j1,
                             float scale, Scratch* sc, Partial* part, float* acc) {
    switch (d) {
      case 32: return ChunkAttentionD<4>(q, group, d, src, j0, j1, scale, sc, part, acc);
      case 64: return ChunkAttentionD<8>(q, group, d, src, j0, j1, scale, sc, part, acc);
      default: return ChunkAttentionD<0>(q, group, d, src, j0, j1, scale, sc, part, acc);
    }
  }

  // DV = d / 8 when known at compile time (0: read from d). Every position's score is the same
  // instruction sequence wherever the position sits in the chunk: (q . k) in 8 lanes, reduced as
  // HSum, times scale; V is accumulated in position order.
  template <int DV, typename Source>
  static void ChunkAttentionD(const float* q, int group, int d, const Source& src, int64_t j0, int64_t j1,
                              float scale, Scratch* sc, Partial* part, float* acc) {
    const int dv = DV != 0 ? DV : d / 8;
    const int64_t len = j1 - j0;
    if (len <= 0) {
      for (int h = 0; h < group; ++h) {
        part[h] = {-INFINITY, 0.0f};
        std::fill(acc + h * d, acc + (h + 1) * d, 0.0f);
      }
      return;
    }
    if (static_cast<int64_t>(sc->s.size()) < group * len) sc->s.resize(static_cast<size_t>(group * len));
    if (static_cast<int64_t>(sc->k.size()) < len + 8) sc->k.resize(len + 8), sc->v.resize(len + 8);
    float* s = sc->s.data();
    const float** kp = sc->k.data();
    const float** vp = sc->v.data();
    // Positions before `first_dense` (chunk-relative) are quantized.
    const int64_t first_dense = std::clamp<int64_t>(src.QuantizedTokens() - j0, 0, len);
    if constexpr (std::is_same_v<Source, CompressedSource>) {
      if (first_dense > 0) {
        src.QuantScores(j0, j0 + first_dense, q, group, scale, s, len);
        if (static_cast<int64_t>(sc->values.size()) < first_dense * d) sc->values.resize(first_dense * d);
        src.QuantValues(j0, j0 + first_dense, sc->values.data());
        for (int64_t j = 0; j < first_dense; ++j) vp[j] = sc->values.data() + j * d;
      }
    }
    src.Rows(j0 + first_dense, len - first_dense, kp + first_dense, vp + first_dense);
    alignas(32) static const float kZeros[256] = {};
    for (int64_t j = len; j < len + 8; ++j) kp[j] = kZeros;  // pads the last group of 8

    const __m256 scale_v = _mm256_set1_ps(scale);
    for (int h = 0; h < group; ++h) {
      __m256 qh[DV != 0 ? DV : 32];
      for (int i = 0; i < dv; ++i) qh[i] = _mm256_loadu_ps(q + h * d + 8 * i);
      float* sh = s + h * len;
      for (int64_t j = first_dense; j < len; j += 8) {
        __m256 a[8];
        for (int u = 0; u < 8; ++u) {
          const float* k = kp[j + u];
          a[u] = _mm256_mul_ps(qh[0], _mm256_loadu_ps(k));
          for (int i = 1; i < dv; ++i) a[u] = _mm256_fmadd_ps(qh[i], _mm256_loadu_ps(k + 8 * i), a[u]);
        }
        const __m256 r = _mm256_mul_ps(HSum8(a), scale_v);
        if (j + 8 <= len) {
          _mm256_storeu_ps(sh + j, r);
        } else {
          alignas(32) float tail[8];
          _mm256_store_ps(tail, r);
          std::memcpy(sh + j, tail, (len - j) * 4);
        }
      }
    }
    for (int h = 0; h < group; ++h) {
      float* sh = s + h * len;
      // max is exact in any order.
      __m256 m8 = _mm256_set1_ps(-INFINITY);
      int64_t j = 0;
      for (; j + 8 <= len; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sh + j));
      float m = HMax(m8);
      for (; j < len; ++j) m = std::max(m, sh[j]);
      const __m256 mv = _mm256_set1_ps(m);
      __m256 lsum = _mm256_setzero_ps();
      j = 0;
      for (; j + 8 <= len; j += 8) {
        const __m256 p = Exp256(_mm256_sub_ps(_mm256_loadu_ps(sh + j), mv));
        _mm256_storeu_ps(sh + j, p);
        lsum = _mm256_add_ps(lsum, p);
      }
      float l = HSum(lsum);
      for (; j < len; ++j) {
        alignas(32) float one[8] = {sh[j] - m, 0, 0, 0, 0, 0, 0, 0};
        _mm256_store_ps(one, Exp256(_mm256_load_ps(one)));
        sh[j] = one[0];
        l += sh[j];
      }
      part[h] = {m, l};
    }
    // Two heads per pass when rows are short, so 2 * dv independent accumulators hide FMA latency.
    int h = 0;
    if constexpr (DV != 0 && DV <= 4) {
      for (; h + 2 <= group; h += 2) AccumulateV<DV, 2>(s + h * len, len, vp, acc + h * d);
    }
    for (; h < group; ++h) AccumulateV<DV, 1>(s + h * len, len, vp, acc + h * d, dv);
  }

  // acc[hb][d] = sum over positions j of p[hb * len + j] * v[j], in position order.
  template <int DV, int HB>
  static void AccumulateV(const float* p, int64_t len, const float* const* v, float* acc, int dv_runtime = DV) {
    const int dv = DV != 0 ? DV : dv_runtime;
    __m256 o[HB][DV != 0 ? DV : 32];
    for (int hb = 0; hb < HB; ++hb) {
      for (int i = 0; i < dv; ++i) o[hb][i] = _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < len; ++j) {
      const float* vj = v[j];
      for (int hb = 0; hb < HB; ++hb) {
        const __m256 pj = _mm256_set1_ps(p[hb * len + j]);
        for (int i = 0; i < dv; ++i) o[hb][i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), o[hb][i]);
      }
    }
    for (int hb = 0; hb < HB; ++hb) {
      for (int i = 0; i < dv; ++i) _mm256_storeu_ps(acc + hb * dv * 8 + 8 * i, o[hb][i]);
    }
  }

  const bool fixed_split_;
};

}  // namespace

const Backend* Avx2Backend() {
  static const Avx2* backend = new Avx2(/*fixed_split=*/true);
  return backend;
}

const Backend* Avx2VariableSplitBackend() {
  static const Avx2* backend = new Avx2(/*fixed_split=*/false);
  return backend;
}

}  // namespace vc::kernels
