// Abuse of every gRPC method of a real store, worker and router on loopback: requests built at
// random from each method's message type (any field, any value, strings that are not UTF-8, long
// repeated fields) and their bytes mutated (bits flipped, cut short, bytes inserted, slices
// repeated), sent with the right token, a wrong one and none. Every call must end with a status
// before its deadline, no server may crash, and afterwards each must still serve: a worker's
// output through the router equals sequential full-KV decoding, twice (the second time with its
// prefix from the store). Prints what was sent and how the calls ended.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "gtest/gtest.h"
#include "services/inference_client.h"
#include "services/servers.h"
#include "tests/testing/servers.h"
#include "vericache/v1/cache_store.pb.h"
#include "vericache/v1/inference.pb.h"

namespace vc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Fills `m` with random fields: each set or not, numbers anywhere in their range (and near their
// edges), strings and bytes of random bytes, up to 5 repeated values (now and then 5000).
void Randomize(Message* m, std::mt19937_64& rng, int depth) {
  const Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  std::uniform_int_distribution<int> coin(0, 3);
  const auto number = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0: return rng() % 16;
      case 1: return rng() % 100000;
      case 2: return ~uint64_t{0} - rng() % 4;
      default: return rng();
    }
  };
  const auto text = [&]() {
    std::string s(rng() % 3 == 0 ? rng() % 4096 : rng() % 24, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 3 == 0 ? 'a' + rng() % 26 : rng());
    return s;
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (coin(rng) == 0) continue;
    const int n = !f->is_repeated() ? 1 : rng() % 50 == 0 ? 5000 : static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) {
      const bool rep = f->is_repeated();
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32: {
          const auto v = static_cast<int32_t>(number());
          rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_INT64: {
          const auto v = static_cast<int64_t>(number());
          rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_UINT32: {
          const auto v = static_cast<uint32_t>(number());
          rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_UINT64: {
          const uint64_t v = number();
          rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_FLOAT: {
          const float v = static_cast<float>(static_cast<int64_t>(number())) / 7.0f;
          rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_DOUBLE: {
          const double v = static_cast<double>(static_cast<int64_t>(number())) / 7.0;
          rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_BOOL: {
          const bool v = rng() % 2;
          rep ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_ENUM: {
          const int v = static_cast<int>(rng() % (f->enum_type()->value_count() + 2));
          rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_STRING: {
          const std::string v = text();
          rep ? r->AddString(m, f, v) : r->SetString(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth < 3) Randomize(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), rng, depth + 1);
          break;
      }
    }
  }
}

// `bytes` with a few random mutations.
std::string Mutate(std::string bytes, std::mt19937_64& rng) {
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    switch (rng() % 4) {
      case 0:
        if (!bytes.empty()) bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:
        if (!bytes.empty()) bytes.resize(rng() % bytes.size());
        break;
      case 2: {
        std::string junk(1 + rng() % 16, '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        bytes.insert(bytes.empty() ? 0 : rng() % bytes.size(), junk);
        break;
      }
      default:
        if (!bytes.empty()) {
          const size_t at = rng() % bytes.size();
          bytes += bytes.substr(at, 1 + rng() % 64);
        }
    }
  }
  return bytes;
}

struct Tally {
  int sent = 0;
  std::map<grpc::StatusCode, int> ended;
  absl::Duration longest;
};

// Sends `per_method` random requests (half mutated) to every method of `service` at `target`,
// with `token`, a wrong token or none; every call must end within its deadline and some slack.
void Abuse(const std::string& target, const std::string& service, const std::string& token, int per_method,
           uint64_t seed, Tally* tally) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  ASSERT_NE(s, nullptr) << service;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < s->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = s->method(i);
    const std::string path = absl::StrCat("/", service, "/", method->name());
    for (int k = 0; k < per_method; ++k) {
      std::unique_ptr<Message> m(
          google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type())->New());
      Randomize(m.get(), rng, 0);
      std::string bytes = m->SerializeAsString();
      if (k % 2 == 1) bytes = Mutate(std::move(bytes), rng);
      const std::string who = k % 10 == 0 ? "" : k % 10 == 1 ? "not-a-token" : token;
      const absl::Time start = absl::Now();
      const grpc::Status st = testing::CallRaw(target, path, bytes, who, absl::Seconds(5));
      const absl::Duration took = absl::Now() - start;
      tally->sent++;
      tally->ended[st.error_code()]++;
      tally->longest = std::max(tally->longest, took);
      ASSERT_LT(took, absl::Seconds(15)) << path << " did not end: " << st.error_message();
    }
  }
}

TEST(Abuse, EveryMethodTakesJunkAndTheServersStillServeExactly) {
  testing::TinyStack t = testing::MakeTinyStack("abuse");
  t.store.ucx = "off";
  auto store = StoreServer::Start(t.store);
  ASSERT_TRUE(store.ok()) << store.status();
  t.worker.store_target = (*store)->target();
  t.worker.service.client_tokens = {{"client-a", "a"}, {"client-b", "b"}};
  auto worker = WorkerServer::Start(t.worker);
  ASSERT_TRUE(worker.ok()) << worker.status();
  RouterServerOptions ro;
  ro.service.workers = (*worker)->target();
  ro.service.worker_token = "client-a";
  ro.service.health_interval_ms = 50;
  auto router = RouterServer::Start(ro);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE((*router)->service().WaitServing(1, absl::Seconds(20)));

  Tally store_tally, worker_tally, router_tally;
  Abuse((*store)->target(), "vericache.v1.CacheStore", "tok", 400, 1, &store_tally);
  Abuse((*worker)->target(), "vericache.v1.Inference", "client-a", 400, 2, &worker_tally);
  Abuse((*router)->target(), "vericache.v1.Inference", "client-b", 200, 3, &router_tally);
  Abuse((*router)->target(), "vericache.v1.Router", "client-b", 200, 4, &router_tally);
  ASSERT_FALSE(HasFatalFailure());
  for (const auto& [name, tally] : {std::pair{"store", &store_tally}, std::pair{"worker", &worker_tally},
                                     std::pair{"router", &router_tally}}) {
    std::string codes;
    for (const auto& [code, n] : tally->ended) absl::StrAppend(&codes, " ", static_cast<int>(code), ":", n);
    std::printf("%s: %d junk calls, ended by status code%s; the longest took %.2f s\n", name, tally->sent,
                codes.c_str(), absl::ToDoubleSeconds(tally->longest));
    // A handler that threw, or a server that broke a call, would show as these.
    EXPECT_EQ(tally->ended.count(grpc::StatusCode::UNKNOWN), 0u) << name;
    EXPECT_EQ(tally->ended.count(grpc::StatusCode::INTERNAL), 0u) << name;
  }

  // Still serving, exactly: the same request twice through the router, the second time with its
  // prefix in the store.
  const vericache::v1::GenerateRequest r = testing::IdsRequest(100, 24);
  const std::vector<int32_t> want = testing::FullOutput(t.worker.model_dir, r);
  ASSERT_FALSE(want.empty());
  auto stub = InferenceStub((*router)->target());
  for (int round = 0; round < 2; ++round) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer client-a");
    auto reader = stub->Generate(&ctx, r);
    std::vector<int32_t> got;
    vericache::v1::GenerateResponse resp;
    while (reader->Read(&resp)) got.insert(got.end(), resp.token_ids().begin(), resp.token_ids().end());
    const grpc::Status st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(got, want) << "round " << round;
  }
  std::printf("after the junk: 2 requests through the router, 48 tokens, equal to full-KV decoding\n");
}

}  // namespace
}  // namespace vc
