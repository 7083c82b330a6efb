// Stored KV blocks for the cache-store tests.
#ifndef VC_TESTS_TESTING_BLOCKS_H_
#define VC_TESTS_TESTING_BLOCKS_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cachestore/store.h"

namespace vc::testing {

// A float32 block of 2 layers, 2 KV heads of 8 dimensions and 16 tokens whose payload bytes
// follow from `seed`, bound to the fingerprint {fingerprint_byte, 0, 0, ...} (copied to
// *fingerprint when given).
std::string RandomBlock(uint32_t seed, uint8_t fingerprint_byte, std::array<uint8_t, 32>* fingerprint = nullptr);

// The same with `tokens` tokens of 8 KV heads of 128 dimensions: 16 KiB a token over the 2 layers.
std::string LargeRandomBlock(uint32_t seed, uint8_t fingerprint_byte, int tokens);

// Corrupts the stored copy in `store`'s RAM tier of `tenant`'s block `key` (the tenant salt derived
// from `secret` as the store service derives it): the byte `from_end` bytes before the end of the
// block is xored with `mask`. The error when the block is not in RAM. *released (when given): whether
// the lease taken to find the block was still live when it was released (a test's leaping clock
// may have expired it).
absl::Status CorruptInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                          const cachestore::BlockKey& key, size_t from_end, uint8_t mask, bool* released = nullptr);

// Rewrites the stored copy in `store`'s RAM tier of `tenant`'s block `key` (as CorruptInRam finds
// it) into a well-formed block whose first float of layer 0 is NaN: every checksum holds, the
// value does not.
absl::Status PoisonInRam(cachestore::BlockStore& store, const std::string& secret, const std::string& tenant,
                         const cachestore::BlockKey& key);

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_BLOCKS_H_
