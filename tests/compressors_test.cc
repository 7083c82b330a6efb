// Compressed KV caches: memory accounting, KIVI quantization, exactness at full budget, exact
// rollback, pass-size invariance, what SnapKV / H2O / Quest choose, and spec errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"
#include "tests/testing/tiny_model.h"
#include "worker/compression/h2o_cache.h"
#include "worker/compression/kivi.h"
#include "worker/compression/query_recorder.h"
#include "worker/compression/quest_cache.h"
#include "worker/compression/registry.h"
#include "worker/compression/snapkv.h"
#include "worker/compression/token_list_cache.h"
#include "worker/runtime/model.h"

namespace vc {
namespace {

// Rows of a float32 test cache, to fill in place.
float* K(PagedKvCache& c, int l, SeqId s, int64_t p) { return static_cast<float*>(c.KRow(l, s, p)); }
float* V(PagedKvCache& c, int l, SeqId s, int64_t p) { return static_cast<float*>(c.VRow(l, s, p)); }

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
  return t;
}

class CompressorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::TinyModelSpec spec = testing::SmallGqaSpec();
    spec.seed = 11;
    const std::string dir = testing::TempDir("compressors_model");
    testing::WriteTinyModel(dir, spec);
    auto m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static KvLayout Layout() { return model_->kv_layout(16); }

  // A full cache holding tokens[0, n), prefilled in passes of 37 positions, and the queries of its
  // last 32 positions.
  struct Prefilled {
    std::unique_ptr<PagedKvCache> cache;
    SeqId seq = 0;
    PromptQueries queries;
  };
  static Prefilled Prefill(const std::vector<int32_t>& tokens, int64_t n) {
    Prefilled p;
    p.cache = std::make_unique<PagedKvCache>(Layout(), 4096 / 16);
    p.seq = p.cache->NewSequence();
    QueryRecorder rec(*p.cache, p.seq, n, 32, model_->config().num_layers);
    EXPECT_TRUE(model_->Prefill(absl::MakeConstSpan(tokens).first(n), p.seq, 37, rec, nullptr).ok());
    auto q = rec.Take();
    EXPECT_TRUE(q.ok()) << q.status();
    if (q.ok()) p.queries = std::move(*q);
    return p;
  }

  static std::unique_ptr<CompressedKvCache> Make(const std::string& spec) {
    auto c = MakeCompressedKvCache(spec, Layout(), model_->config().num_heads);
    EXPECT_TRUE(c.ok()) << spec << ": " << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A compressed cache of `spec` built from the first n positions of `p`; the sequence is 0.
  static std::unique_ptr<CompressedKvCache> Built(const std::string& spec, const Prefilled& p, int64_t n) {
    auto c = Make(spec);
    if (c == nullptr) return nullptr;
    const SeqId s = c->NewSequence();
    EXPECT_EQ(s, 0);
    const absl::Status st = c->BuildFrom(s, *p.cache, p.seq, n, &p.queries);
    EXPECT_TRUE(st.ok()) << spec << ": " << st;
    EXPECT_EQ(c->Length(s), n);
    return c;
  }

  // Logits of feeding `tokens` to `seq` of `cache` in passes of the given sizes (cycled), all rows.
  static std::vector<float> Feed(AttentionCache& cache, SeqId seq, absl::Span<const int32_t> tokens,
                                 const std::vector<int>& passes = {1}) {
    std::vector<float> all, logits;
    size_t at = 0, i = 0;
    while (at < tokens.size()) {
      const size_t len = std::min(tokens.size() - at, static_cast<size_t>(passes[i++ % passes.size()]));
      SequenceChunk ch{seq, tokens.subspan(at, len)};
      const absl::Status st = model_->Forward({&ch, 1}, cache, LogitsFor::kAllRows, &logits);
      EXPECT_TRUE(st.ok()) << st;
      all.insert(all.end(), logits.begin(), logits.end());
      at += len;
    }
    return all;
  }

  static Model* model_;
};
Model* CompressorsTest::model_ = nullptr;

// ---- (b) KIVI quantization --------------------------------------------------------------------

TEST(QuantizeAsymmetric, RoundTripWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  for (int bits : {2, 4, 8}) {
    for (int64_t stride : {1, 3}) {
      const int n = 37;
      std::vector<float> x(static_cast<size_t>(n * stride));
      for (float& v : x) v = nd(rng);
      std::vector<uint8_t> codes(static_cast<size_t>((n * bits + 7) / 8) + 1, 0);  // + a guard byte
      float scale = 0, mn = 0;
      QuantizeAsymmetric(x.data(), stride, n, bits, codes.data(), &scale, &mn);
      float lo = x[0], hi = x[0];
      for (int i = 0; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
      EXPECT_EQ(mn, lo);
      EXPECT_FLOAT_EQ(scale, (hi - lo) / static_cast<float>((1 << bits) - 1));
      EXPECT_EQ(codes.back(), 0) << "wrote past ceil(n * bits / 8) bytes";
      for (int i = 0; i < n; ++i) {
        const int code = kernels::UnpackCode(codes.data(), bits, i);
        ASSERT_LE(code, (1 << bits) - 1);
        const float back = mn + static_cast<float>(code) * scale;
        EXPECT_LE(std::fabs(back - x[i * stride]), scale / 2 * (1 + 1e-5f) + 1e-6f)
            << "bits " << bits << " stride " << stride << " i " << i;
      }
      // The extremes are representable exactly.
      int lo_code = -1, hi_code = -1;
      for (int i = 0; i < n; ++i) {
        if (x[i * stride] == lo) lo_code = kernels::UnpackCode(codes.data(), bits, i);
        if (x[i * stride] == hi) hi_code = kernels::UnpackCode(codes.data(), bits, i);
      }
      EXPECT_EQ(lo_code, 0);
      EXPECT_EQ(hi_code, (1 << bits) - 1);
    }
  }
  // A constant run: zero scale, every value back exactly.
  std::vector<float> c(16, -1.25f);
  std::vector<uint8_t> codes(8, 0);
  float scale = 1, mn = 0;
  QuantizeAsymmetric(c.data(), 1, 16, 4, codes.data(), &scale, &mn);
  EXPECT_EQ(scale, 0.0f);
  EXPECT_EQ(mn, -1.25f);
}

// The group quantizer every KIVI cache uses is bitwise QuantizeAsymmetric applied run by run.
TEST(QuantizeKiviGroup, BitwiseQuantizeAsymmetricPerRun) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (int bits : {2, 4, 8}) {
    for (int d : {32, 64}) {
      for (int g : {32, 64}) {
        for (int vg : {16, 32}) {
          std::vector<float> k(static_cast<size_t>(g) * d), v(k.size());
          for (float& x : k) x = nd(rng);
          for (float& x : v) x = nd(rng);
          for (int t = 0; t < g; ++t) k[static_cast<size_t>(t) * d + 3] = 0.75f;  // a constant channel
          for (int c = 0; c < vg; ++c) v[static_cast<size_t>(1) * d + c] = -2.0f;  // a constant run
          // Channel 7 spans [0, 15] in halves: with 4 bits the step is 1 and every odd half is a tie.
          for (int t = 0; t < g; ++t) k[static_cast<size_t>(t) * d + 7] = static_cast<float>(t % 31) * 0.5f;
          k[5] = 1e-30f;  // a channel with a tiny value
          // Signed zeros: which one a run's minimum or maximum keeps depends on the order of the
          // comparisons, so these catch operands taken the other way round.
          k[9] = 0.0f, k[d + 9] = -0.0f;
          for (int t = 0; t < g; ++t) k[static_cast<size_t>(t) * d + 10] = (t % 2 == 0) ? -0.0f : 0.0f;
          v[2 * static_cast<size_t>(d)] = 0.0f, v[2 * static_cast<size_t>(d) + 1] = -0.0f;
          for (int c = 0; c < vg; ++c) v[3 * static_cast<size_t>(d) + c] = (c % 2 == 0) ? 0.0f : -0.0f;
          const size_t codes = static_cast<size_t>(g) * d * bits / 8;
          std::vector<uint8_t> kc(codes, 0), vc(codes, 0);
          std::vector<float> ks(d), km(d), vs(static_cast<size_t>(g) * (d / vg)), vm(vs.size());
          QuantizeKiviGroup(k.data(), v.data(), g, d, vg, bits, {kc.data(), ks.data(), km.data(), vc.data(), vs.data(), vm.data()});
          const size_t run = static_cast<size_t>(g * bits / 8);
          for (int c = 0; c < d; ++c) {
            std::vector<uint8_t> want(run, 0);
            float scale = 0, mn = 0;
            QuantizeAsymmetric(k.data() + c, d, g, bits, want.data(), &scale, &mn);
            ASSERT_EQ(std::memcmp(&scale, &ks[c], 4), 0) << "bits " << bits << " key channel " << c;
            ASSERT_EQ(std::memcmp(&mn, &km[c], 4), 0);
            ASSERT_EQ(std::memcmp(want.data(), kc.data() + c * run, run), 0) << "bits " << bits << " key channel " << c;
          }
          const int runs = d / vg;
          for (int t = 0; t < g; ++t) {
            for (int r = 0; r < runs; ++r) {
              std::vector<uint8_t> want(static_cast<size_t>(vg * bits / 8), 0);
              float scale = 0, mn = 0;
              QuantizeAsymmetric(v.data() + static_cast<size_t>(t) * d + r * vg, 1, vg, bits, want.data(), &scale, &mn);
              ASSERT_EQ(std::memcmp(&scale, &vs[t * runs + r], 4), 0);
              ASSERT_EQ(std::memcmp(&mn, &vm[t * runs + r], 4), 0);
              const uint8_t* got = vc.data() + static_cast<size_t>(t) * (d * bits / 8) + r * vg * bits / 8;
              ASSERT_EQ(std::memcmp(want.data(), got, want.size()), 0) << "bits " << bits << " token " << t << " run " << r;
            }
          }
        }
      }
    }
  }
}

// ---- (a) memory accounting --------------------------------------------------------------------

// Bytes of one KIVI head holding n tokens whose first m sit before the rollback horizon.
int64_t KiviHeadBytes(int64_t n, int64_t m, int bits, int group, int residual, int d) {
  auto quantized = [&](int64_t t) { return t <= residual ? 0 : (t - residual) / group * group; };
  const int64_t q = quantized(n), f = quantized(m);
  const int64_t vg = std::min(group, d);
  return 2 * q * d * bits / 8 + 2 * (q / group) * d * 4 + 2 * q * (d / vg) * 4 + 2 * (n - f) * d * 4;
}

// Tokens an H2O head keeps right after a build at length L: the last recent - 1 positions and at
// most `heavy` of the others.
int64_t H2oKeptAfterBuild(int64_t L, int64_t heavy, int64_t recent) {
  const int64_t candidates = std::max<int64_t>(0, L - recent + 1);
  return std::min(candidates, heavy) + (L - candidates);
}

TEST_F(CompressorsTest, BytesMatchTheLayout) {
  const KvLayout lay = Layout();
  const int64_t heads = int64_t{lay.num_layers} * lay.num_kv_heads;
  const int d = lay.head_dim;
  const int64_t L = 200, more = 40;
  const auto tokens = Tokens(static_cast<int>(L + more), 21);
  const Prefilled pre = Prefill(tokens, L);
  const absl::Span<const int32_t> next = absl::MakeConstSpan(tokens).subspan(L);

  struct Case {
    std::string spec;
    std::function<int64_t(int64_t length)> expected;  // Bytes at `length` (a build at L, then decoding)
    bool check_after_decode = true;
  };
  const std::vector<Case> cases = {
      {"none", [&](int64_t n) { return heads * n * 2 * d * 4; }},
      {"kivi:bits=2", [&](int64_t n) { return heads * KiviHeadBytes(n, n - 32, 2, 32, 32, d); }},
      {"kivi:bits=4,group=32,residual=32", [&](int64_t n) { return heads * KiviHeadBytes(n, n - 32, 4, 32, 32, d); }},
      {"kivi:bits=8,group=16,residual=8", [&](int64_t n) { return heads * KiviHeadBytes(n, n - 8, 8, 16, 8, d); }},
      // The ring holds sinks + window + rollback slots once the context fills it.
      {"streaming:sinks=4,window=64,rollback=32",
       [&](int64_t) { return int64_t{lay.num_layers} * (4 + 64 + 32) * lay.num_kv_heads * d * 4 * 2; }},
      // Kept tokens with their positions; everything appended is kept.
      {"snapkv:capacity=64,window=16,kernel=5", [&](int64_t n) { return heads * (64 + n - L) * (4 + 2 * d * 4); }},
      // The window (32) covers the rollback (32): the last 32 positions are all kept.
      {"snapkv:capacity=96,window=32+kivi:bits=4,group=32,residual=32",
       [&](int64_t n) {
         const int64_t kept = 96 + n - L;
         return heads * (kept * 4 + KiviHeadBytes(kept, kept - 32, 4, 32, 32, d));
       }},
      // Right after the build no query is pending and no view is cached.
      {"h2o:heavy=32,recent=16,rollback=8",
       [&](int64_t n) { return heads * H2oKeptAfterBuild(n, 32, 16) * (2 * d * 4 + 4 + 4); }, false},
      {"h2o:heavy_ratio=0.1,recent_ratio=0.1,rollback=32",
       [&](int64_t n) { return heads * H2oKeptAfterBuild(n, n / 10, n / 10) * (2 * d * 4 + 4 + 4); }, false},
      // Every position plus min and max keys per page (partial last page included).
      {"quest:page=16,budget=64",
       [&](int64_t n) { return int64_t{lay.num_layers} * lay.num_kv_heads * d * 4 * (2 * n + 2 * ((n + 15) / 16)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    auto cache = Built(c.spec, pre, L);
    ASSERT_NE(cache, nullptr);
    EXPECT_EQ(cache->Bytes(0), c.expected(L));
    if (!c.check_after_decode) continue;
    Feed(*cache, 0, next);
    EXPECT_EQ(cache->Bytes(0), c.expected(L + more));
  }
}

// ---- (c) a budget that holds the whole context is full attention, bitwise -----------------------

TEST_F(CompressorsTest, FullBudgetReproducesFullCacheLogitsBitwise) {
  const int64_t P = 120, total = 150;
  const auto tokens = Tokens(static_cast<int>(total), 5);
  Prefilled pre = Prefill(tokens, P);
  for (const std::string spec :
       {"none", "streaming:sinks=4,window=150,rollback=8", "streaming:sinks=0,window=4096",
        "snapkv:capacity=4096", "snapkv:capacity=120,window=32", "h2o:heavy=100,recent=50,rollback=32",
        "h2o:heavy=140,recent=10,rollback=0", "h2o:heavy_ratio=1,recent_ratio=1", "quest:page=16,budget=160",
        "quest:page=7,budget=4096"}) {
    SCOPED_TRACE(spec);
    auto cache = Built(spec, pre, P);
    ASSERT_NE(cache, nullptr);
    for (int64_t i = P; i < total; ++i) {
      const auto full = Feed(*pre.cache, pre.seq, absl::MakeConstSpan(tokens).subspan(i, 1));
      const auto mine = Feed(*cache, 0, absl::MakeConstSpan(tokens).subspan(i, 1));
      ASSERT_TRUE(BitwiseEqual(full, mine)) << "position " << i;
    }
    ASSERT_TRUE(pre.cache->Truncate(pre.seq, P).ok());
  }
}

// Quest over KIVI's key groups with a budget that covers every group reads what KIVI reads; with
// a smaller one it reads less, and the logits move.
TEST_F(CompressorsTest, QuestOverKiviWithAFullBudgetIsKivi) {
  const int64_t P = 120;
  const auto tokens = Tokens(150, 15);
  Prefilled pre = Prefill(tokens, P);
  const absl::Span<const int32_t> next = absl::MakeConstSpan(tokens).subspan(P);
  auto kivi = Built("kivi:bits=4,group=8,residual=8", pre, P);
  auto all = Built("quest:budget=4096+kivi:bits=4,group=8,residual=8", pre, P);
  auto some = Built("quest:budget=32+kivi:bits=4,group=8,residual=8", pre, P);
  ASSERT_TRUE(kivi != nullptr && all != nullptr && some != nullptr);
  const auto want = Feed(*kivi, 0, next);
  EXPECT_TRUE(BitwiseEqual(want, Feed(*all, 0, next)));
  EXPECT_FALSE(BitwiseEqual(want, Feed(*some, 0, next)));
  EXPECT_EQ(kivi->Bytes(0), some->Bytes(0));  // every token is stored either way
}

// The views' group selections run on the kernel threads, each with its own scratch: which thread
// scores which view changes nothing.
TEST_F(CompressorsTest, QuestOverKiviSelectsAlikeOnAnyThreadCount) {
  const int64_t P = 120;
  const auto tokens = Tokens(150, 16);
  Prefilled pre = Prefill(tokens, P);
  const absl::Span<const int32_t> next = absl::MakeConstSpan(tokens).subspan(P);
  const int before = kernels::KernelThreadPool().num_threads();
  std::vector<std::vector<float>> logits;
  for (int threads : {1, 2, 3}) {
    kernels::SetKernelThreadCount(threads);
    auto some = Built("quest:budget=32+kivi:bits=4,group=8,residual=8", pre, P);
    if (some == nullptr) break;
    logits.push_back(Feed(*some, 0, next));
  }
  kernels::SetKernelThreadCount(before);
  ASSERT_EQ(logits.size(), 3u);
  EXPECT_TRUE(BitwiseEqual(logits[0], logits[1]));
  EXPECT_TRUE(BitwiseEqual(logits[0], logits[2]));
}

TEST_F(CompressorsTest, SmallBudgetsDoChangeTheLogits) {
  // The exactness above is not vacuous: these budgets drop positions and the logits move.
  const int64_t P = 120;
  const auto tokens = Tokens(140, 6);
  Prefilled pre = Prefill(tokens, P);
  const auto full = Feed(*pre.cache, pre.seq, absl::MakeConstSpan(tokens).subspan(P));
  for (const std::string spec : {"kivi:bits=2", "streaming:sinks=4,window=16", "snapkv:capacity=48,window=16",
                                 "h2o:heavy=16,recent=16,rollback=8", "quest:page=8,budget=32"}) {
    auto cache = Built(spec, pre, P);
    ASSERT_NE(cache, nullptr);
    EXPECT_FALSE(BitwiseEqual(full, Feed(*cache, 0, absl::MakeConstSpan(tokens).subspan(P)))) << spec;
  }
}

// ---- (d) rollback within MaxRollback is exact ---------------------------------------------------

const std::vector<std::string>& RollbackSpecs() {
  static const std::vector<std::string> specs = {
      "none",
      "kivi:bits=2,group=8,residual=8",
      "kivi:bits=4,group=32,residual=16",
      "kivi:bits=8,group=8,residual=12",
      "streaming:sinks=4,window=24,rollback=8",
      "snapkv:capacity=48,window=16,kernel=3",
      "snapkv:capacity=48,window=16+kivi:bits=4,group=8,residual=8",
      "h2o:heavy=16,recent=8,rollback=8",
      "h2o:heavy=12,recent=2,rollback=5",
      "h2o:heavy_ratio=0.1,recent_ratio=0.05,rollback=6",
      "quest:page=8,budget=32",
      "quest:budget=16+kivi:bits=4,group=8,residual=8",
  };
  return specs;
}

TEST_F(CompressorsTest, TruncateThenAppendEqualsNeverAppended) {
  const int64_t P = 100, m = 48;
  const auto tokens = Tokens(static_cast<int>(P + m), 8);
  const auto noise = Tokens(64, 9);
  const Prefilled pre = Prefill(tokens, P);
  const absl::Span<const int32_t> next = absl::MakeConstSpan(tokens).subspan(P);
  for (const std::string& spec : RollbackSpecs()) {
    SCOPED_TRACE(spec);
    auto ref = Built(spec, pre, P);
    auto cache = Built(spec, pre, P);
    ASSERT_TRUE(ref != nullptr && cache != nullptr);
    const auto want = Feed(*ref, 0, next);
    const int64_t k = std::min<int64_t>(cache->MaxRollback(), 12);
    ASSERT_GE(k, 1);
    const int vocab = model_->config().vocab_size;
    std::vector<float> got;
    for (int64_t j = 0; j < m; ++j) {
      if (j == 0 || j % 7 == 3) {
        // Draft k positions, then roll them back; at j % 14 == 10 twice in a row, the second
        // time after a shorter draft (a rollback counted from the longest length).
        for (int round = 0; round < (j % 14 == 10 ? 2 : 1); ++round) {
          const int64_t len = round == 0 ? k : std::max<int64_t>(1, k / 2);
          Feed(*cache, 0, absl::MakeConstSpan(noise).subspan(static_cast<size_t>(j % 16), static_cast<size_t>(len)));
          const absl::Status st = cache->Truncate(0, P + j);
          ASSERT_TRUE(st.ok()) << "at " << P + j << ": " << st;
          ASSERT_EQ(cache->Length(0), P + j);
        }
      }
      const auto step = Feed(*cache, 0, next.subspan(static_cast<size_t>(j), 1));
      got.insert(got.end(), step.begin(), step.end());
      ASSERT_TRUE(BitwiseEqual(std::vector<float>(want.begin() + j * vocab, want.begin() + (j + 1) * vocab), step))
          << "position " << P + j;
    }
  }
}

TEST_F(CompressorsTest, RollbackBeyondTheLimitIsRefused) {
  const int64_t P = 100;
  const auto tokens = Tokens(200, 12);
  const Prefilled pre = Prefill(tokens, P);
  for (const std::string spec : {"streaming:sinks=4,window=24,rollback=8", "h2o:heavy=16,recent=8,rollback=8"}) {
    SCOPED_TRACE(spec);
    auto cache = Built(spec, pre, P);
    ASSERT_NE(cache, nullptr);
    Feed(*cache, 0, absl::MakeConstSpan(tokens).subspan(P, 40));
    const int64_t len = cache->Length(0);
    EXPECT_EQ(cache->Truncate(0, len - 9).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->Truncate(0, len + 1).code(), absl::StatusCode::kInvalidArgument);
    // Two rollbacks that together go past the limit are refused too.
    ASSERT_TRUE(cache->Truncate(0, len - 5).ok());
    EXPECT_EQ(cache->Truncate(0, len - 10).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->Length(0), len - 5);
  }
  auto h2o = Built("h2o:heavy=16,recent=8,rollback=8", pre, P);
  ASSERT_NE(h2o, nullptr);
  EXPECT_EQ(h2o->Truncate(0, P - 1).code(), absl::StatusCode::kFailedPrecondition);  // into the built prompt
}

// The result of a row does not depend on how the positions are grouped into passes.
TEST_F(CompressorsTest, PassSizesDoNotChangeLogits) {
  const int64_t P = 100, m = 40;
  const auto tokens = Tokens(static_cast<int>(P + m), 14);
  const Prefilled pre = Prefill(tokens, P);
  const absl::Span<const int32_t> next = absl::MakeConstSpan(tokens).subspan(P);
  for (const std::string& spec : RollbackSpecs()) {
    SCOPED_TRACE(spec);
    auto one = Built(spec, pre, P);
    auto many = Built(spec, pre, P);
    ASSERT_TRUE(one != nullptr && many != nullptr);
    EXPECT_TRUE(BitwiseEqual(Feed(*one, 0, next), Feed(*many, 0, next, {3, 1, 5, 2})));
    EXPECT_EQ(one->Bytes(0), many->Bytes(0));
  }
}

// ---- what the methods choose --------------------------------------------------------------------

// A one-layer, one-KV-head cache of d = 16 whose value of position j is the unit vector e_j, so
// the channels of an attention output that are non-zero name the positions a row read.
constexpr int kD = 16;
KvLayout UnitLayout() { return KvLayout{1, 1, kD, 16}; }
std::vector<float> Unit(int j) {
  std::vector<float> v(kD, 0.0f);
  v[j] = 1.0f;
  return v;
}
std::vector<int> ReadPositions(const std::vector<float>& out) {
  std::vector<int> read;
  for (int c = 0; c < kD; ++c) {
    if (out[c] != 0.0f) read.push_back(c);
  }
  return read;
}

TEST(H2o, KeepsTheHeavyHitterAndTheRecentWindow) {
  // Every query points along e_0; the key of position 3 does too, strongly, so it draws almost
  // all attention from the moment it exists. heavy=1, recent=2, rollback=0: row p reads the
  // heavy hitter plus positions p-1 and p.
  H2oCache cache(UnitLayout(), 1, H2oParams{1, 2, 0, 0, 0});
  const SeqId s = cache.NewSequence();
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  const std::vector<float> q = Unit(0);
  std::vector<float> out(kD);
  for (int p = 0; p < 14; ++p) {
    std::vector<float> k(kD);
    for (float& x : k) x = nd(rng);
    if (p == 3) k[0] = 40.0f;
    ASSERT_TRUE(cache.Reserve(s, p + 1).ok());
    cache.Write(0, s, p, k.data(), Unit(p).data());
    const QueryRow row{s, p};
    cache.Attend(0, {&row, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
    cache.Commit(s, p + 1);
    if (p >= 6) {
      EXPECT_EQ(ReadPositions(out), (std::vector<int>{3, p - 1, p})) << "row " << p;
    }
  }
}

TEST(H2o, RollbackDelaysCountingButNotTheWindow) {
  // With rollback=4 the queries of the last 4 rows are not counted yet, and the positions they may
  // still evict stay: row p reads the heavy hitter and positions p-5..p.
  H2oCache cache(UnitLayout(), 1, H2oParams{1, 2, 0, 0, 4});
  const SeqId s = cache.NewSequence();
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  const std::vector<float> q = Unit(0);
  std::vector<float> out(kD);
  for (int p = 0; p < 16; ++p) {
    std::vector<float> k(kD);
    for (float& x : k) x = nd(rng);
    if (p == 3) k[0] = 40.0f;
    cache.Write(0, s, p, k.data(), Unit(p).data());
    const QueryRow row{s, p};
    cache.Attend(0, {&row, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
    cache.Commit(s, p + 1);
    if (p >= 12) {
      EXPECT_EQ(ReadPositions(out), (std::vector<int>{3, p - 5, p - 4, p - 3, p - 2, p - 1, p})) << "row " << p;
    }
  }
}

TEST(Quest, ReadsTheBestPageAndItsOwn) {
  // Pages of 4; budget 8 = the row's own page plus one more. Positions 5..7 have keys along the
  // query, so page 1 bounds q . k highest.
  QuestCache cache(UnitLayout(), QuestParams{4, 8});
  const SeqId s = cache.NewSequence();
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (int p = 0; p < 14; ++p) {
    std::vector<float> k(kD);
    for (float& x : k) x = nd(rng);
    if (p >= 5 && p <= 7) k[0] = 3.0f;
    cache.Write(0, s, p, k.data(), Unit(p).data());
  }
  cache.Commit(s, 14);
  const std::vector<float> q = Unit(0);
  std::vector<float> out(kD);
  const QueryRow row{s, 13};
  cache.Attend(0, {&row, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
  EXPECT_EQ(ReadPositions(out), (std::vector<int>{4, 5, 6, 7, 12, 13}));

  // Truncating into page 1 recomputes its bounds from position 4 alone; with the aligned keys now
  // on page 2, page 2 is read. Bounds left over from positions 5..7 would still pick page 1.
  ASSERT_TRUE(cache.Truncate(s, 5).ok());
  for (int p = 5; p < 14; ++p) {
    std::vector<float> k(kD, 0.0f);
    if (p / 4 == 2) k[0] = 1.0f;
    cache.Write(0, s, p, k.data(), Unit(p).data());
  }
  cache.Commit(s, 14);
  cache.Attend(0, {&row, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
  EXPECT_EQ(ReadPositions(out), (std::vector<int>{8, 9, 10, 11, 12, 13}));

  // An earlier row reads every page it has when they fit the budget.
  const QueryRow early{s, 6};
  cache.Attend(0, {&early, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
  EXPECT_EQ(ReadPositions(out), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE(cache.Truncate(s, 13).ok());
  EXPECT_EQ(cache.Bytes(s), 4 * (2 * 13 * kD + 2 * 4 * kD));
}

TEST(QuestOverKivi, ReadsTheKeyGroupsThatBoundTheQueryHighest) {
  // d = 32, so values e_0..e_31 name 32 positions; 8-bit KIVI in key groups of 8, residual 8:
  // after a commit at 32, a row at 31 reads groups 0 and 1 (positions 0..15) quantized and 16..31
  // in float32. Budget 8: one group. Positions 9..12 have keys along the query, so group 1 bounds
  // q . k highest.
  constexpr int d = 32;
  const KvLayout layout{1, 1, d, 16};
  const auto unit = [](int j) {
    std::vector<float> v(d, 0.0f);
    v[j] = 1.0f;
    return v;
  };
  const auto read = [](const std::vector<float>& out) {
    std::vector<int> r;
    for (int c = 0; c < d; ++c) {
      if (out[c] != 0.0f) r.push_back(c);
    }
    return r;
  };
  const auto range = [](int a, int b) {
    std::vector<int> r;
    for (int j = a; j < b; ++j) r.push_back(j);
    return r;
  };
  for (const bool aligned : {true, false}) {
    SCOPED_TRACE(aligned ? "keys along the query in group 1" : "no key stands out");
    TokenListCache cache(layout, 1, KiviParams{8, 8, 8}, nullptr, 8);
    const SeqId s = cache.NewSequence();
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    for (int p = 0; p < d; ++p) {
      std::vector<float> k(d, 0.0f);
      if (aligned) {
        for (float& x : k) x = nd(rng);
        if (p >= 9 && p <= 12) k[0] = 3.0f;
      }
      cache.Write(0, s, p, k.data(), unit(p).data());
    }
    cache.Commit(s, d);
    const std::vector<float> q = unit(0);
    std::vector<float> out(d);
    const QueryRow row{s, d - 1};
    cache.Attend(0, {&row, 1}, q.data(), 1, 0.25f, kernels::DefaultBackend(), out.data());
    std::vector<int> want = aligned ? range(8, 16) : range(0, 8);  // ties go to the earlier group
    for (int j = 16; j < d; ++j) want.push_back(j);
    EXPECT_EQ(read(out), want);
  }
}

TEST(SnapKv, KeepsThePositionsTheWindowAttendsTo) {
  const KvLayout lay = UnitLayout();
  PagedKvCache full(lay, 8);
  const SeqId s = full.NewSequence();
  const int64_t L = 100;
  ASSERT_TRUE(full.Reserve(s, L).ok());
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (int64_t p = 0; p < L; ++p) {
    for (int c = 0; c < kD; ++c) K(full, 0, s, p)[c] = nd(rng), V(full, 0, s, p)[c] = nd(rng);
    if (p == 10 || p == 50 || p == 77) K(full, 0, s, p)[0] = 8.0f;
  }
  full.Commit(s, L);
  PromptQueries q;
  q.end = L;
  q.count = 8;
  q.per_layer.assign(1, std::vector<float>(8 * kD, 0.0f));
  for (int i = 0; i < 8; ++i) q.per_layer[0][i * kD] = 1.0f;

  auto params = ParseSnapKvParams(MethodSpec{"snapkv", {{"capacity", "11"}, {"window", "8"}, {"kernel", "1"}}});
  ASSERT_TRUE(params.ok()) << params.status();
  SnapKvSelector sel(*params);
  auto kept = sel.Select(full, s, L, &q, 1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)[0][0], (std::vector<int32_t>{10, 50, 77, 92, 93, 94, 95, 96, 97, 98, 99}));

  // With pooling over 3 positions the neighbours of the strongest votes tie with them; ties go to
  // the lower position, so 9, 10, 11 win over 49.. and 76...
  params = ParseSnapKvParams(MethodSpec{"snapkv", {{"capacity", "11"}, {"window", "8"}, {"kernel", "3"}}});
  ASSERT_TRUE(params.ok());
  kept = SnapKvSelector(*params).Select(full, s, L, &q, 1);
  ASSERT_TRUE(kept.ok());
  const std::vector<int32_t>& k3 = (*kept)[0][0];
  ASSERT_EQ(k3.size(), 11u);
  for (int32_t p : {9, 10, 11}) EXPECT_NE(std::find(k3.begin(), k3.end(), p), k3.end()) << p;

  // Without queries, or with queries of another prompt length, there is nothing to select by.
  EXPECT_EQ(sel.Select(full, s, L, nullptr, 1).status().code(), absl::StatusCode::kInvalidArgument);
  q.end = L - 1;
  EXPECT_EQ(sel.Select(full, s, L, &q, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // A prompt within the capacity is kept whole, queries or not.
  auto whole = sel.Select(full, s, 11, nullptr, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)[0][0].size(), 11u);
}

TEST_F(CompressorsTest, QueryRecorderChangesNothingAndRecordsTheLastQueries) {
  const auto tokens = Tokens(90, 17);
  PagedKvCache plain(Layout(), 16), recorded(Layout(), 16);
  const SeqId a = plain.NewSequence(), b = recorded.NewSequence();
  QueryRecorder rec(recorded, b, 90, 20, model_->config().num_layers);
  const auto want = Feed(plain, a, tokens, {33});
  EXPECT_TRUE(BitwiseEqual(want, Feed(rec, b, tokens, {33})));
  auto q = rec.Take();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->end, 90);
  EXPECT_EQ(q->count, 20);
  ASSERT_EQ(q->per_layer.size(), static_cast<size_t>(model_->config().num_layers));
  const int hd = model_->config().num_heads * model_->config().head_dim;
  EXPECT_EQ(q->per_layer[0].size(), static_cast<size_t>(20 * hd));

  // The same prompt in other pass sizes records the same queries, bitwise.
  PagedKvCache other(Layout(), 16);
  const SeqId c = other.NewSequence();
  QueryRecorder rec2(other, c, 90, 20, model_->config().num_layers);
  Feed(rec2, c, tokens, {1, 7, 40});
  auto q2 = rec2.Take();
  ASSERT_TRUE(q2.ok());
  for (size_t l = 0; l < q->per_layer.size(); ++l) EXPECT_TRUE(BitwiseEqual(q->per_layer[l], q2->per_layer[l]));

  // A prefill that stops short is reported.
  PagedKvCache shorter(Layout(), 16);
  const SeqId d = shorter.NewSequence();
  QueryRecorder rec3(shorter, d, 90, 20, model_->config().num_layers);
  Feed(rec3, d, absl::MakeConstSpan(tokens).subspan(0, 80));
  EXPECT_EQ(rec3.Take().status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- (e) specs ----------------------------------------------------------------------------------

TEST_F(CompressorsTest, BadSpecsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty compressor spec"},
      {"foo", "unknown compressor 'foo'"},
      {"kivi:bits=3", "bits must be 2, 4 or 8"},
      {"kivi:bits=x", "bits must be an integer"},
      {"kivi:bitz=4", "unknown parameter 'bitz'"},
      {"kivi:bits", "expected key=value"},
      {"kivi:bits=4,bits=2", "repeated key 'bits'"},
      {"kivi:group=12", "group must be a multiple of 8"},
      {"h2o+kivi", "unsupported composition 'h2o+kivi'"},
      {"quest:page=16+kivi:bits=4", "pages are kivi's key groups of 32 positions; got page=16"},
      {"quest:budget=16+kivi:bits=4", "budget 16 must hold at least one page of 32"},
      {"quest:capacity=64+kivi:bits=4", "unknown parameter 'capacity'"},
      {"quest:budget=64+kivi:bits=3", "bits must be 2, 4 or 8"},
      {"kivi+snapkv", "unsupported composition 'kivi+snapkv'"},
      {"snapkv+streaming", "unsupported composition 'snapkv+streaming'"},
      {"snapkv:kernel=4", "kernel must be odd"},
      {"snapkv:capacity=16,window=32", "capacity 16 must be at least the window 32"},
      {"snapkv:pooling=min", "pooling must be max or avg"},
      {"snapkv:window=0", "window must be an integer in"},
      {"snapkv:capacity=64+kivi:bits=5", "bits must be 2, 4 or 8"},
      {"h2o:heavy=10,heavy_ratio=0.1", "give heavy or heavy_ratio, not both"},
      {"h2o:recent=0", "recent must be an integer in"},
      {"h2o:rollback=-1", "rollback must be an integer in"},
      {"h2o:heavy_ratio=1.5", "heavy_ratio must be a number in"},
      {"h2o:window=4", "unknown parameter 'window'"},
      {"quest:budget=8,page=16", "budget 8 must hold at least one page of 16"},
      {"quest:page=0", "page must be an integer in"},
      {"streaming:window=0", "window must be an integer in"},
      {"none:bits=4", "unknown parameter 'bits'"},
      // Quoted in messages, so kept short and on one line.
      {"kivi:bits=" + std::string(100000, '9'), "compressor spec of 100010 bytes; at most 256"},
      {"kivi:bits=4\nevil", "control or non-ASCII byte"},
      {"kivi:bits=4\xc3\xa9", "control or non-ASCII byte"},
  };
  for (const auto& [spec, message] : cases) {
    auto c = MakeCompressedKvCache(spec, Layout(), model_->config().num_heads);
    ASSERT_FALSE(c.ok()) << spec;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(c.status().message().find(message), absl::string_view::npos)
        << spec << " gave '" << c.status().message() << "'";
  }
  auto unknown = MakeCompressedKvCache("foo", Layout(), model_->config().num_heads);
  EXPECT_NE(unknown.status().message().find("snapkv, h2o, quest"), absl::string_view::npos);
}

TEST_F(CompressorsTest, CanonicalSpecsRoundTripAndDeclareTheirNeeds) {
  const std::vector<std::pair<std::string, CompressorNeeds>> cases = {
      {"none", CompressorNeeds::kKeysValues},
      {"kivi:bits=2", CompressorNeeds::kKeysValues},
      {"streaming", CompressorNeeds::kKeysValues},
      {"snapkv", CompressorNeeds::kPromptQueries},
      {"snapkv:capacity=1024,pooling=avg+kivi:bits=4", CompressorNeeds::kPromptQueries},
      {"h2o", CompressorNeeds::kPastAttention},
      {"h2o:heavy=100,recent_ratio=0.25", CompressorNeeds::kPastAttention},
      {"quest", CompressorNeeds::kCurrentQuery},
      {"quest:budget=64+kivi:bits=4", CompressorNeeds::kCurrentQuery},
  };
  for (const auto& [spec, needs] : cases) {
    auto a = Make(spec);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->needs(), needs) << spec;
    auto b = Make(a->spec());
    ASSERT_NE(b, nullptr) << a->spec();
    EXPECT_EQ(a->spec(), b->spec());
    EXPECT_EQ(a->MaxRollback(), b->MaxRollback());
  }
  EXPECT_EQ(Make("snapkv")->spec(), "snapkv:capacity=2048,window=32,kernel=5,pooling=max");
  EXPECT_EQ(Make("h2o:heavy=64,recent=32")->spec(), "h2o:heavy=64,recent=32,rollback=32");
  EXPECT_EQ(Make("h2o")->spec(), "h2o:heavy_ratio=0.1,recent_ratio=0.1,rollback=32");
  EXPECT_EQ(Make("quest")->spec(), "quest:page=16,budget=1024");
  EXPECT_EQ(Make("quest+kivi")->spec(), "quest:budget=1024+kivi:bits=4,group=32,residual=32");
  EXPECT_EQ(Make("quest:page=8,budget=64+kivi:group=8")->spec(), "quest:budget=64+kivi:bits=4,group=8,residual=32");
  // Every token is stored as KIVI stores it, so the store's compressed blocks serve it too.
  EXPECT_EQ(Make("quest:budget=64+kivi:bits=4")->block_format().bits, 4);
  EXPECT_EQ(Make("quest:budget=64+kivi:bits=4")->MaxRollback(), 32);
  EXPECT_EQ(Make("h2o:rollback=7")->MaxRollback(), 7);
  EXPECT_EQ(Make("quest")->MaxRollback(), int64_t{1} << 30);
}

// Two layers of 600 positions of random full K/V, for the KIVI block tests.
class KiviBlocks : public ::testing::Test {
 protected:
  void Fill(uint32_t seed) {
    rng.seed(seed);
    ASSERT_TRUE(full.Reserve(fs, L).ok());
    for (int l = 0; l < lay.num_layers; ++l) {
      for (int64_t p = 0; p < L; ++p) {
        for (int c = 0; c < lay.num_kv_heads * lay.head_dim; ++c) K(full, l, fs, p)[c] = nd(rng), V(full, l, fs, p)[c] = nd(rng);
      }
    }
    full.Commit(fs, L);
  }
  const KvLayout lay{2, 2, 32, 16};
  const int heads = 8;
  PagedKvCache full{lay, 64};
  const SeqId fs = full.NewSequence();
  const int64_t L = 600;
  std::mt19937 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
};

// What the engine relies on to rebuild a sequence's KIVI cache from a cached copy of its prefix.
TEST_F(KiviBlocks, AForkOfABuiltPrefixWithTheRestAppendedIsTheBuiltCache) {
  Fill(13);
  for (const char* spec : {"kivi:bits=4,group=32,residual=32", "kivi:bits=2,group=32,residual=64"}) {
    for (int64_t prefix : {256, 512, 592}) {
      auto cache = MakeCompressedKvCache(spec, lay, heads);
      ASSERT_TRUE(cache.ok());
      CompressedKvCache& c = **cache;
      const SeqId built = c.NewSequence(), pre = c.NewSequence();
      ASSERT_TRUE(c.BuildFrom(built, full, fs, L, nullptr).ok());
      ASSERT_TRUE(c.BuildFrom(pre, full, fs, prefix, nullptr).ok());
      const SeqId forked = c.Fork(pre);
      ASSERT_TRUE(c.Reserve(forked, L).ok());
      for (int l = 0; l < lay.num_layers; ++l) {
        for (int64_t p = prefix; p < L; ++p) c.Write(l, forked, p, K(full, l, fs, p), V(full, l, fs, p));
      }
      c.Commit(forked, L);
      EXPECT_EQ(c.Bytes(forked), c.Bytes(built)) << spec << " prefix " << prefix;
      std::vector<float> q(heads * lay.head_dim), out_b(q.size()), out_f(q.size());
      for (float& x : q) x = nd(rng);
      for (int l = 0; l < lay.num_layers; ++l) {
        for (int64_t pos : {L - 20, L - 1}) {
          const QueryRow rb{built, pos}, rf{forked, pos};
          c.Attend(l, {&rb, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_b.data());
          c.Attend(l, {&rf, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_f.data());
          ASSERT_EQ(0, std::memcmp(out_f.data(), out_b.data(), out_f.size() * 4))
              << spec << " prefix " << prefix << " layer " << l << " pos " << pos;
        }
      }
    }
  }
}

// A KIVI cache built from encoded blocks (what a worker reads from the cache store) and then
// extended as usual reads exactly what a cache built from the full KV reads: the same codes, the
// same float32 tail, bitwise the same attention outputs.
TEST_F(KiviBlocks, AppendedBlocksAttendLikeABuiltCache) {
  Fill(11);
  for (const char* spec : {"kivi:bits=4,group=32,residual=32", "kivi:bits=2,group=32,residual=64"}) {
    auto built = MakeCompressedKvCache(spec, lay, heads);
    auto appended = MakeCompressedKvCache(spec, lay, heads);
    ASSERT_TRUE(built.ok() && appended.ok());
    ASSERT_EQ((*appended)->block_format().group, 32);
    KiviBlockCodec& codec = *(*appended)->block_codec();
    const SeqId b = (*built)->NewSequence();
    ASSERT_TRUE((*built)->BuildFrom(b, full, fs, L, nullptr).ok());

    const SeqId a = (*appended)->NewSequence();
    for (int64_t first : {0, 256}) {
      std::vector<std::string> layers;
      ASSERT_TRUE(codec.EncodeBlock(full, fs, first, 256, &layers).ok());
      ASSERT_EQ(layers.size(), 2u);
      ASSERT_TRUE(codec.AppendBlock(a, 256, {layers[0], layers[1]}).ok());
    }
    EXPECT_EQ((*appended)->Length(a), 512);
    ASSERT_TRUE((*appended)->Reserve(a, L).ok());
    for (int l = 0; l < lay.num_layers; ++l) {
      for (int64_t p = 512; p < L; ++p) (*appended)->Write(l, a, p, K(full, l, fs, p), V(full, l, fs, p));
    }
    (*appended)->Commit(a, L);

    std::vector<float> q(heads * lay.head_dim), out_b(q.size()), out_a(q.size());
    for (float& x : q) x = nd(rng);
    for (int l = 0; l < lay.num_layers; ++l) {
      for (int64_t pos : {int64_t{590}, L - 1}) {  // rows whose own view quantizes all 512 block tokens
        const QueryRow rb{b, pos}, ra{a, pos};
        (*built)->Attend(l, {&rb, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_b.data());
        (*appended)->Attend(l, {&ra, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_a.data());
        ASSERT_EQ(0, std::memcmp(out_a.data(), out_b.data(), out_a.size() * 4)) << spec << " layer " << l << " pos " << pos;
      }
    }
    // Rollback stays within what was written after the blocks; blocks append only to blocks.
    EXPECT_TRUE((*appended)->Truncate(a, L - 8).ok());
    EXPECT_FALSE((*appended)->Truncate(a, 500).ok());
    std::vector<std::string> layers;
    ASSERT_TRUE(codec.EncodeBlock(full, fs, 0, 32, &layers).ok());
    EXPECT_EQ(codec.AppendBlock(a, 32, {layers[0], layers[1]}).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(codec.EncodeBlock(full, fs, 16, 32, &layers).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(codec.EncodeBlock(full, fs, 576, 64, &layers).code(), absl::StatusCode::kInvalidArgument);
    const SeqId fresh = (*appended)->NewSequence();
    EXPECT_EQ(codec.AppendBlock(fresh, 32, {layers[0]}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(codec.AppendBlock(fresh, 32, {layers[0], layers[1].substr(1)}).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Compressors that select tokens have no block form.
  for (const char* spec : {"streaming:sinks=4,window=64", "snapkv:capacity=64+kivi:bits=4", "none"}) {
    auto c = MakeCompressedKvCache(spec, lay, heads);
    ASSERT_TRUE(c.ok()) << spec;
    EXPECT_EQ((*c)->block_codec(), nullptr) << spec;
    EXPECT_EQ((*c)->block_format().bits, 0) << spec;
  }
}

// A built cache cut back to a shorter prefix (what the engine hands a prompt that shares only part
// of a cached prefix) holds what appending that prefix's encoded blocks gives: extended the same
// way, the two attend bitwise alike. Cuts into positions not yet quantized, off a group or past
// the end are refused and change nothing; compressors without a block form have no codec to cut with.
TEST_F(KiviBlocks, ACutPrefixIsItsAppendedBlocks) {
  Fill(17);
  for (const char* spec : {"kivi:bits=4,group=32,residual=32", "kivi:bits=2,group=32,residual=64"}) {
    auto cache = MakeCompressedKvCache(spec, lay, heads);
    ASSERT_TRUE(cache.ok());
    CompressedKvCache& c = **cache;
    KiviBlockCodec& codec = *c.block_codec();
    const SeqId built = c.NewSequence();
    ASSERT_TRUE(c.BuildFrom(built, full, fs, L, nullptr).ok());
    // 600 positions, residual 32 or 64: 544 or 512 are quantized.
    EXPECT_EQ(codec.CutTo(c.Fork(built), 576).code(), absl::StatusCode::kFailedPrecondition) << spec;
    EXPECT_EQ(codec.CutTo(c.Fork(built), 250).code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_EQ(codec.CutTo(c.Fork(built), 640).code(), absl::StatusCode::kInvalidArgument) << spec;
    for (int64_t cut : {256, 512}) {
      const SeqId cutp = c.Fork(built);
      ASSERT_TRUE(codec.CutTo(cutp, cut).ok()) << spec << " cut " << cut;
      EXPECT_EQ(c.Length(cutp), cut);
      const SeqId a = c.NewSequence();
      for (int64_t first = 0; first < cut; first += 256) {
        std::vector<std::string> layers;
        ASSERT_TRUE(codec.EncodeBlock(full, fs, first, 256, &layers).ok());
        ASSERT_TRUE(codec.AppendBlock(a, 256, {layers[0], layers[1]}).ok());
      }
      EXPECT_EQ(c.Bytes(cutp), c.Bytes(a)) << spec << " cut " << cut;
      // Both extended with other K/V than the built cache had past the cut: a prompt that diverges.
      for (SeqId seq : {cutp, a}) {
        ASSERT_TRUE(c.Reserve(seq, L).ok());
        for (int l = 0; l < lay.num_layers; ++l) {
          for (int64_t p = cut; p < L; ++p) c.Write(l, seq, p, V(full, l, fs, p), K(full, l, fs, p));
        }
        c.Commit(seq, L);
      }
      std::vector<float> q(heads * lay.head_dim), out_c(q.size()), out_a(q.size());
      for (float& x : q) x = nd(rng);
      for (int l = 0; l < lay.num_layers; ++l) {
        for (int64_t pos : {cut, L - 1}) {
          const QueryRow rc{cutp, pos}, ra{a, pos};
          c.Attend(l, {&rc, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_c.data());
          c.Attend(l, {&ra, 1}, q.data(), heads, 0.17f, kernels::DefaultBackend(), out_a.data());
          ASSERT_EQ(0, std::memcmp(out_c.data(), out_a.data(), out_c.size() * 4))
              << spec << " cut " << cut << " layer " << l << " pos " << pos;
        }
      }
    }
  }
  for (const char* spec : {"streaming:sinks=4,window=64", "snapkv:capacity=64+kivi:bits=4", "none", "quest"}) {
    auto c = MakeCompressedKvCache(spec, lay, heads);
    ASSERT_TRUE(c.ok()) << spec;
    EXPECT_EQ((*c)->block_codec(), nullptr) << spec;
  }
}

}  // namespace
}  // namespace vc
