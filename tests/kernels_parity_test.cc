// Fast CPU kernels against the reference (within stated tolerances) and against themselves under
// different row counts, batch compositions and thread counts (bitwise).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/thread_pool.h"

namespace vc::kernels {
namespace {

// Tolerances of the fast kernels against the reference, relative to the scale of each output
// (sum of |x_i * w_i| for products; max |v| for attention). Float32 with a different summation
// order differs by a few ulps of that scale.
constexpr double kMatMulTol = 1e-5;
// bf16 products (the avx512bf16 backend, bf16 weights) round each input to bf16 first. A bf16 keeps
// 8 significant bits, so rounding to nearest moves x_i by up to 2^-8 of |x_i|: up to 2^-8 of the
// scale in all.
constexpr double kBf16ProductsTol = 1.0 / 256 + 1e-5;

// Whether the backend takes bf16 products for bf16 weights.
bool TakesBf16Products(const Backend& b) { return b.numerics() == "avx512bf16"; }
constexpr double kElementwiseTol = 2e-6;
constexpr double kAttentionTol = 1e-5;
// Quantized keys: the fast kernel folds the scales into the query (q.k = q.min + (q*scale).code)
// instead of dequantizing first, so score errors scale with sum |q_c * k_c| over channels (about
// 1e3 here with random 8-bit codes): relative output error up to ~2e-4.
constexpr double kCompressedTol = 5e-4;
// 4-bit keys and values in groups of 32 take integer products: the kernel also rounds q * scale to
// integers in [-127, 127] per key group and head, which adds up to 1/254 of max |q * scale| per
// channel to each score, and the attention weights times the value scales to 8 bits per 32
// positions (a draft-only kernel): output errors of a few 1e-3 here.
constexpr double kCompressedInt4Tol = 1e-2;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightView view;
};

Weights MakeWeights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  Weights w;
  w.f32 = Random(static_cast<size_t>(rows * cols), seed, 0.1f);
  if (t == DType::kF32) {
    w.view = {w.f32.data(), t, rows, cols};
  } else {
    for (float& x : w.f32) {
      const uint16_t h = t == DType::kBF16 ? F32ToBF16(x) : F32ToF16(x);
      w.half.push_back(h);
      x = t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
    }
    w.view = {w.half.data(), t, rows, cols};
  }
  return w;
}

// A backend's name as a test name, which takes letters, digits and '_'.
std::string BackendParamName(const ::testing::TestParamInfo<const char*>& info) {
  std::string name(info.param);
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

// Every test runs for each fast backend ("avx2", "avx512vl", "avx512vl-novbmi", "avx512bf16"),
// skipped where the CPU lacks it.
class FastBackendTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    fast_ = BackendByName(GetParam());
    if (fast_ == nullptr) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " backend";
  }
  void TearDown() override { SetKernelThreadCount(2); }
  const Backend* fast_ = nullptr;
};

TEST_P(FastBackendTest, MatMulMatchesReferenceAndIsRowCountInvariant) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const double tol = t == DType::kBF16 && TakesBf16Products(*fast_) ? kBf16ProductsTol : kMatMulTol;
    for (int64_t cols : {8, 40, 256, 688, 896}) {
      const int64_t rows = 300, n = 17;
      Weights w = MakeWeights(t, rows, cols, 7);
      const auto x = Random(static_cast<size_t>(n * cols), 9);
      std::vector<float> ref(n * rows), fast(n * rows);
      ReferenceBackend().MatMul(x.data(), n, w.view, ref.data());
      fast_->MatMul(x.data(), n, w.view, fast.data());
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < rows; ++o) {
          double scale = 0;
          for (int64_t c = 0; c < cols; ++c) scale += std::fabs(x[r * cols + c] * w.f32[o * cols + c]);
          EXPECT_LE(std::fabs(ref[r * rows + o] - fast[r * rows + o]), tol * scale + 1e-30);
        }
      }
      // Row r computed alone, or with any number of other rows (below and above the row count from
      // which the AVX-512 builds block the product), on one thread or two, is bitwise the same.
      for (int threads : {1, 2}) {
        SetKernelThreadCount(threads);
        for (int64_t k = 1; k <= n; ++k) {
          std::vector<float> part(k * rows);
          fast_->MatMul(x.data(), k, w.view, part.data());
          ASSERT_EQ(0, std::memcmp(part.data(), fast.data(), part.size() * 4)) << "rows " << k << ", threads " << threads;
        }
      }
    }
  }
}

// Several products of one input in one job give each product bitwise what MatMul gives it: for
// shapes whose outputs split across the job's tasks anywhere (a decode step's q, k, v; gate, up),
// any row count, one thread or two, mixed weight types; a width MatMuls does not share falls back.
TEST_P(FastBackendTest, MatMulsEqualsMatMulBitwise) {
  for (int threads : {1, 2}) {
    SetKernelThreadCount(threads);
    for (int64_t cols : {40, 256}) {
      Weights a = MakeWeights(DType::kBF16, 256, cols, 11), b = MakeWeights(DType::kBF16, 64, cols, 12),
              c = MakeWeights(DType::kF32, 72, cols, 13), d = MakeWeights(DType::kF16, 7, cols, 14);
      const WeightView ws[] = {a.view, b.view, c.view, d.view};
      for (int count : {1, 2, 3, 4}) {
        for (int64_t n : {1, 3, 5}) {
          const auto x = Random(static_cast<size_t>(n * cols), 15);
          std::vector<std::vector<float>> one(count), many(count);
          std::vector<float*> ys(count);
          for (int i = 0; i < count; ++i) {
            one[i].resize(n * ws[i].rows);
            many[i].assign(n * ws[i].rows, -1.0f);
            fast_->MatMul(x.data(), n, ws[i], one[i].data());
            ys[i] = many[i].data();
          }
          fast_->MatMuls(x.data(), n, ws, ys.data(), count);
          for (int i = 0; i < count; ++i) {
            ASSERT_EQ(0, std::memcmp(one[i].data(), many[i].data(), one[i].size() * 4))
                << "weight " << i << " of " << count << ", rows " << n << ", threads " << threads;
          }
        }
      }
    }
  }
  // Mismatched widths: each product on its own.
  Weights a = MakeWeights(DType::kF32, 16, 32, 21), b = MakeWeights(DType::kF32, 16, 48, 22);
  const auto x = Random(48, 23);
  const WeightView ws[] = {a.view, b.view};
  std::vector<float> ya(16), yb(16), ra(16), rb(16);
  float* ys[] = {ya.data(), yb.data()};
  fast_->MatMuls(x.data(), 1, ws, ys, 2);
  fast_->MatMul(x.data(), 1, a.view, ra.data());
  fast_->MatMul(x.data(), 1, b.view, rb.data());
  EXPECT_EQ(0, std::memcmp(ya.data(), ra.data(), 64));
  EXPECT_EQ(0, std::memcmp(yb.data(), rb.data(), 64));
}

TEST_P(FastBackendTest, ElementwiseOpsMatchReference) {
  const int64_t n = 5, dim = 256;
  const auto x = Random(n * dim, 1), w = Random(dim, 2);
  std::vector<float> a(n * dim), b(n * dim);
  ReferenceBackend().RmsNorm(x.data(), n, dim, w.data(), 1e-5f, a.data());
  fast_->RmsNorm(x.data(), n, dim, w.data(), 1e-5f, b.data());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], kElementwiseTol * 4 * (1 + std::fabs(a[i])));

  const auto g = Random(1001, 3, 4.0f), u = Random(1001, 4);
  std::vector<float> s1(1001), s2(1001);
  ReferenceBackend().SwiGlu(g.data(), u.data(), 1001, s1.data());
  fast_->SwiGlu(g.data(), u.data(), 1001, s2.data());
  for (size_t i = 0; i < s1.size(); ++i) EXPECT_NEAR(s1[i], s2[i], kElementwiseTol * (1 + std::fabs(s1[i])));

  auto q1 = Random(n * 8 * 32, 5), q2 = q1;
  const auto c = Random(n * 16, 6), s = Random(n * 16, 7);
  ReferenceBackend().Rope(q1.data(), n, 8, 32, c.data(), s.data());
  fast_->Rope(q2.data(), n, 8, 32, c.data(), s.data());
  for (size_t i = 0; i < q1.size(); ++i) EXPECT_NEAR(q1[i], q2[i], kElementwiseTol * (1 + std::fabs(q1[i])));
}

// A paged pool with blocks handed out in a shuffled order: row r attends to lens[r] positions
// through tables[r].
struct Pool {
  std::vector<float> k, v;
  std::vector<int32_t> lens;
  std::vector<std::vector<int32_t>> tables;
  PagedKvLayer layer;

  std::vector<AttentionRow> Rows() const {
    std::vector<AttentionRow> rows;
    for (size_t r = 0; r < lens.size(); ++r) rows.push_back({tables[r].data(), lens[r]});
    return rows;
  }
};

Pool MakePool(int block, int kv_heads, int d, const std::vector<int32_t>& lens, uint32_t seed) {
  Pool p;
  p.lens = lens;
  int64_t blocks = 0;
  for (int32_t l : lens) blocks += (l + block - 1) / block;
  std::vector<int32_t> order(blocks);
  for (int64_t i = 0; i < blocks; ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  const int64_t stride = int64_t{block} * kv_heads * d;
  p.k = Random(static_cast<size_t>(blocks * stride), seed + 1);
  p.v = Random(static_cast<size_t>(blocks * stride), seed + 2);
  size_t next = 0;
  for (int32_t l : lens) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < (l + block - 1) / block; ++i) t.push_back(order[next++]);
    p.tables.push_back(t);
  }
  p.layer = {p.k.data(), p.v.data(), stride, block, kv_heads, d};
  return p;
}

TEST_P(FastBackendTest, AttentionMatchesReferenceAndIsBatchAndThreadInvariant) {
  // Groups of 4, 3 and 1 query heads per KV head take the kernel's four-, two- and one-head paths.
  struct Shape {
    int heads, kv_heads, d;
  };
  for (const Shape& s : {Shape{8, 2, 32}, Shape{6, 2, 32}, Shape{2, 2, 32}, Shape{8, 2, 64}}) {
    const int heads = s.heads, kv_heads = s.kv_heads, d = s.d;
    const std::vector<int32_t> lens = {1, 7, 255, 256, 257, 1000, 3000};
    Pool p = MakePool(16, kv_heads, d, lens, 11);
    const int64_t n = static_cast<int64_t>(lens.size());
    const auto q = Random(n * heads * d, 12);
    const std::vector<AttentionRow> rows = p.Rows();
    std::vector<float> ref(n * heads * d), all(n * heads * d);
    ReferenceBackend().PagedAttention(q.data(), n, heads, rows.data(), p.layer, 0.17f, ref.data());
    fast_->PagedAttention(q.data(), n, heads, rows.data(), p.layer, 0.17f, all.data());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ref[i], all[i], kAttentionTol * 4) << i << " heads " << heads;

    for (int threads : {1, 2, 3}) {
      SetKernelThreadCount(threads);
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> one(heads * d);
        fast_->PagedAttention(q.data() + r * heads * d, 1, heads, &rows[r], p.layer, 0.17f, one.data());
        ASSERT_EQ(0, std::memcmp(one.data(), all.data() + r * heads * d, one.size() * 4))
            << "row " << r << " threads " << threads << " heads " << heads << " d " << d;
      }
    }
    SetKernelThreadCount(2);

    // Verify passes: rows of one sequence (one block table) at consecutive lengths across a
    // 256-position chunk boundary, interleaved with another sequence's rows. The kernel groups
    // rows by table, runs each group chunk by chunk, all rows of a chunk in one task; every
    // row still equals its one-row call.
    std::vector<AttentionRow> verify;
    for (int j = 0; j < 5; ++j) {
      verify.push_back({p.tables[6].data(), 2814 + j});
      if (j < 3) verify.push_back({p.tables[5].data(), 767 + j});
    }
    const int64_t m = static_cast<int64_t>(verify.size());
    const auto qv = Random(m * heads * d, 13);
    std::vector<float> vref(m * heads * d), vall(m * heads * d);
    ReferenceBackend().PagedAttention(qv.data(), m, heads, verify.data(), p.layer, 0.17f, vref.data());
    fast_->PagedAttention(qv.data(), m, heads, verify.data(), p.layer, 0.17f, vall.data());
    for (size_t i = 0; i < vref.size(); ++i) ASSERT_NEAR(vref[i], vall[i], kAttentionTol * 4) << i;
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> one(heads * d);
      fast_->PagedAttention(qv.data() + r * heads * d, 1, heads, &verify[r], p.layer, 0.17f, one.data());
      ASSERT_EQ(0, std::memcmp(one.data(), vall.data() + r * heads * d, one.size() * 4))
          << "verify row " << r << " heads " << heads << " d " << d;
    }
  }
}

// K/V kept in bf16 or f16 (KvLayout::dtype): each kernel widens the elements to float32 before any
// arithmetic, so a pool of 16-bit values gives bitwise what a float32 pool of the same values
// gives, on the reference and on each fast backend, in one-row calls, verify passes and batches.
TEST_P(FastBackendTest, SixteenBitKvEqualsItsFloatCopyBitwise) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const int heads = 8, kv_heads = 2, d = 64;
    const std::vector<int32_t> lens = {1, 9, 256, 300, 2100};
    Pool p = MakePool(16, kv_heads, d, lens, 21);
    // The 16-bit pool, and the float32 pool of its values.
    std::vector<uint16_t> k16(p.k.size()), v16(p.v.size());
    for (size_t i = 0; i < p.k.size(); ++i) {
      k16[i] = dtype == DType::kBF16 ? F32ToBF16(p.k[i]) : F32ToF16(p.k[i]);
      v16[i] = dtype == DType::kBF16 ? F32ToBF16(p.v[i]) : F32ToF16(p.v[i]);
      p.k[i] = KvElement(k16.data(), dtype, static_cast<int64_t>(i));
      p.v[i] = KvElement(v16.data(), dtype, static_cast<int64_t>(i));
    }
    PagedKvLayer half = p.layer;
    half.k = k16.data();
    half.v = v16.data();
    half.dtype = dtype;
    // Rows of all five sequences, and a verify pass of four rows over the longest one.
    std::vector<AttentionRow> rows = p.Rows();
    for (int j = 0; j < 4; ++j) rows.push_back({p.tables[4].data(), 2096 + j});
    const int64_t n = static_cast<int64_t>(rows.size());
    const auto q = Random(n * heads * d, 22);
    for (const Backend* b : {&ReferenceBackend(), fast_}) {
      std::vector<float> want(n * heads * d), got(n * heads * d);
      b->PagedAttention(q.data(), n, heads, rows.data(), p.layer, 0.125f, want.data());
      b->PagedAttention(q.data(), n, heads, rows.data(), half, 0.125f, got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << b->name() << " " << DTypeName(dtype);
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> one(heads * d);
        b->PagedAttention(q.data() + r * heads * d, 1, heads, &rows[r], half, 0.125f, one.data());
        ASSERT_EQ(0, std::memcmp(one.data(), got.data() + r * heads * d, one.size() * 4))
            << b->name() << " " << DTypeName(dtype) << " row " << r;
      }
    }
  }
}

// Key groups shorter than a vector (here 4 tokens, 12 quantized, nothing dense) are valid input;
// the fast backend hands them to the reference rather than scoring 8 tokens per store.
TEST_P(FastBackendTest, ShortKeyGroupsMatchTheReference) {
  const int heads = 4, kv_heads = 1, d = 32, bits = 2, group = 4, qtokens = 12;
  std::mt19937 rng(9);
  std::vector<uint8_t> kc(qtokens * d * bits / 8), vc(kc.size());
  for (auto& b : kc) b = static_cast<uint8_t>(rng());
  for (auto& b : vc) b = static_cast<uint8_t>(rng());
  const auto ks = Random(qtokens / group * d, 1, 0.05f), km = Random(qtokens / group * d, 2);
  const auto vs = Random(qtokens * (d / 32), 3, 0.05f), vm = Random(qtokens * (d / 32), 4);
  CompressedKvHead kv;
  kv.quant = {bits, group, 32, qtokens, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()};
  const auto q = Random(heads * d, 8);
  std::vector<float> ref(heads * d), fast(heads * d);
  ReferenceBackend().CompressedAttention(q.data(), 1, heads, kv_heads, d, &kv, 0.15f, ref.data());
  fast_->CompressedAttention(q.data(), 1, heads, kv_heads, d, &kv, 0.15f, fast.data());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ref[i], fast[i], kCompressedTol * (1 + std::fabs(ref[i]))) << i;
}

TEST_P(FastBackendTest, CompressedAttentionMatchesReference) {
  // Random KIVI codes and scales plus float32 rows, per (row, KV head), against the reference.
  const int heads = 8, kv_heads = 2;
  std::mt19937 rng(5);
  for (int d : {32, 64}) {
    for (int bits : {2, 4, 8}) {
      for (int qtokens : {0, 32, 288}) {
        const int dense = 45, group = 32, vgroup = std::min(32, d), n = 3;
        const int64_t row_bytes = int64_t{d} * bits / 8;
        std::vector<uint8_t> kc(qtokens * row_bytes), vc(qtokens * row_bytes);
        for (auto& b : kc) b = static_cast<uint8_t>(rng());
        for (auto& b : vc) b = static_cast<uint8_t>(rng());
        const auto ks = Random(qtokens / group * d, 1, 0.05f), km = Random(qtokens / group * d, 2);
        const auto vs = Random(qtokens * (d / vgroup), 3, 0.05f), vm = Random(qtokens * (d / vgroup), 4);
        const auto dk = Random(dense * d, 6), dv = Random(dense * d, 7);
        std::vector<int32_t> rows(dense);
        for (int i = 0; i < dense; ++i) rows[i] = (i * 7) % dense;
        std::vector<CompressedKvHead> kv(n * kv_heads);
        for (int i = 0; i < n * kv_heads; ++i) {
          QuantizedKvHead& q = kv[i].quant;
          q = {bits, group, vgroup, qtokens, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()};
          kv[i].dense = {dk.data(), dv.data(), d, rows.data(), dense - 10 * (i % 3)};  // rows differ in length
        }
        const auto q = Random(n * heads * d, 8);
        std::vector<float> ref(n * heads * d), fast(n * heads * d);
        ReferenceBackend().CompressedAttention(q.data(), n, heads, kv_heads, d, kv.data(), 0.15f, ref.data());
        fast_->CompressedAttention(q.data(), n, heads, kv_heads, d, kv.data(), 0.15f, fast.data());
        for (size_t i = 0; i < ref.size(); ++i) {
          const double tol = bits == 4 && qtokens > 0 ? kCompressedInt4Tol : kCompressedTol;
          ASSERT_NEAR(ref[i], fast[i], tol * (1 + std::fabs(ref[i])))
              << "d " << d << " bits " << bits << " quantized " << qtokens << " at " << i;
        }
      }
    }
  }
}

// A view through a group table (query-aware selection: some of the stored key groups, in the
// table's order) computes bitwise what a view of those groups copied out in that order computes.
// Key groups of 32 take the 4-bit kernels' own key path; groups of 8 the general one, and value
// blocks of 32 positions that span groups stored apart.
void ExpectGroupTableReadsItsGroups(const Backend& b) {
  const int heads = 8, kv_heads = 2, stored_groups = 10, n = 2, dense = 45;
  const std::vector<int32_t> table = {5, 1, 8, 3};
  std::mt19937 rng(17);
  for (int group : {8, 32}) {
    for (int d : {32, 64}) {
      for (int bits : {2, 4, 8}) {
        SCOPED_TRACE(::testing::Message() << b.name() << " group " << group << " d " << d << " bits " << bits);
        const int vgroup = std::min(32, d), stored = stored_groups * group;
        const int64_t run = int64_t{group} * bits / 8, row_bytes = int64_t{d} * bits / 8, vs_row = d / vgroup;
        std::vector<uint8_t> kc(stored * row_bytes), vc(stored * row_bytes);
        for (auto& x : kc) x = static_cast<uint8_t>(rng());
        for (auto& x : vc) x = static_cast<uint8_t>(rng());
        const auto ks = Random(stored_groups * d, 1, 0.05f), km = Random(stored_groups * d, 2);
        const auto vs = Random(stored * vs_row, 3, 0.05f), vm = Random(stored * vs_row, 4);
        std::vector<uint8_t> ckc, cvc;
        std::vector<float> cks, ckm, cvs, cvm;
        for (const int32_t g : table) {
          ckc.insert(ckc.end(), kc.begin() + g * d * run, kc.begin() + (g + 1) * d * run);
          cks.insert(cks.end(), ks.begin() + g * d, ks.begin() + (g + 1) * d);
          ckm.insert(ckm.end(), km.begin() + g * d, km.begin() + (g + 1) * d);
          cvc.insert(cvc.end(), vc.begin() + g * group * row_bytes, vc.begin() + (g + 1) * group * row_bytes);
          cvs.insert(cvs.end(), vs.begin() + g * group * vs_row, vs.begin() + (g + 1) * group * vs_row);
          cvm.insert(cvm.end(), vm.begin() + g * group * vs_row, vm.begin() + (g + 1) * group * vs_row);
        }
        const auto dk = Random(dense * d, 6), dv = Random(dense * d, 7);
        std::vector<int32_t> rows(dense);
        for (int i = 0; i < dense; ++i) rows[i] = i;
        const int32_t tokens = static_cast<int32_t>(table.size()) * group;
        std::vector<CompressedKvHead> viewed(n * kv_heads), copied(n * kv_heads);
        for (int i = 0; i < n * kv_heads; ++i) {
          viewed[i].quant = {bits, group, vgroup, tokens, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data(),
                             table.data()};
          copied[i].quant = {bits,       group,      vgroup,     tokens,     ckc.data(), cks.data(),
                             ckm.data(), cvc.data(), cvs.data(), cvm.data()};
          viewed[i].dense = copied[i].dense = {dk.data(), dv.data(), d, rows.data(), dense - 20 * (i / kv_heads)};
        }
        const auto q = Random(n * heads * d, 8);
        std::vector<float> a(n * heads * d), c(n * heads * d);
        b.CompressedAttention(q.data(), n, heads, kv_heads, d, viewed.data(), 0.15f, a.data());
        b.CompressedAttention(q.data(), n, heads, kv_heads, d, copied.data(), 0.15f, c.data());
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0);
      }
    }
  }
}

TEST(GroupTables, TheReferenceReadsTheGroupsATableNames) { ExpectGroupTableReadsItsGroups(ReferenceBackend()); }

TEST_P(FastBackendTest, AGroupTableReadsTheGroupsItNames) { ExpectGroupTableReadsItsGroups(*fast_); }

// A bf16 product is the sum of the exact products of the input rounded to bf16 (to nearest, ties to
// even) and the weights: within float32 summation error of that sum computed in double, for rows
// alone and in blocks, with a tail of 8, 16 and 24 columns past a multiple of 32.
TEST_P(FastBackendTest, Bf16ProductsRoundTheInputOnce) {
  if (!TakesBf16Products(*fast_)) GTEST_SKIP() << GetParam() << " multiplies bf16 weights in float32";
  for (int64_t cols : {32, 40, 48, 56, 896}) {
    const int64_t rows = 37, n = 11;
    Weights w = MakeWeights(DType::kBF16, rows, cols, 31);
    const auto x = Random(static_cast<size_t>(n * cols), 32);
    std::vector<float> y(n * rows);
    fast_->MatMul(x.data(), n, w.view, y.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < rows; ++o) {
        double want = 0, scale = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = static_cast<double>(BF16ToF32(F32ToBF16(x[r * cols + c]))) * w.f32[o * cols + c];
          want += p;
          scale += std::fabs(p);
        }
        EXPECT_LE(std::fabs(want - y[r * rows + o]), 1e-6 * scale) << "cols " << cols << " row " << r << " output " << o;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FastBackendTest,
                         ::testing::Values("avx2", "avx512vl", "avx512vl-novbmi", "avx512bf16"), BackendParamName);

// The avx512vl builds (with and without VBMI) run avx2's arithmetic with more registers, one VNNI
// instruction where avx2 takes three for the same exact integer sums, and 512-bit vectors where each
// lane's result is the same: their results are the same bits, so workers on CPUs with and without
// AVX-512 produce the same KV, the same drafts and the same tokens. The avx512bf16 build is the same
// but for its products of bf16 weights.
class WideBackendTest : public ::testing::TestWithParam<const char*> {};

TEST_P(WideBackendTest, EqualsAvx2Bitwise) {
  const Backend* wide = BackendByName(GetParam());
  const Backend* avx2 = Avx2BackendIfSupported();
  if (wide == nullptr || avx2 == nullptr) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " backend";
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (t == DType::kBF16 && TakesBf16Products(*wide)) continue;
    for (int64_t n : {1, 5, 8, 13}) {  // the AVX-512 builds block products from 8 rows
      const int64_t rows = 300, cols = 688;
      Weights w = MakeWeights(t, rows, cols, 7);
      const auto x = Random(static_cast<size_t>(n * cols), 9);
      std::vector<float> a(n * rows), b(n * rows);
      avx2->MatMul(x.data(), n, w.view, a.data());
      wide->MatMul(x.data(), n, w.view, b.data());
      EXPECT_TRUE(same(a, b)) << "MatMul " << static_cast<int>(t) << ", rows " << n;
    }
  }
  for (int heads : {8, 6}) {
    const int kv_heads = 2, d = 32;
    const std::vector<int32_t> lens = {1, 255, 257, 3000};
    Pool p = MakePool(16, kv_heads, d, lens, 11);
    const int64_t n = static_cast<int64_t>(lens.size());
    const auto q = Random(n * heads * d, 12);
    const std::vector<AttentionRow> rows = p.Rows();
    std::vector<float> a(n * heads * d), b(n * heads * d);
    avx2->PagedAttention(q.data(), n, heads, rows.data(), p.layer, 0.17f, a.data());
    wide->PagedAttention(q.data(), n, heads, rows.data(), p.layer, 0.17f, b.data());
    EXPECT_TRUE(same(a, b)) << "PagedAttention heads " << heads;
  }
  // The 4-bit draft kernels: one and two value groups per head (d 32, 64), four and three query
  // heads per KV head, two rows.
  for (int d : {32, 64}) {
    for (int heads : {8, 6}) {
      const int kv_heads = 2, bits = 4, qtokens = 288, dense = 45, n = 2;
      std::mt19937 rng(5);
      std::vector<uint8_t> kc(qtokens * d * bits / 8), vc(kc.size());
      for (auto& c : kc) c = static_cast<uint8_t>(rng());
      for (auto& c : vc) c = static_cast<uint8_t>(rng());
      const auto ks = Random(qtokens / 32 * d, 1, 0.05f), km = Random(qtokens / 32 * d, 2);
      const auto vs = Random(qtokens * (d / 32), 3, 0.05f), vm = Random(qtokens * (d / 32), 4);
      const auto dk = Random(dense * d, 6), dv = Random(dense * d, 7);
      std::vector<int32_t> order(dense);
      for (int i = 0; i < dense; ++i) order[i] = (i * 7) % dense;
      std::vector<CompressedKvHead> kv(n * kv_heads);
      for (int i = 0; i < n * kv_heads; ++i) {
        kv[i].quant = {bits, 32, 32, qtokens, kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()};
        kv[i].dense = {dk.data(), dv.data(), d, order.data(), dense - 20 * (i / kv_heads)};
      }
      const auto q = Random(n * heads * d, 8);
      std::vector<float> a(n * heads * d), b(n * heads * d);
      avx2->CompressedAttention(q.data(), n, heads, kv_heads, d, kv.data(), 0.15f, a.data());
      wide->CompressedAttention(q.data(), n, heads, kv_heads, d, kv.data(), 0.15f, b.data());
      EXPECT_TRUE(same(a, b)) << "CompressedAttention d " << d << " heads " << heads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, WideBackendTest, ::testing::Values("avx512vl", "avx512vl-novbmi", "avx512bf16"),
                         BackendParamName);

}  // namespace
}  // namespace vc::kernels
