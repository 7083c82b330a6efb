// A RocksDB filesystem whose file writes fail on demand, as a full or failing disk's do, for tests of
// the disk tier and the store (FailingDisk: one with its environment, for DiskTierOptions::env).
#ifndef VC_TESTS_TESTING_FAILING_FS_H_
#define VC_TESTS_TESTING_FAILING_FS_H_

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

namespace vc::testing {

class FailingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  enum class Fault { kNone, kNoSpace, kIoError };

  explicit FailingFileSystem(std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default())
      : FileSystemWrapper(std::move(base)) {}
  const char* Name() const override { return "FailingFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* file,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> f;
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, &f, dbg);
    if (s.ok()) *file = std::make_unique<File>(std::move(f), this);
    return s;
  }

  // What every append to a file fails with from now on (kNone: nothing).
  std::atomic<Fault> fault{Fault::kNone};
  // With a fault, only appends of fewer bytes than this fail (0: every append): a log record of a
  // delete fails where one that carries a block does not.
  std::atomic<size_t> fault_below_bytes{0};

 private:
  rocksdb::IOStatus Check(size_t bytes) const {
    const size_t below = fault_below_bytes.load();
    if (below != 0 && bytes >= below) return rocksdb::IOStatus::OK();
    switch (fault.load()) {
      case Fault::kNoSpace: return rocksdb::IOStatus::NoSpace("the disk is full");
      case Fault::kIoError: return rocksdb::IOStatus::IOError("input/output error");
      case Fault::kNone: break;
    }
    return rocksdb::IOStatus::OK();
  }

  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, FailingFileSystem* fs)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (rocksdb::IOStatus s = fs_->Check(data.size()); !s.ok()) return s;
      return target()->Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info, rocksdb::IODebugContext* dbg) override {
      if (rocksdb::IOStatus s = fs_->Check(data.size()); !s.ok()) return s;
      return target()->Append(data, options, info, dbg);
    }

   private:
    FailingFileSystem* const fs_;
  };
};

// A FailingFileSystem and the RocksDB environment over it, for DiskTierOptions::env.
struct FailingDisk {
  std::shared_ptr<FailingFileSystem> fs = std::make_shared<FailingFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
};

}  // namespace vc::testing

#endif  // VC_TESTS_TESTING_FAILING_FS_H_
