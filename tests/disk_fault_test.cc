// The disk tier under faults of its disk, on real files: a small filesystem that fills (tmpfs in a
// mount namespace of this test's own), and files damaged while the tier was closed. What each test
// asks: the tier takes puts again by itself, within 60 s, with no restart, and never returns bytes
// other than those put.
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/tiers.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/blocks.h"
#include "tests/testing/small_fs.h"
#include "tests/testing/tiny_model.h"

namespace vc::cachestore {
namespace {

absl::Status* mounts = nullptr;  // whether small filesystems can be made (set in main)

constexpr uint64_t kMiB = uint64_t{1} << 20;

BlockKey Key(int i) {
  BlockKey k;
  k.bytes = Sha256(absl::StrCat("block ", i));
  return k;
}

// A block of n bytes that differs from every other block in each of its 4 KiB pages.
std::string Block(int i, size_t n) {
  std::string b(n, static_cast<char>('a' + i % 26));
  for (size_t at = 0; at + 4 <= n; at += 4096) std::memcpy(&b[at], &i, 4);
  return b;
}

std::string SmallFilesystemOrSkip(const std::string& name, uint64_t bytes) {
  if (!mounts->ok()) return "";
  absl::StatusOr<std::string> dir = vc::testing::SmallFilesystem(name, bytes);
  return dir.ok() ? *dir : "";
}

// Reads blocks [0, n) of `size` bytes: each is what was put, or missing, or reported lost; never
// other bytes. Returns how many read back whole.
int ReadBack(DiskTier& t, int n, size_t size) {
  int whole = 0;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::string> got = t.Get(Key(i));
    if (got.ok()) {
      EXPECT_TRUE(*got == Block(i, size)) << "block " << i << " came back with other bytes";
      ++whole;
    } else {
      EXPECT_TRUE(absl::IsNotFound(got.status()) || absl::IsDataLoss(got.status())) << got.status();
    }
  }
  return whole;
}

// Puts blocks from `first` until `want` puts in a row succeed, for at most `limit`. Returns the
// time from the first failed put to the last failure's end (zero when none failed), or
// InfiniteDuration if puts still fail at the limit; `failed` counts the failed puts.
absl::Duration PutUntilHealed(DiskTier& t, int first, size_t size, int want, absl::Duration limit, int* failed,
                              int* end = nullptr) {
  const absl::Duration start = SteadyClock()->Now();
  absl::Duration first_failure = absl::InfiniteDuration(), healed = absl::ZeroDuration();
  int streak = 0;
  for (int i = first; streak < want; ++i) {
    if (end != nullptr) *end = i + 1;
    const absl::Duration now = SteadyClock()->Now();
    if (now - start > limit) return absl::InfiniteDuration();
    if (t.Put(Key(i), Block(i, size)).ok()) {
      ++streak;
      continue;
    }
    ++*failed;
    streak = 0;
    if (first_failure == absl::InfiniteDuration()) first_failure = now;
    healed = SteadyClock()->Now() - first_failure;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return healed;
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs fs;
  return statvfs(dir.c_str(), &fs) == 0 ? static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize : 0;
}

// What a store of a 32 MiB budget on a 64 MiB filesystem, keeping 16 MiB free, went through
// before its write-ahead log filled the filesystem after 79 puts: 200 puts of 786 KB (five times
// the budget) all succeed, and the files stay within the budget.
TEST(DiskFaults, FilesStayWithinTheBudgetOnASmallFilesystem) {
  const std::string dir = SmallFilesystemOrSkip("fault_budget", 64 * kMiB);
  if (dir.empty()) GTEST_SKIP() << "no small filesystem: " << *mounts;
  DiskTierOptions o{dir, 32 * kMiB, false};
  o.reserve_bytes = 16 * kMiB;
  o.maintain_every_ms = 100;
  auto t = DiskTier::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  constexpr size_t kBlock = 786432;
  uint64_t peak = 0;
  for (int i = 0; i < 200; ++i) {
    const absl::Status put = (*t)->Put(Key(i), Block(i, kBlock));
    ASSERT_TRUE(put.ok()) << "put " << i << ": " << put;
    peak = std::max(peak, (*t)->footprint_bytes());
  }
  std::printf("files at most %.1f MiB for a budget of 32 MiB; %zu blocks held, %.1f MiB\n",
              static_cast<double>(peak) / kMiB, (*t)->blocks(), static_cast<double>((*t)->used_bytes()) / kMiB);
  EXPECT_LE(peak, 40 * kMiB);  // the budget, and what is put between two looks at the files
  EXPECT_GE((*t)->used_bytes(), 16 * kMiB);  // the budget goes to blocks, not only to files
  for (int i = 190; i < 200; ++i) EXPECT_EQ(*(*t)->Get(Key(i)), Block(i, kBlock)) << i;
}

// The disk fills up (here with a file of someone else's) and puts fail; once the file is deleted,
// puts succeed again within 60 s, with no reopen, and reads went on throughout.
TEST(DiskFaults, PutsResumeOnceAFullDiskHasRoom) {
  const std::string dir = SmallFilesystemOrSkip("fault_full", 64 * kMiB);
  if (dir.empty()) GTEST_SKIP() << "no small filesystem: " << *mounts;
  DiskTierOptions o{dir + "/db", 32 * kMiB, false};
  o.reserve_bytes = 0;
  o.maintain_every_ms = 100;
  auto t = DiskTier::Open(o);
  ASSERT_TRUE(t.ok()) << t.status();
  constexpr size_t kBlock = 786432;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i, kBlock)).ok());
  {
    std::ofstream ballast(dir + "/ballast", std::ios::binary);
    const std::string mib(kMiB, 'x');
    while (FreeBytes(dir) > 0 && ballast.write(mib.data(), mib.size())) {
    }
  }
  int failed = 0;
  for (int i = 8; i < 40 && failed == 0; ++i) failed += !(*t)->Put(Key(i), Block(i, kBlock)).ok();
  ASSERT_GT(failed, 0) << "the full disk never failed a put";
  EXPECT_TRUE((*t)->write_failure().no_space);
  EXPECT_EQ(*(*t)->Get(Key(0)), Block(0, kBlock));
  std::filesystem::remove(dir + "/ballast");
  const absl::Duration took = PutUntilHealed(**t, 100, kBlock, 20, absl::Seconds(60), &failed);
  ASSERT_NE(took, absl::InfiniteDuration()) << "puts still fail 60 s after the disk has room";
  std::printf("puts succeed again %.1f s after the disk had room\n", absl::ToDoubleSeconds(took));
  EXPECT_EQ((*t)->reopens(), 0u);
  EXPECT_EQ((*t)->resets(), 0u);
}

// A 256 MiB tier in `dir` with small memtables and blob files (many files to damage), its
// maintainer every `maintain_every_ms` (0: none).
DiskTierOptions ManyFiles(const std::string& dir, int64_t maintain_every_ms) {
  DiskTierOptions o{dir, 256 * kMiB, false};
  o.memtable_bytes = kMiB;
  o.blob_file_bytes = kMiB;
  o.maintain_every_ms = maintain_every_ms;
  return o;
}

// Writes blocks [0, n) of `size` bytes to a tier in `dir` and closes it.
void WriteBlocks(const std::string& dir, int n, size_t size) {
  auto t = DiskTier::Open(ManyFiles(dir, 0));
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < n; ++i) ASSERT_TRUE((*t)->Put(Key(i), Block(i, size)).ok());
}

// Flips `bytes` bytes in the middle of each file in `dir` whose name ends in `ext`; how many files.
int Damage(const std::string& dir, const std::string& ext, int bytes) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ext || std::filesystem::file_size(e.path()) < 64) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff at = static_cast<std::streamoff>(std::filesystem::file_size(e.path()) / 2);
    for (int i = 0; i < bytes; ++i) {
      f.seekg(at + i);
      const int c = f.get();
      f.seekp(at + i);
      f.put(static_cast<char>(c ^ 0x10));
    }
    ++files;
  }
  return files;
}

// A tier over damaged files, as a store restarted after the damage opens it: takes puts (which
// start compactions that meet the damage) until 200 in a row succeed, within 60 s and without a
// restart; every read returns the bytes put or an error.
void HealsFrom(const std::string& dir, int written, size_t size) {
  auto t = DiskTier::Open(ManyFiles(dir, 100));
  ASSERT_TRUE(t.ok()) << t.status();
  const int whole_before = ReadBack(**t, written, size);
  int failed = 0;
  int end = 0;
  const absl::Duration took = PutUntilHealed(**t, 1000, size, 200, absl::Seconds(60), &failed, &end);
  ASSERT_NE(took, absl::InfiniteDuration()) << "puts still fail after 60 s";
  const int whole_after = ReadBack(**t, written, size);
  std::printf("%d of %d blocks read whole after the damage, %d after healing; %d puts failed, for %.1f s; "
              "%llu reopens, %llu databases dropped\n",
              whole_before, written, whole_after, failed, absl::ToDoubleSeconds(took),
              static_cast<unsigned long long>((*t)->reopens()), static_cast<unsigned long long>((*t)->resets()));
  for (int i = end - 10; i < end; ++i) EXPECT_EQ(*(*t)->Get(Key(i)), Block(i, size));
  EXPECT_EQ((*t)->write_failure().duration, absl::ZeroDuration());
}

TEST(DiskFaults, CorruptBlobFilesCostTheirBlocksNotTheAbilityToCache) {
  const std::string dir = vc::testing::TempDir("fault_blob");
  WriteBlocks(dir, 300, 64 << 10);
  const int files = Damage(dir, ".blob", 1);
  ASSERT_GT(files, 4);
  std::printf("one byte flipped in each of %d blob files\n", files);
  HealsFrom(dir, 300, 64 << 10);
}

TEST(DiskFaults, ACorruptSstFileCostsItsBlocksNotTheAbilityToCache) {
  const std::string dir = vc::testing::TempDir("fault_sst");
  WriteBlocks(dir, 300, 64 << 10);
  ASSERT_GT(Damage(dir, ".sst", 4), 0);
  HealsFrom(dir, 300, 64 << 10);
}

TEST(DiskFaults, ACorruptManifestCostsTheBlocksNotTheAbilityToCache) {
  const std::string dir = vc::testing::TempDir("fault_manifest");
  WriteBlocks(dir, 50, 64 << 10);
  int damaged = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("MANIFEST", 0) != 0) continue;
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  HealsFrom(dir, 50, 64 << 10);
}

// A write-ahead log damaged after a crash (the process died with blocks in its memtable).
TEST(DiskFaults, ACorruptWriteAheadLogCostsItsBlocksNotTheAbilityToCache) {
  const std::string dir = vc::testing::TempDir("fault_wal");
  WriteBlocks(dir, 20, 64 << 10);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiskTierOptions o{dir, 256 * kMiB, false};
    o.maintain_every_ms = 0;
    auto t = DiskTier::Open(o);  // a 8 MiB memtable: the 10 blocks stay in the log
    for (int i = 20; t.ok() && i < 30; ++i) (void)(*t)->Put(Key(i), Block(i, 64 << 10));
    std::_Exit(0);  // no close: the log is what holds them
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_GT(Damage(dir, ".log", 64), 0);
  HealsFrom(dir, 30, 64 << 10);
}

}  // namespace
}  // namespace vc::cachestore

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  static absl::Status entered = vc::testing::EnterPrivateMounts();
  vc::cachestore::mounts = &entered;
  return RUN_ALL_TESTS();
}
