// Read-only access to safetensors checkpoints, memory-mapped and validated on open.
#ifndef VC_WORKER_RUNTIME_SAFETENSORS_H_
#define VC_WORKER_RUNTIME_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"

namespace vc {

// A view of one tensor inside a mapped file. Valid while its SafetensorsFile lives.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;
  int64_t num_elements() const;
};

// One memory-mapped .safetensors file. Open() checks the whole header: its length, its JSON, every
// tensor's shape and byte range against the file; a file that passes can be read without bounds
// surprises. Immutable after Open() but for the aligned copies Get makes; thread-safe.
class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Returns the opened file, or kNotFound (missing file), kDataLoss (truncated or inconsistent
  // file) or kInvalidArgument (malformed header); each message names the file and the problem.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Returns the tensor, kNotFound if the file has none of that name, or kInvalidArgument if its
  // dtype is not one the runtime supports or `shape` is given and differs from its own.
  absl::StatusOr<TensorView> Get(absl::string_view name, const std::vector<int64_t>* shape = nullptr) const;

  bool Contains(absl::string_view name) const { return entries_.count(std::string(name)) > 0; }
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::string dtype_name;  // as written in the header
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // relative to the data section
  };
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> entries_;
  // Aligned copies of the tensors whose bytes in the file are not aligned to their element size,
  // made by Get.
  mutable absl::Mutex copies_mu_;
  mutable std::map<std::string, std::unique_ptr<uint64_t[]>> copies_ ABSL_GUARDED_BY(copies_mu_);
};

// The tensors of a checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json. Immutable after Open(); thread-safe.
class TensorStore {
 public:
  // Returns kNotFound if the directory holds neither file; other errors as SafetensorsFile::Open.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Open(const std::string& dir);

  // Returns the tensor if it exists with exactly `shape`; kNotFound or kInvalidArgument naming
  // the tensor otherwise.
  absl::StatusOr<TensorView> Get(absl::string_view name, const std::vector<int64_t>& shape) const;
  bool Contains(absl::string_view name) const;
  // The first tensor whose name starts with `prefix`, or "" when none does.
  std::string FirstWithPrefix(absl::string_view prefix) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> index_;
};

// The files of `dir` that TensorStore::Open reads, in name order: model.safetensors, or
// model.safetensors.index.json and each shard its weight_map names, once. (ModelFingerprint hashes
// them, so that two checkpoints which load different weights are never taken for one.)
absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir);

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_SAFETENSORS_H_
