// The CUDA backend against the reference backend (within the tolerances stated per op) and against
// itself: a row's MatMul and attention outputs must be bitwise the same whatever else is in the
// batch. Skips where there is no CUDA device (or the build has no CUDA backend).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/kernels.h"

namespace vc::kernels {
namespace {

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda_ = CudaBackendIfAvailable();
    if (cuda_ == nullptr) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cuda_->name(), "cuda");
  }

  const Backend& Cuda() const { return *cuda_; }
  const Backend& Ref() const { return ReferenceBackend(); }

  std::vector<float> Random(size_t count, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> out(count);
    for (float& v : out) v = dist(rng_);
    return out;
  }

  std::mt19937 rng_{20240611};

 private:
  const Backend* cuda_ = nullptr;
};

// Expects |got[i] - want[i]| <= tol[i] everywhere; reports the count and the worst offender.
void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err / tol[i];
    if (!(err <= tol[i])) ++bad;  // also catches NaN
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst at " << worst << ": got " << got[worst] << ", want " << want[worst]
                     << ", tolerance " << tol[worst];
}

// Expects the first `count` floats of a and b to have the same bits.
void ExpectBitwiseEqual(const float* a, const float* b, size_t count, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t x, y;
    std::memcpy(&x, a + i, 4);
    std::memcpy(&y, b + i, 4);
    if (x != y) {
      ADD_FAILURE() << what << ": first difference at " << i << ": " << a[i] << " vs " << b[i];
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// MatMul

// A weight matrix in its storage dtype plus its exact float values. The CUDA backend caches weights
// by host pointer (they are immutable memory-mapped data in the model), so test weights are never
// freed: a freed address reused for other values would be served from the stale device copy.
struct TestWeights {
  std::vector<float> values;     // [rows, cols], exactly representable in dtype
  std::vector<float> f32;        // storage when dtype is F32
  std::vector<uint16_t> half16;  // storage when dtype is BF16 or F16
  WeightView view;
};

const TestWeights& MakeWeights(int64_t rows, int64_t cols, DType dtype, std::mt19937& rng) {
  static auto* all = new std::deque<TestWeights>();
  TestWeights& w = all->emplace_back();
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  w.values.resize(static_cast<size_t>(rows * cols));
  if (dtype == DType::kF32) {
    for (float& v : w.values) v = dist(rng);
    w.f32 = w.values;
    w.view = WeightView{w.f32.data(), dtype, rows, cols};
  } else {
    w.half16.resize(w.values.size());
    for (size_t i = 0; i < w.values.size(); ++i) {
      const float v = dist(rng);
      w.half16[i] = dtype == DType::kBF16 ? F32ToBF16(v) : F32ToF16(v);
      w.values[i] = dtype == DType::kBF16 ? BF16ToF32(w.half16[i]) : F16ToF32(w.half16[i]);
    }
    w.view = WeightView{w.half16.data(), dtype, rows, cols};
  }
  return w;
}

struct MatMulShape {
  int64_t n, rows, cols;
  DType dtype;
};

// Tolerance 1e-5 * sum_c |x_c * w_c| per output: the two backends sum the same products in
// different orders, and float summation error is bounded by (terms * eps) times that sum; in
// practice it stays far below.
TEST_F(CudaParityTest, MatMulMatchesReference) {
  const MatMulShape shapes[] = {
      {1, 64, 256, DType::kF32},   {3, 33, 100, DType::kBF16},   {17, 130, 4096, DType::kF16},
      {5, 257, 1536, DType::kBF16}, {9, 48, 36, DType::kF32},     {2, 7, 3, DType::kF16},
      {20, 96, 1002, DType::kF32},  {1, 4096, 4096, DType::kBF16}, {8, 11, 8, DType::kBF16},
  };
  for (const MatMulShape& s : shapes) {
    const std::string what = absl::StrCat("n=", s.n, " rows=", s.rows, " cols=", s.cols, " ", DTypeName(s.dtype));
    const TestWeights& w = MakeWeights(s.rows, s.cols, s.dtype, rng_);
    const std::vector<float> x = Random(static_cast<size_t>(s.n * s.cols));
    std::vector<float> got(static_cast<size_t>(s.n * s.rows), NAN), want(got.size());
    Cuda().MatMul(x.data(), s.n, w.view, got.data());
    Ref().MatMul(x.data(), s.n, w.view, want.data());
    std::vector<float> tol(got.size());
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t o = 0; o < s.rows; ++o) {
        double abs_sum = 0.0;
        for (int64_t c = 0; c < s.cols; ++c) abs_sum += std::fabs(x[r * s.cols + c] * w.values[o * s.cols + c]);
        tol[r * s.rows + o] = static_cast<float>(1e-5 * abs_sum + 1e-30);
      }
    }
    ExpectWithin(got, want, tol, what);
  }
}

TEST_F(CudaParityTest, MatMulRowIsBitwiseIndependentOfBatch) {
  constexpr int64_t kBatch = 17;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t cols : {4096, 1000, 100, 1002}) {  // vector and scalar column paths of each dtype
      const std::string what = absl::StrCat(DTypeName(dtype), " cols=", cols);
      const int64_t rows = 97;  // not a multiple of the outputs a warp owns
      const TestWeights& w = MakeWeights(rows, cols, dtype, rng_);
      const std::vector<float> x = Random(static_cast<size_t>(kBatch * cols));
      std::vector<float> batch(static_cast<size_t>(kBatch * rows));
      Cuda().MatMul(x.data(), kBatch, w.view, batch.data());
      for (int64_t r = 0; r < kBatch; ++r) {
        std::vector<float> alone(static_cast<size_t>(rows));
        Cuda().MatMul(x.data() + r * cols, 1, w.view, alone.data());
        ExpectBitwiseEqual(alone.data(), batch.data() + r * rows, rows, absl::StrCat(what, " row ", r));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// RmsNorm, Rope, SwiGlu

// Tolerance 2e-6 relative + 1e-6 absolute: the sum of squares is reduced in a different order, and
// rsqrt of it carries that relative error into every output.
TEST_F(CudaParityTest, RmsNormMatchesReferenceAndIsBatchInvariant) {
  for (int64_t dim : {5, 64, 100, 4096}) {
    for (int64_t n : {1, 7}) {
      const std::string what = absl::StrCat("n=", n, " dim=", dim);
      const std::vector<float> x = Random(static_cast<size_t>(n * dim), -3.0f, 3.0f);
      const std::vector<float> weight = Random(static_cast<size_t>(dim), 0.5f, 1.5f);
      std::vector<float> got(x.size(), NAN), want(x.size());
      Cuda().RmsNorm(x.data(), n, dim, weight.data(), 1e-5f, got.data());
      Ref().RmsNorm(x.data(), n, dim, weight.data(), 1e-5f, want.data());
      std::vector<float> tol(x.size());
      for (size_t i = 0; i < x.size(); ++i) tol[i] = 2e-6f * std::fabs(want[i]) + 1e-6f;
      ExpectWithin(got, want, tol, what);

      std::vector<float> in_place = x;  // y aliasing x
      Cuda().RmsNorm(in_place.data(), n, dim, weight.data(), 1e-5f, in_place.data());
      ExpectBitwiseEqual(in_place.data(), got.data(), got.size(), what + " in place");
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> alone(static_cast<size_t>(dim));
        Cuda().RmsNorm(x.data() + r * dim, 1, dim, weight.data(), 1e-5f, alone.data());
        ExpectBitwiseEqual(alone.data(), got.data() + r * dim, dim, absl::StrCat(what, " row ", r, " alone"));
      }
    }
  }
}

// Tolerance 1e-6 absolute: both compute a*cos - b*sin and b*cos + a*sin, correctly rounded, on
// values of magnitude <= 2.
TEST_F(CudaParityTest, RopeMatchesReference) {
  struct Shape {
    int64_t n;
    int heads, head_dim;
  };
  for (const Shape& s : {Shape{1, 4, 64}, Shape{5, 8, 128}, Shape{3, 2, 6}, Shape{2, 3, 7}}) {
    const std::string what = absl::StrCat("n=", s.n, " heads=", s.heads, " head_dim=", s.head_dim);
    const int half = s.head_dim / 2;
    const std::vector<float> angle = Random(static_cast<size_t>(s.n * half), -100.0f, 100.0f);
    std::vector<float> cos(angle.size()), sin(angle.size());
    for (size_t i = 0; i < angle.size(); ++i) cos[i] = std::cos(angle[i]), sin[i] = std::sin(angle[i]);
    std::vector<float> got = Random(static_cast<size_t>(s.n * s.heads * s.head_dim));
    std::vector<float> want = got;
    Cuda().Rope(got.data(), s.n, s.heads, s.head_dim, cos.data(), sin.data());
    Ref().Rope(want.data(), s.n, s.heads, s.head_dim, cos.data(), sin.data());
    ExpectWithin(got, want, std::vector<float>(got.size(), 1e-6f), what);
  }
}

// Tolerance 2e-6 relative + 1e-7 absolute: CUDA's expf is within 2 ulp, the host's within 1.
TEST_F(CudaParityTest, SwiGluMatchesReference) {
  for (int64_t count : {1, 255, 4099}) {
    const std::vector<float> gate = Random(static_cast<size_t>(count), -10.0f, 10.0f);
    const std::vector<float> up = Random(static_cast<size_t>(count), -2.0f, 2.0f);
    std::vector<float> got(gate.size(), NAN), want(gate.size());
    Cuda().SwiGlu(gate.data(), up.data(), count, got.data());
    Ref().SwiGlu(gate.data(), up.data(), count, want.data());
    std::vector<float> tol(got.size());
    for (size_t i = 0; i < got.size(); ++i) tol[i] = 2e-6f * std::fabs(want[i]) + 1e-7f;
    ExpectWithin(got, want, tol, absl::StrCat("count=", count));

    std::vector<float> in_place = gate;  // out aliasing gate
    Cuda().SwiGlu(in_place.data(), up.data(), count, in_place.data());
    ExpectBitwiseEqual(in_place.data(), got.data(), got.size(), absl::StrCat("count=", count, " in place"));
  }
}

// ---------------------------------------------------------------------------------------------------
// PagedAttention

struct AttentionShape {
  int num_heads, num_kv_heads, head_dim, block_size;
};

// A KV pool of `blocks` physical blocks with random contents, and sequences laid out in it on
// randomly chosen, scattered blocks.
class TestPool {
 public:
  TestPool(const AttentionShape& s, int64_t blocks, std::mt19937& rng) : s_(s), free_(static_cast<size_t>(blocks)) {
    const size_t floats = static_cast<size_t>(blocks * BlockFloats());
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    k_.resize(floats);
    v_.resize(floats);
    for (float& x : k_) x = dist(rng);
    for (float& x : v_) x = dist(rng);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), rng);
  }

  int64_t BlockFloats() const { return static_cast<int64_t>(s_.block_size) * s_.num_kv_heads * s_.head_dim; }
  PagedKvLayer Layer() const { return {k_.data(), v_.data(), BlockFloats(), s_.block_size, s_.num_kv_heads, s_.head_dim}; }

  // A block table for `len` positions on unused blocks.
  std::vector<int32_t> NewSequence(int32_t len) {
    std::vector<int32_t> table;
    for (int32_t j = 0; j < len; j += s_.block_size) {
      table.push_back(free_.back());
      free_.pop_back();
    }
    if (table.empty()) table.push_back(0);  // never read
    return table;
  }

  // Copies the first `len` positions of a sequence from `other` (same shape) onto fresh blocks here.
  std::vector<int32_t> CopySequence(const TestPool& other, const std::vector<int32_t>& table, int32_t len) {
    std::vector<int32_t> mine = NewSequence(len);
    for (size_t b = 0; b * s_.block_size < static_cast<size_t>(len); ++b) {
      std::copy_n(other.k_.begin() + table[b] * BlockFloats(), BlockFloats(), k_.begin() + mine[b] * BlockFloats());
      std::copy_n(other.v_.begin() + table[b] * BlockFloats(), BlockFloats(), v_.begin() + mine[b] * BlockFloats());
    }
    return mine;
  }

 private:
  AttentionShape s_;
  std::vector<float> k_, v_;
  std::vector<int32_t> free_;
};

const AttentionShape kAttentionShapes[] = {
    {8, 2, 64, 16},    // grouped query heads
    {4, 4, 128, 16},   // one query head per KV head
    {16, 2, 128, 32},  // group of 8
    {6, 3, 80, 7},     // head_dim not a multiple of 32, odd block size
    {16, 1, 256, 16},  // the largest group and head_dim
};
const int32_t kKvLens[] = {1, 2, 17, 255, 256, 257, 513, 1000, 1537, 0};

// Physical blocks enough for all of kKvLens, with room to spare so that placement is scattered.
int64_t PoolBlocks(const AttentionShape& s) {
  int64_t blocks = 0;
  for (int32_t len : kKvLens) blocks += (len + s.block_size - 1) / s.block_size;
  return 2 * blocks + 8;
}

std::string ShapeName(const AttentionShape& s) {
  return absl::StrCat("heads=", s.num_heads, " kv_heads=", s.num_kv_heads, " head_dim=", s.head_dim,
                      " block=", s.block_size);
}

// Tolerance 1e-5 absolute: outputs are convex combinations of V values in [-1, 1]; the backends
// differ only in summation order and in expf (2 ulp vs 1).
TEST_F(CudaParityTest, PagedAttentionMatchesReference) {
  for (const AttentionShape& s : kAttentionShapes) {
    TestPool pool(s, PoolBlocks(s), rng_);
    const int64_t n = std::size(kKvLens);
    std::vector<std::vector<int32_t>> tables;
    std::vector<AttentionRow> rows;
    for (int32_t len : kKvLens) tables.push_back(pool.NewSequence(len));
    for (int64_t r = 0; r < n; ++r) rows.push_back({tables[r].data(), kKvLens[r]});
    const std::vector<float> q = Random(static_cast<size_t>(n * s.num_heads * s.head_dim));
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    std::vector<float> got(q.size(), NAN), want(q.size());
    Cuda().PagedAttention(q.data(), n, s.num_heads, rows.data(), pool.Layer(), scale, got.data());
    Ref().PagedAttention(q.data(), n, s.num_heads, rows.data(), pool.Layer(), scale, want.data());
    ExpectWithin(got, want, std::vector<float>(got.size(), 1e-5f), ShapeName(s));
    const int64_t row_floats = s.num_heads * s.head_dim;
    for (int64_t i = (n - 1) * row_floats; i < n * row_floats; ++i) EXPECT_EQ(got[i], 0.0f) << "kv_len 0";
  }
}

TEST_F(CudaParityTest, PagedAttentionRowIsBitwiseIndependentOfBatchAndPlacement) {
  for (const AttentionShape& s : kAttentionShapes) {
    TestPool pool(s, PoolBlocks(s), rng_);
    const int64_t n = std::size(kKvLens);
    std::vector<std::vector<int32_t>> tables;
    std::vector<AttentionRow> rows;
    for (int32_t len : kKvLens) tables.push_back(pool.NewSequence(len));
    for (int64_t r = 0; r < n; ++r) rows.push_back({tables[r].data(), kKvLens[r]});
    const int64_t row_floats = s.num_heads * s.head_dim;
    const std::vector<float> q = Random(static_cast<size_t>(n * row_floats));
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    std::vector<float> batch(q.size());
    Cuda().PagedAttention(q.data(), n, s.num_heads, rows.data(), pool.Layer(), scale, batch.data());

    // Each row alone.
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> alone(static_cast<size_t>(row_floats));
      Cuda().PagedAttention(q.data() + r * row_floats, 1, s.num_heads, &rows[r], pool.Layer(), scale, alone.data());
      ExpectBitwiseEqual(alone.data(), batch.data() + r * row_floats, row_floats,
                         absl::StrCat(ShapeName(s), " kv_len ", kKvLens[r], " alone"));
    }

    // The same sequences on other physical blocks of another pool, in reverse batch order.
    TestPool moved(s, PoolBlocks(s) + 50, rng_);
    std::vector<std::vector<int32_t>> moved_tables;
    std::vector<AttentionRow> moved_rows;
    std::vector<float> moved_q;
    for (int64_t r = n - 1; r >= 0; --r) {
      moved_tables.push_back(moved.CopySequence(pool, tables[r], kKvLens[r]));
      moved_q.insert(moved_q.end(), q.begin() + r * row_floats, q.begin() + (r + 1) * row_floats);
    }
    for (int64_t i = 0; i < n; ++i) moved_rows.push_back({moved_tables[i].data(), kKvLens[n - 1 - i]});
    std::vector<float> moved_out(q.size());
    Cuda().PagedAttention(moved_q.data(), n, s.num_heads, moved_rows.data(), moved.Layer(), scale, moved_out.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = n - 1 - i;
      ExpectBitwiseEqual(moved_out.data() + i * row_floats, batch.data() + r * row_floats, row_floats,
                         absl::StrCat(ShapeName(s), " kv_len ", kKvLens[r], " moved"));
    }
  }
}

// The shape of a speculative verify pass: k + 1 consecutive positions of one sequence in one call
// must equal, bitwise, k + 1 one-token decode steps, including across a chunk boundary.
TEST_F(CudaParityTest, PagedAttentionVerifyPassEqualsDecodeSteps) {
  const AttentionShape s{8, 2, 128, 16};
  TestPool pool(s, 200, rng_);
  const std::vector<int32_t> table = pool.NewSequence(1100);
  const int64_t row_floats = s.num_heads * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (int32_t first : {1, 252, 1020, 1095}) {
    constexpr int64_t kRows = 5;
    std::vector<AttentionRow> rows;
    for (int64_t r = 0; r < kRows; ++r) rows.push_back({table.data(), static_cast<int32_t>(first + r)});
    const std::vector<float> q = Random(static_cast<size_t>(kRows * row_floats));
    std::vector<float> verify(q.size());
    Cuda().PagedAttention(q.data(), kRows, s.num_heads, rows.data(), pool.Layer(), scale, verify.data());
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<float> step(static_cast<size_t>(row_floats));
      Cuda().PagedAttention(q.data() + r * row_floats, 1, s.num_heads, &rows[r], pool.Layer(), scale, step.data());
      ExpectBitwiseEqual(step.data(), verify.data() + r * row_floats, row_floats,
                         absl::StrCat("kv_len ", first + r));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// CompressedAttention

// The storage behind one CompressedKvHead: `tokens` quantized tokens, then `dense` rows of a shared
// dense pool.
struct TestCompressedHead {
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scale, k_min, v_scale, v_min;
  std::vector<int32_t> dense_rows;
  CompressedKvHead view;
};

// Codes, scales and mins chosen so dequantized values lie in [-1, 1].
void FillCompressedHead(int d, int bits, int value_group, int32_t tokens, int32_t dense, const float* pool_k,
                        const float* pool_v, int32_t pool_rows, std::mt19937& rng, TestCompressedHead* h) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f), lo(-1.0f, -0.5f);
  std::uniform_int_distribution<int32_t> row(0, pool_rows - 1);
  constexpr int kKeyGroup = 32;
  const float step = 1.0f / static_cast<float>((1 << bits) - 1);
  const size_t code_bytes = static_cast<size_t>(tokens) * d * bits / 8;
  h->k_codes.resize(code_bytes);
  h->v_codes.resize(code_bytes);
  for (uint8_t& c : h->k_codes) c = static_cast<uint8_t>(byte(rng));
  for (uint8_t& c : h->v_codes) c = static_cast<uint8_t>(byte(rng));
  h->k_scale.resize(static_cast<size_t>(tokens / kKeyGroup) * d);
  h->k_min.resize(h->k_scale.size());
  for (size_t i = 0; i < h->k_scale.size(); ++i) h->k_scale[i] = step * unit(rng), h->k_min[i] = lo(rng);
  h->v_scale.resize(static_cast<size_t>(tokens) * (d / value_group));
  h->v_min.resize(h->v_scale.size());
  for (size_t i = 0; i < h->v_scale.size(); ++i) h->v_scale[i] = step * unit(rng), h->v_min[i] = lo(rng);
  h->dense_rows.resize(static_cast<size_t>(dense));
  for (int32_t& r : h->dense_rows) r = row(rng);
  h->view.quant = QuantizedKvHead{bits,          kKeyGroup,          value_group,        tokens,
                                  h->k_codes.data(), h->k_scale.data(), h->k_min.data(), h->v_codes.data(),
                                  h->v_scale.data(), h->v_min.data()};
  h->view.dense = DenseKvHead{pool_k, pool_v, d, h->dense_rows.data(), dense};
}

// Tolerance 2e-5 absolute: as for PagedAttention, plus dequantization rounded once (fused) here and
// twice in the reference.
TEST_F(CudaParityTest, CompressedAttentionMatchesReference) {
  struct Shape {
    int num_heads, num_kv_heads, head_dim, value_group;
  };
  const int32_t kTokens[] = {0, 32, 256, 1024, 0};
  const int32_t kDense[] = {0, 1, 100, 300, 17};
  for (const Shape& s : {Shape{8, 2, 64, 32}, Shape{4, 4, 128, 32}, Shape{6, 3, 80, 16}}) {
    for (int bits : {2, 4, 8}) {
      const std::string what = absl::StrCat("heads=", s.num_heads, " kv_heads=", s.num_kv_heads,
                                            " head_dim=", s.head_dim, " bits=", bits);
      constexpr int32_t kPoolRows = 500;
      const std::vector<float> pool_k = Random(static_cast<size_t>(kPoolRows) * s.head_dim);
      const std::vector<float> pool_v = Random(pool_k.size());
      constexpr int64_t n = 3;
      std::deque<TestCompressedHead> heads;
      std::vector<CompressedKvHead> views;
      for (int64_t i = 0; i < n * s.num_kv_heads; ++i) {
        const size_t pick = static_cast<size_t>(i) % std::size(kTokens);
        const int32_t dense = i == 0 ? 0 : kDense[(pick + static_cast<size_t>(i / 5)) % std::size(kDense)];
        FillCompressedHead(s.head_dim, bits, s.value_group, kTokens[pick], dense, pool_k.data(), pool_v.data(),
                           kPoolRows, rng_, &heads.emplace_back());
        views.push_back(heads.back().view);
      }
      const std::vector<float> q = Random(static_cast<size_t>(n * s.num_heads * s.head_dim));
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      std::vector<float> got(q.size(), NAN), want(q.size());
      Cuda().CompressedAttention(q.data(), n, s.num_heads, s.num_kv_heads, s.head_dim, views.data(), scale,
                                 got.data());
      Ref().CompressedAttention(q.data(), n, s.num_heads, s.num_kv_heads, s.head_dim, views.data(), scale,
                                want.data());
      ExpectWithin(got, want, std::vector<float>(got.size(), 2e-5f), what);
      const int group = s.num_heads / s.num_kv_heads;
      for (int h = 0; h < group * s.head_dim; ++h) EXPECT_EQ(got[h], 0.0f) << what << ": empty head";
    }
  }
}

// kernels.h: a dense-only list holding positions 0..p in order gives bitwise the PagedAttention
// result.
TEST_F(CudaParityTest, DenseCompressedListEqualsPagedAttentionBitwise) {
  const AttentionShape s{8, 2, 128, 16};
  const int32_t kLens[] = {1, 300, 1000, 256};
  TestPool pool(s, 200, rng_);
  const PagedKvLayer layer = pool.Layer();
  const int64_t n = std::size(kLens);
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionRow> rows;
  std::vector<std::vector<int32_t>> dense_rows;
  std::vector<CompressedKvHead> views;
  for (int32_t len : kLens) tables.push_back(pool.NewSequence(len));
  for (int64_t r = 0; r < n; ++r) {
    rows.push_back({tables[r].data(), kLens[r]});
    for (int g = 0; g < s.num_kv_heads; ++g) {
      // Position j's K/V row of head g, counted in rows of num_kv_heads * head_dim floats.
      std::vector<int32_t>& list = dense_rows.emplace_back();
      for (int32_t j = 0; j < kLens[r]; ++j) list.push_back(tables[r][j / s.block_size] * s.block_size + j % s.block_size);
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int g = 0; g < s.num_kv_heads; ++g) {
      CompressedKvHead& v = views.emplace_back();
      v.dense = DenseKvHead{static_cast<const float*>(layer.k) + g * s.head_dim,
                            static_cast<const float*>(layer.v) + g * s.head_dim,
                            static_cast<int64_t>(s.num_kv_heads) * s.head_dim,
                            dense_rows[r * s.num_kv_heads + g].data(), kLens[r]};
    }
  }
  const int64_t row_floats = s.num_heads * s.head_dim;
  const std::vector<float> q = Random(static_cast<size_t>(n * row_floats));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  std::vector<float> paged(q.size()), compressed(q.size());
  Cuda().PagedAttention(q.data(), n, s.num_heads, rows.data(), layer, scale, paged.data());
  Cuda().CompressedAttention(q.data(), n, s.num_heads, s.num_kv_heads, s.head_dim, views.data(), scale,
                             compressed.data());
  for (int64_t r = 0; r < n; ++r) {
    ExpectBitwiseEqual(compressed.data() + r * row_floats, paged.data() + r * row_floats, row_floats,
                       absl::StrCat("kv_len ", kLens[r]));
  }
}

TEST_F(CudaParityTest, EmptyInputsDoNothing) {
  float sentinel = 42.0f;
  const uint16_t w = 0;
  Cuda().MatMul(nullptr, 0, WeightView{&w, DType::kBF16, 1, 1}, &sentinel);
  Cuda().RmsNorm(nullptr, 0, 8, nullptr, 1e-5f, &sentinel);
  Cuda().Rope(&sentinel, 0, 4, 8, nullptr, nullptr);
  Cuda().SwiGlu(nullptr, nullptr, 0, &sentinel);
  Cuda().PagedAttention(nullptr, 0, 4, nullptr, PagedKvLayer{nullptr, nullptr, 0, 16, 1, 8}, 1.0f, &sentinel);
  Cuda().CompressedAttention(nullptr, 0, 4, 1, 8, nullptr, 1.0f, &sentinel);
  EXPECT_EQ(sentinel, 42.0f);
}

}  // namespace
}  // namespace vc::kernels
