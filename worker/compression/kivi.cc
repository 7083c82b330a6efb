#include "worker/compression/kivi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace vc {

void QuantizeAsymmetric(const float* x, int64_t stride, int n, int bits, uint8_t* codes, float* scale,
                        float* min) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  const int levels = (1 << bits) - 1;
  const float s = (hi - lo) / static_cast<float>(levels);
  *scale = s;
  *min = lo;
  for (int i = 0; i < n; ++i) {
    int code = 0;
    if (s > 0.0f) code = static_cast<int>(std::nearbyint((x[i * stride] - lo) / s));
    code = std::clamp(code, 0, levels);
    const int bit = i * bits;
    codes[bit >> 3] = static_cast<uint8_t>(codes[bit >> 3] | (code << (bit & 7)));
  }
}

#if defined(__SSE2__)
namespace {

// Packs n codes, each `stride` apart in `codes`, at `bits` per code into out (whole bytes: bits
// divides 8 and n * bits is a multiple of 8).
template <int kBits>
void PackCodesOf(const uint8_t* codes, size_t stride, int n, uint8_t* out) {
  constexpr int kPer = 8 / kBits;
  for (int j = 0; j < n / kPer; ++j) {
    int byte = 0;
    for (int i = 0; i < kPer; ++i) byte |= codes[static_cast<size_t>(j * kPer + i) * stride] << (i * kBits);
    out[j] = static_cast<uint8_t>(byte);
  }
}

void PackCodes(const uint8_t* codes, size_t stride, int n, int bits, uint8_t* out) {
  switch (bits) {
    case 2: return PackCodesOf<2>(codes, stride, n, out);
    case 4: return PackCodesOf<4>(codes, stride, n, out);
    default: return PackCodesOf<8>(codes, stride, n, out);
  }
}

// QuantizeAsymmetric's code for four values x of runs with minimum lo and step s, as int32, with
// `divisor` s where s > 0 and 1 elsewhere (every value of such a run is lo, so its code is 0
// either way). Adding 2^23 leaves no bits below the units, so the sum is rounded to even there
// (std::nearbyint in the default rounding mode) and the subtraction is exact; _mm_max_ps(y, 0)
// and _mm_min_ps(y, levels) are std::max(0, y) and std::min(levels, y), NaN included.
inline __m128i KiviCodes4(__m128 x, __m128 lo, __m128 divisor, __m128 levels) {
  const __m128 shift = _mm_set1_ps(0x1p23f);
  __m128 y = _mm_div_ps(_mm_sub_ps(x, lo), divisor);
  y = _mm_sub_ps(_mm_add_ps(y, shift), shift);
  return _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(y, _mm_setzero_ps()), levels));
}

// Stores the low byte of each lane.
inline void StoreBytes4(__m128i codes, uint8_t* out) {
  const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(codes, codes), codes);
  const int32_t word = _mm_cvtsi128_si32(bytes);
  std::memcpy(out, &word, 4);
}

// s > 0 ? s : 1, per lane.
inline __m128 Divisor4(__m128 s) {
  const __m128 positive = _mm_cmpgt_ps(s, _mm_setzero_ps());
  return _mm_or_ps(_mm_and_ps(positive, s), _mm_andnot_ps(positive, _mm_set1_ps(1.0f)));
}

// QuantizeKiviGroup four lanes at a time: group, head_dim and value_group multiples of 4.
void QuantizeKiviGroupSse2(const float* k, const float* v, int g, int d, int value_group, int bits,
                           const KiviGroupOut& out) {
  const __m128 levels = _mm_set1_ps(static_cast<float>((1 << bits) - 1));
  std::vector<uint8_t> codes(static_cast<size_t>(g) * d);  // unpacked, [token][channel]
  // Keys: four channels per lane group, over the group's tokens in order.
  for (int c = 0; c < d; c += 4) {
    __m128 mn = _mm_loadu_ps(k + c), mx = mn;
    for (int t = 1; t < g; ++t) {
      const __m128 x = _mm_loadu_ps(k + static_cast<size_t>(t) * d + c);
      mn = _mm_min_ps(x, mn);  // x < mn ? x : mn, as std::min(mn, x)
      mx = _mm_max_ps(x, mx);  // x > mx ? x : mx, as std::max(mx, x)
    }
    const __m128 s = _mm_div_ps(_mm_sub_ps(mx, mn), levels), div = Divisor4(s);
    _mm_storeu_ps(out.k_scale + c, s);
    _mm_storeu_ps(out.k_min + c, mn);
    for (int t = 0; t < g; ++t) {
      const size_t at = static_cast<size_t>(t) * d + c;
      StoreBytes4(KiviCodes4(_mm_loadu_ps(k + at), mn, div, levels), codes.data() + at);
    }
  }
  const size_t run = static_cast<size_t>(g * bits / 8);
  for (int c = 0; c < d; ++c) PackCodes(codes.data() + c, d, g, bits, out.k_codes + c * run);
  // Values: four tokens at a time, a lane each. A 4 x 4 transpose turns four channels of the four
  // tokens into four channels' vectors, taken in order, so each token's run finds its minimum and
  // maximum channel by channel as QuantizeAsymmetric does; the codes then go four channels at a time.
  const int runs = d / value_group;
  const size_t row_bytes = static_cast<size_t>(d * bits / 8);
  for (int t0 = 0; t0 < g; t0 += 4) {
    for (int r = 0; r < runs; ++r) {
      const float* x = v + static_cast<size_t>(t0) * d + r * value_group;
      __m128 mn = _mm_setr_ps(x[0], x[d], x[2 * d], x[3 * d]), mx = mn;
      for (int c = 0; c < value_group; c += 4) {
        __m128 a = _mm_loadu_ps(x + c), b = _mm_loadu_ps(x + d + c), e = _mm_loadu_ps(x + 2 * d + c),
               f = _mm_loadu_ps(x + 3 * d + c);
        _MM_TRANSPOSE4_PS(a, b, e, f);
        for (const __m128 y : {a, b, e, f}) {
          mn = _mm_min_ps(y, mn);
          mx = _mm_max_ps(y, mx);
        }
      }
      const __m128 s = _mm_div_ps(_mm_sub_ps(mx, mn), levels), div = Divisor4(s);
      alignas(16) float mns[4], ss[4], divs[4];
      _mm_store_ps(mns, mn);
      _mm_store_ps(ss, s);
      _mm_store_ps(divs, div);
      for (int j = 0; j < 4; ++j) {
        const int t = t0 + j;
        out.v_scale[t * runs + r] = ss[j];
        out.v_min[t * runs + r] = mns[j];
        const float* xt = x + static_cast<size_t>(j) * d;
        for (int c = 0; c < value_group; c += 4) {
          StoreBytes4(KiviCodes4(_mm_loadu_ps(xt + c), _mm_set1_ps(mns[j]), _mm_set1_ps(divs[j]), levels),
                      codes.data() + c);
        }
        PackCodes(codes.data(), 1, value_group, bits, out.v_codes + t * row_bytes + r * value_group * bits / 8);
      }
    }
  }
}

}  // namespace
#endif

void QuantizeKiviGroup(const float* k, const float* v, int group, int head_dim, int value_group, int bits,
                       const KiviGroupOut& out) {
#if defined(__SSE2__)
  if (group % 4 == 0 && head_dim % 4 == 0 && value_group % 4 == 0) {
    return QuantizeKiviGroupSse2(k, v, group, head_dim, value_group, bits, out);
  }
#endif
  const int d = head_dim, runs = d / value_group;
  const size_t run = static_cast<size_t>(group * bits / 8), row_bytes = static_cast<size_t>(d * bits / 8);
  for (int c = 0; c < d; ++c) {
    QuantizeAsymmetric(k + c, d, group, bits, out.k_codes + c * run, out.k_scale + c, out.k_min + c);
  }
  for (int t = 0; t < group; ++t) {
    for (int r = 0; r < runs; ++r) {
      QuantizeAsymmetric(v + static_cast<size_t>(t) * d + r * value_group, 1, value_group, bits,
                         out.v_codes + t * row_bytes + r * value_group * bits / 8, out.v_scale + t * runs + r,
                         out.v_min + t * runs + r);
    }
  }
}

}  // namespace vc
