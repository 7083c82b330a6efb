// The CPU device: copies and host functions run in stream order, an event orders two streams (a
// copy stream filling a buffer while the compute stream works, the compute stream's next item
// waiting for it), errors are kept and reported, and many threads may queue at once.
#include "kernels/device.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vc::device {
namespace {

using std::chrono::milliseconds;

std::vector<int> Ints(const Buffer& b) {
  std::vector<int> v(b.bytes() / sizeof(int));
  std::memcpy(v.data(), b.data(), b.bytes());
  return v;
}

TEST(CpuDevice, CopiesRunInOrderAndStayInBounds) {
  auto device = NewCpuDevice();
  EXPECT_EQ(device->name(), "cpu");
  auto host = device->Allocate(16 * sizeof(int), MemoryKind::kPinnedHost);
  auto dev = device->Allocate(16 * sizeof(int), MemoryKind::kDevice);
  auto back = device->Allocate(16 * sizeof(int), MemoryKind::kPinnedHost);
  ASSERT_TRUE(host.ok() && dev.ok() && back.ok());
  EXPECT_EQ(Ints(*dev), std::vector<int>(16, 0));  // zeroed
  for (int i = 0; i < 16; ++i) static_cast<int*>(host->data())[i] = i;
  auto stream = device->NewStream();
  ASSERT_TRUE(stream.ok());
  Stream& s = **stream;
  // Host to device, then device to host in two halves swapped: each runs after the one before.
  ASSERT_TRUE(s.CopyAsync(*dev, 0, *host, 0, host->bytes()).ok());
  ASSERT_TRUE(s.CopyAsync(*back, 0, *dev, 8 * sizeof(int), 8 * sizeof(int)).ok());
  ASSERT_TRUE(s.CopyAsync(*back, 8 * sizeof(int), *dev, 0, 8 * sizeof(int)).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  std::vector<int> want;
  for (int i = 8; i < 16; ++i) want.push_back(i);
  for (int i = 0; i < 8; ++i) want.push_back(i);
  EXPECT_EQ(Ints(*back), want);
  // Out of bounds on either side: refused at once, nothing queued.
  EXPECT_EQ(s.CopyAsync(*dev, 1, *host, 0, host->bytes()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.CopyAsync(*dev, 0, *host, host->bytes() + 1, 0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.CopyAsync(*dev, 0, *host, 4, SIZE_MAX).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(s.Synchronize().ok());
}

// The swap-in pattern: a copy stream fills the full KV while the compute stream drafts, and the
// verify item waits for the copy's event. The draft runs while the copy is still going (they
// overlap), and the verify item sees every byte of the copy.
TEST(CpuDevice, AnEventOrdersTwoStreamsThatOverlap) {
  auto device = NewCpuDevice();
  auto staged = device->Allocate(1 << 20, MemoryKind::kPinnedHost);
  auto full_kv = device->Allocate(1 << 20, MemoryKind::kDevice);
  ASSERT_TRUE(staged.ok() && full_kv.ok());
  std::memset(staged->data(), 7, staged->bytes());
  auto copy = device->NewStream();
  auto compute = device->NewStream();
  auto arrived = device->NewEvent();
  ASSERT_TRUE(copy.ok() && compute.ok() && arrived.ok());
  EXPECT_TRUE((*arrived)->Done());  // never recorded
  std::atomic<bool> drafted{false}, copy_saw_draft{false}, verified{false};
  // The copy stream's first item holds the copy back until the draft has run (for up to 5 s): it
  // can only see the draft if the two streams run at once.
  ASSERT_TRUE((*copy)->HostAsync([&] {
    for (int i = 0; i < 500 && !drafted; ++i) std::this_thread::sleep_for(milliseconds(10));
    copy_saw_draft = drafted.load();
    return absl::OkStatus();
  }).ok());
  ASSERT_TRUE((*copy)->CopyAsync(*full_kv, 0, *staged, 0, staged->bytes()).ok());
  ASSERT_TRUE((*copy)->Record(**arrived).ok());
  EXPECT_FALSE((*arrived)->Done());
  ASSERT_TRUE((*compute)->HostAsync([&] {
    drafted = true;
    return absl::OkStatus();
  }).ok());
  ASSERT_TRUE((*compute)->Wait(**arrived).ok());
  ASSERT_TRUE((*compute)->HostAsync([&] {
    const auto* p = static_cast<const unsigned char*>(full_kv->data());
    for (size_t i = 0; i < full_kv->bytes(); ++i) {
      if (p[i] != 7) return absl::DataLossError("the verify item ran before the copy ended");
    }
    verified = true;
    return absl::OkStatus();
  }).ok());
  EXPECT_TRUE((*compute)->Synchronize().ok());
  EXPECT_TRUE(verified);
  EXPECT_TRUE(copy_saw_draft);
  EXPECT_TRUE((*arrived)->Done());
  EXPECT_TRUE((*arrived)->Synchronize().ok());
}

TEST(CpuDevice, ErrorsAreKeptAndLaterWorkStillRuns) {
  auto device = NewCpuDevice();
  auto stream = device->NewStream();
  auto event = device->NewEvent();
  ASSERT_TRUE(stream.ok() && event.ok());
  std::atomic<int> ran{0};
  ASSERT_TRUE((*stream)->HostAsync([&] { return ran++, absl::InternalError("kernel 1 failed"); }).ok());
  ASSERT_TRUE((*stream)->HostAsync([&] { return ran++, absl::InternalError("kernel 2 failed"); }).ok());
  ASSERT_TRUE((*stream)->Record(**event).ok());
  ASSERT_TRUE((*stream)->HostAsync([&] { return ran++, absl::OkStatus(); }).ok());
  const absl::Status s = (*stream)->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "kernel 1 failed");  // the first
  EXPECT_EQ((*event)->Synchronize().message(), "kernel 1 failed");
  EXPECT_EQ(ran, 3);
}

TEST(CpuDevice, ManyThreadsQueueOnOneStream) {
  auto device = NewCpuDevice();
  auto stream = device->NewStream();
  ASSERT_TRUE(stream.ok());
  std::atomic<int> sum{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        EXPECT_TRUE((*stream)->HostAsync([&sum, t] { return sum += t, absl::OkStatus(); }).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(sum, 1000 * (0 + 1 + 2 + 3 + 4 + 5 + 6 + 7));
  // A stream that goes runs what it holds first.
  std::atomic<bool> ran{false};
  ASSERT_TRUE((*stream)->HostAsync([&] {
    std::this_thread::sleep_for(milliseconds(20));
    ran = true;
    return absl::OkStatus();
  }).ok());
  stream->reset();
  EXPECT_TRUE(ran);
}

// Without a driver (this build machine) the CUDA device is unavailable, with the runtime's reason.
TEST(CudaDevice, UnavailableWithoutADriverOrNotFoundPastTheLast) {
  auto cuda = NewCudaDevice(0);
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->name(), "cuda:0");
    EXPECT_EQ(NewCudaDevice(1 << 20).status().code(), absl::StatusCode::kNotFound);
    return;
  }
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable) << cuda.status();
  EXPECT_FALSE(cuda.status().message().empty());
}

}  // namespace
}  // namespace vc::device
