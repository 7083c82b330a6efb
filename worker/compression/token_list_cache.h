// A compressed cache that keeps, per (layer, KV head), an ordered list of tokens: optionally
// chosen at build time by a PromptSelector (SnapKV), optionally KIVI-quantized (keys per channel
// over groups of `group` tokens, values per token over groups of channels; the most recent
// `residual`..`residual + group - 1` tokens stay in float32). Tokens appended after the build are
// all kept. With neither selection nor quantization it holds the full KV in float32.
//
// Quantized, it can also select per query (Quest over KIVI's key groups: `query_budget` > 0): a
// row reads only the budget / group quantized key groups whose keys can score highest against
// its query, by Quest's bound from the group's per-channel minimum and scale (the most a key of
// codes 0..2^bits - 1 can give), summed over the query heads of the KV head; ties go to the
// earlier group. Its float32 tokens are always read. Every token is still stored, so memory is
// KIVI's; what a step reads and computes is the budget's.
//
// What a query row sees is a function of the tokens before it alone: row p reads as quantized the
// tokens that a commit at length p would have quantized, whatever pass it arrives in. To let a
// truncation of up to `residual` positions restore exactly that view, the float32 copies of the
// tokens quantized within the last `residual` positions are kept next to their codes.
#ifndef VC_WORKER_COMPRESSION_TOKEN_LIST_CACHE_H_
#define VC_WORKER_COMPRESSION_TOKEN_LIST_CACHE_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/compression/compressed_cache.h"
#include "worker/runtime/sequence_slots.h"

namespace vc {

// Chooses which prompt positions each (layer, KV head) keeps when a cache is built.
class PromptSelector {
 public:
  virtual ~PromptSelector() = default;
  // kept[l][g]: increasing positions in [0, length) that layer l, KV head g keeps.
  virtual absl::StatusOr<std::vector<std::vector<std::vector<int32_t>>>> Select(
      const PagedKvCache& full, SeqId seq, int64_t length, const PromptQueries* queries, int num_heads) const = 0;
  virtual CompressorNeeds needs() const = 0;
  // The number of last prompt positions whose queries Select reads.
  virtual int64_t window() const { return 0; }
  // The most positions Select keeps per (layer, KV head) of a prompt of `length`.
  virtual int64_t MaxKept(int64_t length) const = 0;
  virtual std::string spec() const = 0;
};

struct KiviParams {
  int bits = 0;  // 0 (float32, no quantization), 2, 4 or 8
  int group = 32;
  int residual = 32;
};

class TokenListCache final : public CompressedKvCache, private KiviBlockCodec {
 public:
  // query_budget > 0 needs kivi.bits > 0 and no selector.
  TokenListCache(const KvLayout& layout, int num_heads, KiviParams kivi, std::unique_ptr<PromptSelector> selector,
                 int64_t query_budget = 0);

  SeqId NewSequence() override;
  SeqId Fork(SeqId seq) override { return seqs_.Copy(seq); }
  void FreeSequence(SeqId seq) override;
  absl::Status BuildFrom(SeqId seq, const PagedKvCache& full, SeqId full_seq, int64_t length,
                         const PromptQueries* queries) override;
  int64_t Bytes(SeqId seq) const override;
  int64_t BytesBound(int64_t built, int64_t length) const override;
  // The residual (quantized) or unlimited (float32: 1 << 30).
  int64_t MaxRollback() const override;
  CompressorNeeds needs() const override;
  int64_t prompt_query_window() const override { return selector_ != nullptr ? selector_->window() : 0; }
  std::string spec() const override;
  // KIVI without token selection: blocks of whole key groups. Null otherwise.
  KiviBlockCodec* block_codec() override { return HasBlockForm() ? this : nullptr; }
  const KiviBlockCodec* block_codec() const override { return HasBlockForm() ? this : nullptr; }

  int64_t Length(SeqId seq) const override { return seqs_[seq].length; }
  absl::Status Reserve(SeqId seq, int64_t length) override;
  void Write(int layer, SeqId seq, int64_t pos, const float* k, const float* v) override;
  void Attend(int layer, absl::Span<const QueryRow> rows, const float* q, int num_heads, float scale,
              const kernels::Backend& backend, float* out) override;
  void Commit(SeqId seq, int64_t length) override;
  absl::Status Truncate(SeqId seq, int64_t length) override;

 private:
  // KiviBlockCodec, reached through block_codec() only.
  bool HasBlockForm() const { return selector_ == nullptr && kivi_.bits != 0; }
  KiviBlockFormat format() const override { return {kivi_.bits, kivi_.group}; }
  absl::Status EncodeBlock(const PagedKvCache& full, SeqId full_seq, int64_t first, int64_t tokens,
                           std::vector<std::string>* layers) const override;
  absl::Status AppendBlock(SeqId seq, int64_t tokens, const std::vector<absl::string_view>& layers) override;
  absl::Status CutTo(SeqId seq, int64_t length) override;

  struct HeadList {
    std::vector<int32_t> positions;  // of every token; empty when every position is kept
    int32_t q_tokens = 0;            // quantized tokens (the oldest)
    int32_t f_start = 0;             // first token held in float32; <= q_tokens
    int32_t appended = 0;            // leading tokens from AppendBlock: quantized, never in float32
    std::vector<uint8_t> k_codes, v_codes;
    std::vector<float> k_scale, k_min, v_scale, v_min;
    std::vector<float> res_k, res_v;  // float32 tokens [f_start, Tokens): [n, head_dim]
  };
  struct Sequence {
    bool selective = false;  // positions are stored explicitly
    int64_t length = 0;
    std::vector<HeadList> heads;  // [layer * num_kv_heads + g]
  };
  int32_t Tokens(const HeadList& h) const;
  // Number of tokens of h at positions <= pos.
  int32_t VisibleCount(const Sequence& s, const HeadList& h, int64_t pos) const;
  // Quantized tokens of a head holding n tokens (a commit quantizes that many).
  int32_t QuantizedCount(int64_t n) const;
  void Append(HeadList& h, bool selective, int64_t pos, const float* k, const float* v);
  // Drops h's codes and scales past its first q quantized tokens (q <= q_tokens).
  void KeepQuantized(int32_t q, HeadList* h) const;
  // Quantizes the group of tokens that follows the quantized ones; their float32 copies stay.
  void QuantizeNextGroup(HeadList& h);
  // Quantizes one group of tokens (k, v: [group, head_dim]) and appends its codes and scales to
  // h's (q_tokens is the caller's).
  void QuantizeGroup(const float* k, const float* v, HeadList* h) const;
  // QuantizeGroup for positions [first, first + tokens) (whole groups) of KV head `head` of
  // `layer` of `full_seq` in `full`.
  void QuantizeFromFull(const PagedKvCache& full, SeqId full_seq, int layer, int head, int64_t first, int64_t tokens,
                        HeadList* h) const;
  // Bytes of one KV head's share of an encoded block of `tokens` positions, and its parts.
  struct BlockParts {
    size_t codes, k_scales, v_scales;
    // All of one KV head's share: K and V codes, and each one's scales and minimums.
    size_t head() const { return 2 * (codes + k_scales + v_scales); }
  };
  BlockParts Parts(int64_t tokens) const;
  // With a query budget: points `view` at the key groups the query heads q [heads, head_dim] of
  // its KV head would score highest, their stored indices written to `table` (room for the
  // budget's groups). Unchanged when the budget covers every quantized group.
  struct SelectScratch {
    std::vector<float> query;  // per channel: the heads' sum and their positive parts' sum
    std::vector<float> scores, order;
  };
  void SelectGroups(const float* q, int heads, kernels::QuantizedKvHead* view, int32_t* table,
                    SelectScratch* scratch) const;

  const KvLayout layout_;
  const int num_heads_;
  const KiviParams kivi_;
  const int value_group_;
  const std::unique_ptr<PromptSelector> selector_;
  const int64_t query_budget_;
  SequenceSlots<Sequence> seqs_;
  std::vector<int32_t> iota_;                       // row indices 0..n for dense views
  std::vector<kernels::CompressedKvHead> views_;    // scratch for Attend
  std::vector<int32_t> group_tables_;               // scratch for Attend: selected key groups
  std::vector<SelectScratch> select_scratch_;       // scratch for Attend: one per view
};

}  // namespace vc

#endif  // VC_WORKER_COMPRESSION_TOKEN_LIST_CACHE_H_
