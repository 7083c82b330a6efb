// Stored KV blocks for the cache-store tests.
#ifndef VC_TESTS_TESTING_BLOCKS_H_
#define VC_TESTS_TESTING_BLOCKS_H_

#include <array>
#include <cstdint>
#include <string>

namespace vc::testing {

// A float32 block of 2 layers, 2 KV heads of 8 dimensions and 16 tokens whose payload bytes
// follow from `seed`, bound to the fingerprint {fingerprint_byte, 0, 0, ...} (copied to
// *fingerprint when given).
std::string RandomBlock(uint32_t seed, uint8_t fingerprint_byte, std::array<uint8_t, 32>* fingerprint = nullptr);

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_BLOCKS_H_
