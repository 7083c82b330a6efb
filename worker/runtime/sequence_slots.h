// Per-sequence state of a cache, indexed by SeqId; released ids are handed out again.
#ifndef VC_WORKER_RUNTIME_SEQUENCE_SLOTS_H_
#define VC_WORKER_RUNTIME_SEQUENCE_SLOTS_H_

#include <vector>

#include "worker/runtime/attention_cache.h"

namespace vc {

// Not thread-safe (owned by one cache).
template <typename T>
class SequenceSlots {
 public:
  // A live id whose state is a fresh T.
  SeqId Add() {
    SeqId id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<SeqId>(slots_.size());
      slots_.emplace_back();
      live_.push_back(false);
    }
    slots_[id] = T{};
    live_[id] = true;
    return id;
  }
  // A live id whose state is a copy of `src`'s (which must be live).
  SeqId Copy(SeqId src) {
    const SeqId id = Add();
    slots_[id] = slots_[src];
    return id;
  }
  bool live(SeqId id) const { return id >= 0 && id < static_cast<SeqId>(slots_size()) && live_[id]; }
  // Drops `id`'s state and frees the id; no-op for an id that is not live.
  void Remove(SeqId id) {
    if (!live(id)) return;
    slots_[id] = T{};
    live_[id] = false;
    free_.push_back(id);
  }
  T& operator[](SeqId id) { return slots_[id]; }
  const T& operator[](SeqId id) const { return slots_[id]; }

 private:
  size_t slots_size() const { return slots_.size(); }
  std::vector<T> slots_;
  std::vector<bool> live_;
  std::vector<SeqId> free_;
};

}  // namespace vc

#endif  // VC_WORKER_RUNTIME_SEQUENCE_SLOTS_H_
