// CRC-32C (Castagnoli), the block format's checksum: a portable table-driven reference, a version
// on the SSE4.2 crc32 instruction and one that folds with AVX-512 VPCLMULQDQ, the fastest the CPU
// has chosen at run time. All agree bit for bit.
#ifndef VC_CACHESTORE_CRC32C_H_
#define VC_CACHESTORE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace vc::cachestore {

// CRC-32C of `data`, continuing from `crc` (0 to start): Crc32c(b, Crc32c(a)) == Crc32c(a + b).
// Uses the fastest implementation this CPU has. Thread-safe.
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

// The reference: one table lookup per byte (about 0.4 GB/s). Thread-safe.
uint32_t Crc32cPortable(absl::string_view data, uint32_t crc = 0);

// Copies `src` to `dest` (src.size() bytes; the two must not overlap) and returns the CRC-32C of
// the bytes written, continuing from `crc` as Crc32c does. Each source byte is loaded once, and the
// CRC is computed from the loaded value that is stored: it vouches for the bytes at `dest` even if
// `src` changes during the copy (memory another process may write). Thread-safe.
uint32_t CopyCrc32c(char* dest, absl::string_view src, uint32_t crc = 0);

// CRC-32C of a leased block's UCX location (vericache.v1.RemoteBlock's fields): the worker address,
// the packed rkey, each preceded by its length, then the remote address and the size, as 8 bytes
// little-endian each. Thread-safe.
uint32_t LocationCrc32c(absl::string_view worker_address, absl::string_view rkey, uint64_t address,
                        uint64_t size);

// CopyCrc32c for copies whose destination will not be read again soon (more than the caches
// hold is being written): where the AVX-512 version runs, it writes `dest` with non-temporal
// stores, which do not read each destination line into the cache first, leaving `dest` in memory
// rather than in cache; elsewhere it is CopyCrc32c. The CRC vouches for the bytes written, as
// CopyCrc32c's does. Thread-safe.
uint32_t CopyCrc32cStreaming(char* dest, absl::string_view src, uint32_t crc = 0);

// CopyCrc32c on the reference implementation: a byte at a time. Thread-safe.
uint32_t CopyCrc32cPortable(char* dest, absl::string_view src, uint32_t crc = 0);

// The implementation Crc32c uses here: "avx512-vpclmulqdq", "sse4.2" or "portable".
absl::string_view Crc32cImplementation();

// The SSE4.2 version alone (where Crc32c picks a faster one, tests check this one too); the
// reference where the CPU lacks SSE4.2.
namespace crc32c_internal {
uint32_t Crc32cSse42(absl::string_view data, uint32_t crc);
uint32_t CopyCrc32cSse42(char* dest, absl::string_view src, uint32_t crc);
}  // namespace crc32c_internal

}  // namespace vc::cachestore

#endif  // VC_CACHESTORE_CRC32C_H_
