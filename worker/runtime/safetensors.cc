#include "worker/runtime/safetensors.h"

#include <algorithm>
#include <tuple>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vc {
namespace {

using json = nlohmann::json;

// A header names each tensor in about a hundred bytes: a checkpoint of thousands of tensors has a
// header of a megabyte or less. The parsed JSON takes about 20 times its text.
constexpr uint64_t kMaxHeaderBytes = 16u << 20;
constexpr uint64_t kMaxIndexBytes = 16u << 20;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

}  // namespace

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one (and is
  // then refused as not a regular file); it changes nothing for the mapping of a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::UnavailableError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Bad(path, "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": truncated (", file_size,
                                            " bytes; a safetensors file starts with 8)"));
  }
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = file_size;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header length ", header_len, " is more than the ", kMaxHeaderBytes, " bytes allowed"));
  }
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header of ", header_len,
                                            " bytes but the file has ", file_size - 8, " after it"));
  }
  const uint64_t data_size = file_size - 8 - header_len;
  f->data_ = bytes + 8 + header_len;

  const absl::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);
  if (absl::Status checked = CheckJsonText(header_text, 16); !checked.ok()) return Bad(path, checked.message());
  json header = json::parse(header_text.begin(), header_text.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(path, "header is not valid JSON");
  if (!header.is_object()) return Bad(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& t = it.value();
    auto bad = [&](absl::string_view what) { return Bad(path, absl::StrCat("tensor '", name, "': ", what)); };
    if (!t.is_object()) return bad("entry is not an object");
    auto dt = t.find("dtype");
    auto sh = t.find("shape");
    auto off = t.find("data_offsets");
    if (dt == t.end() || !dt->is_string()) return bad("missing dtype");
    if (sh == t.end() || !sh->is_array()) return bad("missing shape");
    if (off == t.end() || !off->is_array() || off->size() != 2) return bad("missing data_offsets");
    Entry e;
    e.dtype_name = dt->get<std::string>();
    uint64_t elements = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape has a non-integer or negative dimension");
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v != 0 && elements > (1ull << 48) / v)) return bad("shape is too large");
      elements *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return bad("data_offsets are not non-negative integers");
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': data_offsets [", e.begin,
                                              ", ", e.end, ") outside the ", data_size,
                                              "-byte data section (truncated file?)"));
    }
    auto parsed = ParseDType(e.dtype_name);
    if (parsed.ok() && e.end - e.begin != elements * DTypeSize(*parsed)) {
      return bad(absl::StrCat("shape ", ShapeString(e.shape), " of ", e.dtype_name, " needs ",
                              elements * DTypeSize(*parsed), " bytes but data_offsets span ",
                              e.end - e.begin));
    }
    f->entries_.emplace(name, std::move(e));
  }
  // Tensors may not share bytes: a header pointing two at one range describes no real checkpoint.
  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> spans;  // begin, end, name
  for (const auto& [name, e] : f->entries_) {
    if (e.end > e.begin) spans.emplace_back(e.begin, e.end, &name);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const auto& [begin, end, name] = spans[i];
    const auto& [prev_begin, prev_end, prev_name] = spans[i - 1];
    if (begin < prev_end) {
      return Bad(path, absl::StrCat("tensors '", *prev_name, "' and '", *name, "' overlap in the data section"));
    }
  }
  return f;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(absl::string_view name, const std::vector<int64_t>* shape) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const Entry& e = it->second;
  if (shape != nullptr && e.shape != *shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ", ShapeString(e.shape),
                                                   ", the config implies ", ShapeString(*shape)));
  }
  auto dtype = ParseDType(e.dtype_name);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "': ", dtype.status().message()));
  }
  TensorView v;
  v.dtype = *dtype;
  v.shape = e.shape;
  v.data = data_ + e.begin;
  v.size_bytes = e.end - e.begin;
  // The format does not align tensors; one whose bytes are not aligned to its element size is
  // copied out when first asked for (never at Open, so a tensor no one reads costs nothing), so
  // that every reader may take its elements through typed pointers.
  if (reinterpret_cast<uintptr_t>(v.data) % DTypeSize(*dtype) != 0) {
    absl::MutexLock lock(&copies_mu_);
    std::unique_ptr<uint64_t[]>& copy = copies_[it->first];
    if (copy == nullptr) {
      copy.reset(new (std::nothrow) uint64_t[(v.size_bytes + 7) / 8]);
      if (copy == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(path_, ": tensor '", name, "': no memory for an aligned copy of its ",
                                                         v.size_bytes, " bytes"));
      }
      std::memcpy(copy.get(), v.data, v.size_bytes);
    }
    v.data = reinterpret_cast<const uint8_t*>(copy.get());
  }
  return v;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

namespace {

// Where a checkpoint directory's tensors are: model.safetensors alone (an empty weight map), or
// the shards model.safetensors.index.json names for them (tensor -> shard file name).
struct CheckpointLayout {
  bool single = false;
  std::vector<std::pair<std::string, std::string>> weight_map;
};

absl::StatusOr<CheckpointLayout> ReadCheckpointLayout(const std::string& dir) {
  CheckpointLayout layout;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  struct stat st;
  if (stat(single.c_str(), &st) == 0) {
    layout.single = true;
    return layout;
  }
  if (errno != ENOENT) {  // a link loop, a directory without search permission: say so
    return absl::InvalidArgumentError(absl::StrCat(single, ": cannot stat: ", std::strerror(errno)));
  }
  absl::StatusOr<std::string> text = ReadFileLimited(index_path, kMaxIndexBytes, "safetensors index");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  if (!text.ok()) return text.status();
  if (absl::Status checked = CheckJsonText(*text, 16); !checked.ok()) return Bad(index_path, checked.message());
  json index = json::parse(*text, nullptr, false);
  if (index.is_discarded() || !index.is_object()) return Bad(index_path, "not valid JSON");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return Bad(index_path, "no weight_map object");
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return Bad(index_path, absl::StrCat("shard of '", it.key(), "' is not a string"));
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\0') != std::string::npos ||
        shard == "..") {
      return Bad(index_path, absl::StrCat("shard name '", shard, "' is not a file in the directory"));
    }
    layout.weight_map.emplace_back(it.key(), shard);
  }
  return layout;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir) {
  VC_ASSIGN_OR_RETURN(CheckpointLayout layout, ReadCheckpointLayout(dir));
  if (layout.single) return std::vector<std::string>{"model.safetensors"};
  std::vector<std::string> files = {"model.safetensors.index.json"};
  for (const auto& [tensor, shard] : layout.weight_map) files.push_back(shard);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(const std::string& dir) {
  auto store = std::make_unique<TensorStore>();
  VC_ASSIGN_OR_RETURN(CheckpointLayout layout, ReadCheckpointLayout(dir));
  if (layout.single) {
    VC_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/model.safetensors"));
    for (const std::string& n : f->names()) store->index_[n] = f.get();
    store->files_.push_back(std::move(f));
    return store;
  }
  std::map<std::string, const SafetensorsFile*> by_shard;
  for (const auto& [tensor, shard] : layout.weight_map) {
    auto found = by_shard.find(shard);
    if (found == by_shard.end()) {
      VC_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + shard));
      found = by_shard.emplace(shard, f.get()).first;
      store->files_.push_back(std::move(f));
    }
    if (!found->second->Contains(tensor)) {
      return absl::NotFoundError(absl::StrCat(dir, "/model.safetensors.index.json: tensor '", tensor,
                                              "' is not in shard ", shard));
    }
    store->index_[tensor] = found->second;
  }
  return store;
}

bool TensorStore::Contains(absl::string_view name) const { return index_.find(name) != index_.end(); }

std::string TensorStore::FirstWithPrefix(absl::string_view prefix) const {
  const auto it = index_.lower_bound(prefix);
  return it != index_.end() && absl::StartsWith(it->first, prefix) ? it->first : std::string();
}

absl::StatusOr<TensorView> TensorStore::Get(absl::string_view name,
                                            const std::vector<int64_t>& shape) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
  }
  return it->second->Get(name, &shape);
}

}  // namespace vc
