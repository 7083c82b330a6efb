// Which KV dtype an exactness suite runs with: ctest runs such a suite once per KV dtype.
#ifndef VC_TESTS_TESTING_KV_DTYPE_H_
#define VC_TESTS_TESTING_KV_DTYPE_H_

#include <cstdlib>

#include "gtest/gtest.h"
#include "worker/runtime/model.h"

namespace vc::testing {

// Model options with the KV dtype the environment variable VC_TEST_KV_DTYPE names (auto, bf16,
// f16, f32; unset: auto, the checkpoint's). A bad value fails the calling test.
inline ModelOptions TestModelOptions() {
  ModelOptions o;
  const char* env = std::getenv("VC_TEST_KV_DTYPE");
  if (env == nullptr) return o;
  auto dtype = ParseKvDType(env);
  if (!dtype.ok()) {
    ADD_FAILURE() << "VC_TEST_KV_DTYPE: " << dtype.status();
    return o;
  }
  o.kv_dtype = *dtype;
  return o;
}

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_KV_DTYPE_H_
