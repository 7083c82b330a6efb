#include "cachestore/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#endif

namespace vc::cachestore {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

const std::array<uint32_t, 256>& ByteTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

#if defined(__x86_64__)

// The hardware version runs three independent crc32 chains (the instruction's latency is three
// times its issue interval) over three adjacent stretches of a buffer, then joins them: the CRC
// of A || B is the CRC of A advanced over len(B) zero bytes, xor the CRC of B. Advancing over a
// fixed number of zeros multiplies the CRC by a power of x modulo the polynomial; for the short
// chains that product is applied a byte at a time from tables (the method of Mark Adler's crc32c.c).
constexpr size_t kLong = 8192;  // buffers of 3 * kLong bytes or more: one pass of three long chains
constexpr size_t kShort = 256;  // bytes per chain in what is left

// Multiplication modulo the polynomial, in the reflected bit order (bit 31 is x^0): advancing a CRC
// over zero bytes multiplies it by a power of x (the method of zlib's crc32_combine).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = uint32_t{1} << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) modulo the polynomial: the operator that advances a CRC over `bytes` zero bytes.
uint32_t ZerosOperator(size_t bytes) {
  static const std::array<uint32_t, 64> x2n = [] {  // x^(2^k)
    std::array<uint32_t, 64> t{};
    uint32_t p = uint32_t{1} << 30;  // x^1
    for (uint32_t& v : t) {
      v = p;
      p = MultModP(p, p);
    }
    return t;
  }();
  uint32_t p = uint32_t{1} << 31;  // x^0
  for (int k = 3; bytes != 0; bytes >>= 1, ++k) {
    if (bytes & 1) p = MultModP(x2n[k & 63], p);
  }
  return p;
}

// Lookup tables advancing a CRC over `bytes` zero bytes, one table per CRC byte.
struct ZerosTables {
  std::array<std::array<uint32_t, 256>, 4> t;

  // The operator is linear: its value on each byte of the CRC, tabulated.
  explicit ZerosTables(size_t bytes) {
    const uint32_t op = ZerosOperator(bytes);
    for (uint32_t n = 0; n < 256; ++n) {
      for (int b = 0; b < 4; ++b) t[b][n] = MultModP(op, n << (8 * b));
    }
  }

  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

// Folds the 8 bytes at p into crc; when copying, also stores them at d (from the same load).
template <bool kCopy>
__attribute__((target("sse4.2"), always_inline)) inline uint64_t Crc8(uint64_t crc, const unsigned char* p,
                                                                      unsigned char* d) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (kCopy) std::memcpy(d, &v, 8);
  return _mm_crc32_u64(crc, v);
}

template <bool kCopy>
__attribute__((target("sse4.2"), always_inline)) inline uint32_t Crc1(uint32_t crc, const unsigned char* p,
                                                                      unsigned char* d) {
  if constexpr (kCopy) *d = *p;
  return _mm_crc32_u8(crc, *p);
}

// Runs three chains over [p, p + stretch), [p + stretch, ...) and [p + 2 * stretch, ...) (whole
// words), copying to the same offsets of `d` when kCopy; advances p (and d) by one stretch.
template <bool kCopy>
__attribute__((target("sse4.2"), always_inline)) inline void Chains(uint64_t& crc0, uint64_t& crc1, uint64_t& crc2,
                                                                    const unsigned char*& p, unsigned char*& d,
                                                                    size_t stretch) {
  for (const unsigned char* end = p + stretch; p < end; p += 8) {
    crc0 = Crc8<kCopy>(crc0, p, d);
    crc1 = Crc8<kCopy>(crc1, p + stretch, d + stretch);
    crc2 = Crc8<kCopy>(crc2, p + 2 * stretch, d + 2 * stretch);
    if constexpr (kCopy) d += 8;
  }
}

// Three chains of `stretch` bytes each, as long as 3 * stretch bytes remain. When copying, `d`
// advances with `p`.
template <bool kCopy>
__attribute__((target("sse4.2"))) uint64_t ThreeWay(uint64_t crc0, const unsigned char*& p_io, unsigned char*& d_io,
                                                    size_t& n_io, size_t stretch, const ZerosTables& zeros) {
  // Locals, not the references: stores through `d` could alias them (unsigned char), which would
  // make the compiler reload them from memory on every step.
  const unsigned char* p = p_io;
  unsigned char* d = d_io;
  size_t n = n_io;
  while (n >= 3 * stretch) {
    uint64_t crc1 = 0, crc2 = 0;
    Chains<kCopy>(crc0, crc1, crc2, p, d, stretch);
    crc0 = zeros.Shift(static_cast<uint32_t>(crc0)) ^ static_cast<uint32_t>(crc1);
    crc0 = zeros.Shift(static_cast<uint32_t>(crc0)) ^ static_cast<uint32_t>(crc2);
    p += 2 * stretch;
    if constexpr (kCopy) d += 2 * stretch;
    n -= 3 * stretch;
  }
  p_io = p;
  d_io = d;
  n_io = n;
  return crc0;
}

// One three-way pass over the whole of a long buffer: three chains of a third of it each (whole
// words), so each chain streams through memory in one long run (hardware prefetchers follow it; a
// copy from memory runs near memcpy's speed). The operator that joins the chains is computed for
// the length at hand and cached per thread.
template <bool kCopy>
__attribute__((target("sse4.2"))) uint64_t ThreeWayWhole(uint64_t crc0, const unsigned char*& p_io,
                                                         unsigned char*& d_io, size_t& n_io) {
  thread_local size_t cached_stretch = 0;
  thread_local uint32_t cached_op = 0;
  const unsigned char* p = p_io;
  unsigned char* d = d_io;
  const size_t stretch = (n_io / 3) & ~size_t{7};
  if (stretch != cached_stretch) {
    cached_op = ZerosOperator(stretch);
    cached_stretch = stretch;
  }
  const uint32_t op = cached_op;
  uint64_t crc1 = 0, crc2 = 0;
  Chains<kCopy>(crc0, crc1, crc2, p, d, stretch);
  crc0 = MultModP(op, static_cast<uint32_t>(crc0)) ^ static_cast<uint32_t>(crc1);
  crc0 = MultModP(op, static_cast<uint32_t>(crc0)) ^ static_cast<uint32_t>(crc2);
  p_io = p + 2 * stretch;
  if constexpr (kCopy) d_io = d + 2 * stretch;
  n_io -= 3 * stretch;
  return crc0;
}

// CRC-32C of [p, p + n), continuing from crc; when copying, the bytes also go to d.
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t Sse42(const unsigned char* p, unsigned char* d, size_t n, uint32_t crc) {
  static const ZerosTables* const short_zeros = new ZerosTables(kShort);
  uint64_t c = ~crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --n) {
    c = Crc1<kCopy>(static_cast<uint32_t>(c), p, d);
    if constexpr (kCopy) ++d;
  }
  if (n >= 3 * kLong) c = ThreeWayWhole<kCopy>(c, p, d, n);
  c = ThreeWay<kCopy>(c, p, d, n, kShort, *short_zeros);
  for (; n >= 8; p += 8, n -= 8) {
    c = Crc8<kCopy>(c, p, d);
    if constexpr (kCopy) d += 8;
  }
  for (; n > 0; ++p, --n) {
    c = Crc1<kCopy>(static_cast<uint32_t>(c), p, d);
    if constexpr (kCopy) ++d;
  }
  return ~static_cast<uint32_t>(c);
}

// With AVX-512 and VPCLMULQDQ: carry-less multiplication folds 256 bytes at a time (four 512-bit
// accumulators of four 128-bit lanes each) into a 256-byte remainder with the same CRC, one
// sequential pass at memory speed; crc32 instructions finish the remainder and the tail. Folding a
// lane forward by 2048 bits multiplies its low half by x^(2048+32) and its high half by
// x^(2048-32) modulo the polynomial (bit-reflected, as the Intel white paper on CRC computation
// with PCLMULQDQ describes); the parity tests check the constants against the reference.
constexpr size_t kFoldBytes = 256;
constexpr uint64_t kFoldLow = 0xdcb17aa4;   // x^2080 mod P, reflected, shifted left by one
constexpr uint64_t kFoldHigh = 0xb9e02b86;  // x^2016 mod P, likewise

// 64 bytes at p + at, also stored at d + at when copying (from the same load); with kStream by a
// non-temporal store (d + at 64-byte aligned).
template <bool kCopy, bool kStream = false>
__attribute__((target("avx512f,vpclmulqdq"), always_inline)) inline __m512i Load64(const unsigned char* p,
                                                                                    unsigned char* d, size_t at) {
  const __m512i v = _mm512_loadu_si512(p + at);
  if constexpr (kCopy && kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + at), v);
  } else if constexpr (kCopy) {
    _mm512_storeu_si512(d + at, v);
  }
  return v;
}

// Four lanes folded forward over 2048 bits, xor the next 64 bytes.
__attribute__((target("avx512f,vpclmulqdq"), always_inline)) inline __m512i Fold(__m512i a, __m512i k,
                                                                                 __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11), next,
                                   0x96);  // three-way xor
}

// With kStream (copying only) the fold loop writes `d` with non-temporal stores, which skip
// reading each destination line into the cache before overwriting it: a copy into memory that is
// not in cache moves a third fewer bytes.
template <bool kCopy, bool kStream = false>
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) uint32_t Vpclmul(const unsigned char* p, unsigned char* d,
                                                                       size_t n, uint32_t crc) {
  static_assert(kCopy || !kStream);
  if constexpr (kStream) {
    // Up to the first 64-byte boundary of the destination with ordinary stores.
    const size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
    crc = Sse42<true>(p, d, head, crc);
    p += head;
    d += head;
    n -= head;
  }
  if (n < 2 * kFoldBytes) return Sse42<kCopy>(p, d, n, crc);
  const __m512i k = _mm512_set_epi64(kFoldHigh, kFoldLow, kFoldHigh, kFoldLow, kFoldHigh, kFoldLow, kFoldHigh,
                                     kFoldLow);
  // The CRC so far enters as the first four bytes xor its (pre-inverted) state.
  __m512i a0 = _mm512_xor_si512(Load64<kCopy, kStream>(p, d, 0),
                                _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  __m512i a1 = Load64<kCopy, kStream>(p, d, 64), a2 = Load64<kCopy, kStream>(p, d, 128),
          a3 = Load64<kCopy, kStream>(p, d, 192);
  size_t at = kFoldBytes;
  for (; at + kFoldBytes <= n; at += kFoldBytes) {
    a0 = Fold(a0, k, Load64<kCopy, kStream>(p, d, at));
    a1 = Fold(a1, k, Load64<kCopy, kStream>(p, d, at + 64));
    a2 = Fold(a2, k, Load64<kCopy, kStream>(p, d, at + 128));
    a3 = Fold(a3, k, Load64<kCopy, kStream>(p, d, at + 192));
  }
  // Non-temporal stores are weakly ordered: fence them before anything that may publish `d`.
  if constexpr (kStream) _mm_sfence();
  alignas(64) unsigned char rest[kFoldBytes];
  _mm512_store_si512(rest, a0);
  _mm512_store_si512(rest + 64, a1);
  _mm512_store_si512(rest + 128, a2);
  _mm512_store_si512(rest + 192, a3);
  // The remainder's CRC from a zero state, which Sse42 starts from when given ~0.
  const uint32_t folded = Sse42<false>(rest, nullptr, kFoldBytes, ~uint32_t{0});
  return Sse42<kCopy>(p + at, kCopy ? d + at : nullptr, n - at, folded);
}

uint32_t Crc32cVpclmul(absl::string_view data, uint32_t crc) {
  return Vpclmul<false>(reinterpret_cast<const unsigned char*>(data.data()), nullptr, data.size(), crc);
}

uint32_t CopyCrc32cVpclmul(char* dest, absl::string_view src, uint32_t crc) {
  return Vpclmul<true>(reinterpret_cast<const unsigned char*>(src.data()), reinterpret_cast<unsigned char*>(dest),
                       src.size(), crc);
}

uint32_t CopyCrc32cStreamingVpclmul(char* dest, absl::string_view src, uint32_t crc) {
  return Vpclmul<true, true>(reinterpret_cast<const unsigned char*>(src.data()),
                             reinterpret_cast<unsigned char*>(dest), src.size(), crc);
}

bool HaveVpclmul() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("sse4.2");
}

uint32_t Crc32cSse42(absl::string_view data, uint32_t crc) {
  return Sse42<false>(reinterpret_cast<const unsigned char*>(data.data()), nullptr, data.size(), crc);
}

uint32_t CopyCrc32cSse42(char* dest, absl::string_view src, uint32_t crc) {
  return Sse42<true>(reinterpret_cast<const unsigned char*>(src.data()), reinterpret_cast<unsigned char*>(dest),
                     src.size(), crc);
}

bool HaveSse42() { return __builtin_cpu_supports("sse4.2"); }

#else

uint32_t Crc32cSse42(absl::string_view data, uint32_t crc) { return Crc32cPortable(data, crc); }
uint32_t CopyCrc32cSse42(char* dest, absl::string_view src, uint32_t crc) { return CopyCrc32cPortable(dest, src, crc); }
uint32_t Crc32cVpclmul(absl::string_view data, uint32_t crc) { return Crc32cPortable(data, crc); }
uint32_t CopyCrc32cVpclmul(char* dest, absl::string_view src, uint32_t crc) { return CopyCrc32cPortable(dest, src, crc); }
uint32_t CopyCrc32cStreamingVpclmul(char* dest, absl::string_view src, uint32_t crc) {
  return CopyCrc32cPortable(dest, src, crc);
}
bool HaveSse42() { return false; }
bool HaveVpclmul() { return false; }

#endif

using CrcFn = uint32_t (*)(absl::string_view, uint32_t);

CrcFn Chosen() {
  static const CrcFn fn = HaveVpclmul() ? &Crc32cVpclmul : HaveSse42() ? &Crc32cSse42 : &Crc32cPortable;
  return fn;
}

using CopyCrcFn = uint32_t (*)(char*, absl::string_view, uint32_t);

CopyCrcFn ChosenCopy() {
  static const CopyCrcFn fn = HaveVpclmul()  ? &CopyCrc32cVpclmul
                              : HaveSse42() ? &CopyCrc32cSse42
                                            : &CopyCrc32cPortable;
  return fn;
}

CopyCrcFn ChosenStreamingCopy() {
  static const CopyCrcFn fn = HaveVpclmul() ? &CopyCrc32cStreamingVpclmul : ChosenCopy();
  return fn;
}

}  // namespace

namespace crc32c_internal {
uint32_t Crc32cSse42(absl::string_view data, uint32_t crc) {
  return HaveSse42() ? cachestore::Crc32cSse42(data, crc) : Crc32cPortable(data, crc);
}
uint32_t CopyCrc32cSse42(char* dest, absl::string_view src, uint32_t crc) {
  return HaveSse42() ? cachestore::CopyCrc32cSse42(dest, src, crc) : CopyCrc32cPortable(dest, src, crc);
}
}  // namespace crc32c_internal

uint32_t Crc32cPortable(absl::string_view data, uint32_t crc) {
  const std::array<uint32_t, 256>& t = ByteTable();
  crc = ~crc;
  for (unsigned char c : data) crc = t[(crc ^ c) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t CopyCrc32cPortable(char* dest, absl::string_view src, uint32_t crc) {
  const std::array<uint32_t, 256>& t = ByteTable();
  crc = ~crc;
  for (size_t i = 0; i < src.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(src[i]);
    dest[i] = static_cast<char>(c);
    crc = t[(crc ^ c) & 0xff] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t Crc32c(absl::string_view data, uint32_t crc) { return Chosen()(data, crc); }

uint32_t CopyCrc32c(char* dest, absl::string_view src, uint32_t crc) { return ChosenCopy()(dest, src, crc); }

uint32_t CopyCrc32cStreaming(char* dest, absl::string_view src, uint32_t crc) {
  return ChosenStreamingCopy()(dest, src, crc);
}

absl::string_view Crc32cImplementation() {
  return Chosen() == &Crc32cVpclmul ? "avx512-vpclmulqdq" : Chosen() == &Crc32cSse42 ? "sse4.2" : "portable";
}

uint32_t LocationCrc32c(absl::string_view worker_address, absl::string_view rkey, uint64_t address,
                        uint64_t size) {
  const auto u64 = [](uint64_t v) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    return b;
  };
  uint32_t crc = Crc32c(u64(worker_address.size()));
  crc = Crc32c(worker_address, crc);
  crc = Crc32c(u64(rkey.size()), crc);
  crc = Crc32c(rkey, crc);
  crc = Crc32c(u64(address), crc);
  return Crc32c(u64(size), crc);
}

}  // namespace vc::cachestore
