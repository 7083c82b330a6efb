// H2O (Zhang et al., 2023): each (sequence, layer, KV head) keeps the "heavy hitters", the tokens
// that have received the most attention so far, plus a window of recent tokens, in float32.
//
// The process, per (layer, KV head), with R = rollback, is H2O run R rows late:
//  - A token's score is the sum of the attention weights it received (summed over the query heads
//    of its KV head's group) from the queries of later rows. A query is counted only once it is
//    more than R positions old: the row at position p sees the scores of the queries before p - R.
//    A query that a truncation may still remove has influenced nothing, which is what makes
//    rollback exact without undoing float sums.
//  - Counting the query at q is H2O's step after q: the tokens at positions <= q + 1 - recent are
//    candidates, and while more than `heavy` of them are kept the one with the lowest score (ties:
//    the older) is evicted for good. Row p thus reads the heavy hitters, the `recent` positions
//    that were recent R rows ago, and the R positions since: at most heavy + recent + R tokens.
//    With heavy + recent >= p + 1 nothing is evicted and row p reads every position.
//  - Counts may be fixed ("heavy=", "recent=") or fractions of the position of H2O's step
//    ("heavy_ratio=", "recent_ratio="; the default is 0.1 and 0.1, the setting of the paper).
//  - BuildFrom takes H2O's step at the prompt's end: it keeps the last recent - 1 positions and
//    the best `heavy` of the others. With PromptQueries, the scores start as the attention the
//    recorded prompt queries (over the whole causal prompt) give each position, and "best" is by
//    score. Without queries there is no attention to go by: the heavy hitters are then the
//    positions with the largest key norms (a proxy: keys with large norms tend to draw attention,
//    e.g. attention sinks), and all scores start at zero so that later queries decide what stays.
//  - K/V appended with Write but never attended from (a verify pass writing exact K/V) bring no
//    query: only their tokens count.
//
// Storage: kept tokens (K, V, position, score). The stored scores and evictions count only the
// queries more than 2R positions old, so that the view of any length a rollback may return to can
// be rebuilt from them. For each newer query: its vectors and softmax max and sum, from which its
// weights are recomputed bitwise when it is counted. And the view of the latest row (scores and
// evictions on top of the stored ones), which the next row extends by one query. All of it counts
// in Bytes().
#ifndef VC_WORKER_COMPRESSION_H2O_CACHE_H_
#define VC_WORKER_COMPRESSION_H2O_CACHE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compression/compressed_cache.h"
#include "worker/runtime/sequence_slots.h"

namespace vc {

struct H2oParams {
  int64_t heavy = -1;  // heavy hitters kept; < 0: heavy_ratio of the row's position
  int64_t recent = -1;  // recent positions kept (>= 1); < 0: recent_ratio of the row's position
  double heavy_ratio = 0.1;
  double recent_ratio = 0.1;
  int rollback = 32;
};


// Not thread-safe. Rows of one sequence within an Attend call are handled in position order.
class H2oCache final : public CompressedKvCache {
 public:
  H2oCache(const KvLayout& layout, int num_heads, H2oParams params);

  SeqId NewSequence() override;
  SeqId Fork(SeqId seq) override { return seqs_.Copy(seq); }
  void FreeSequence(SeqId seq) override;
  // `queries`, when given, must end at `length` (kInvalidArgument otherwise); it may hold any
  // number of positions.
  absl::Status BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                         const PromptQueries* queries) override;
  int64_t Bytes(SeqId seq) const override;
  int64_t BytesBound(int64_t built, int64_t length) const override;
  // `rollback`, counted back from the longest length since the build; never into the prompt the
  // cache was built from (kFailedPrecondition).
  int64_t MaxRollback() const override { return params_.rollback; }
  CompressorNeeds needs() const override { return CompressorNeeds::kPastAttention; }
  // Initial scores come from the queries of the prompt's last positions.
  int64_t prompt_query_window() const override { return 32; }
  std::string spec() const override;

  int64_t Length(SeqId seq) const override { return seqs_[seq].length; }
  absl::Status Reserve(SeqId, int64_t) override { return absl::OkStatus(); }
  // Positions must arrive in increasing order after the sequence's length.
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override;
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  void Commit(SeqId seq, int64_t length) override;
  absl::Status Truncate(SeqId seq, int64_t length) override;

 private:
  struct PendingQuery {
    int64_t pos = 0;
    float scale = 0;
    std::vector<float> q;         // [group, head_dim]
    std::vector<float> max, sum;  // [group]: softmax max and sum of exp over the row's view
  };
  struct Head {
    std::vector<int32_t> pos;  // increasing
    std::vector<float> k, v;   // [n, head_dim]
    std::vector<float> score;  // queries before Sequence::counted counted
    std::deque<PendingQuery> pending;  // increasing pos, each >= Sequence::counted
    // The view of the latest row: queries before view_counted counted on top of `score`.
    bool view_valid = false;
    int64_t view_counted = 0;
    std::vector<float> view_score;
    std::vector<uint8_t> view_alive;
  };
  struct Sequence {
    int64_t length = 0;
    int64_t built = 0;    // length at BuildFrom; queries before it are in the built scores
    int64_t counted = 0;  // queries before it are counted into Head::score
    std::vector<Head> heads;  // [layer * num_kv_heads + g]
  };

  int64_t HeavyAt(int64_t t) const;
  int64_t RecentAt(int64_t t) const;
  // Counts the query at q (if it was attended) into score/alive and evicts as row q + R + 1 would.
  void CountQuery(const Head& h, int64_t q, std::vector<float>& score, std::vector<uint8_t>& alive) const;
  // Makes h's view count every query before `target`.
  void PrepareView(const Sequence& s, Head& h, int64_t target) const;
  // Removes the tokens whose alive flag is 0.
  static void Compact(Head& h, const std::vector<uint8_t>& alive, int d);

  const KvLayout layout_;
  const int num_heads_;
  const int group_;
  const H2oParams params_;
  SequenceSlots<Sequence> seqs_;
  std::vector<std::vector<int32_t>> row_lists_;  // scratch for Attend
  std::vector<kernels::CompressedKvHead> views_;
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_H2O_CACHE_H_
