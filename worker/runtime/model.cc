#include "worker/runtime/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/thread_pool.h"

namespace vc {
namespace {

// Element i of a tensor, as float.
float ElementAt(const TensorView& e, int64_t i) {
  switch (e.dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(e.data)[i];
    case DType::kBF16: return BF16ToF32(reinterpret_cast<const uint16_t*>(e.data)[i]);
    case DType::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(e.data)[i]);
  }
  return 0.0f;
}

// kDataLoss naming the tensor and the first element that is NaN or infinite: such a weight turns
// every logit into NaN, and generation into a run of token 0, with no other sign.
absl::Status CheckFinite(const std::string& name, const TensorView& v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(ElementAt(v, i))) {
      return absl::DataLossError(absl::StrCat("tensor '", name, "' holds a NaN or infinite value (element ", i, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::WeightView> Matrix(const TensorStore& t, const std::string& name, int64_t rows,
                                           int64_t cols) {
  VC_ASSIGN_OR_RETURN(TensorView v, t.Get(name, {rows, cols}));
  VC_RETURN_IF_ERROR(CheckFinite(name, v, rows * cols));
  return kernels::WeightView{v.data, v.dtype, rows, cols};
}

absl::StatusOr<std::vector<float>> Vector(const TensorStore& t, const std::string& name, int64_t n) {
  VC_ASSIGN_OR_RETURN(TensorView v, t.Get(name, {n}));
  VC_RETURN_IF_ERROR(CheckFinite(name, v, n));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = ElementAt(v, i);
  return out;
}

void AddBias(const std::vector<float>& bias, int64_t n, float* y) {
  if (bias.empty()) return;
  const int64_t d = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < d; ++i) y[r * d + i] += bias[i];
  }
}

}  // namespace

absl::StatusOr<std::optional<DType>> ParseKvDType(absl::string_view name) {
  if (name == "auto") return std::optional<DType>();
  if (name == "bf16") return std::optional<DType>(DType::kBF16);
  if (name == "f16") return std::optional<DType>(DType::kF16);
  if (name == "f32") return std::optional<DType>(DType::kF32);
  return absl::InvalidArgumentError(absl::StrCat("KV dtype '", name, "': expected auto, bf16, f16 or f32"));
}

absl::StatusOr<DType> ModelKvDType(const std::string& dir, std::optional<DType> asked) {
  if (asked.has_value()) return *asked;
  VC_ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(dir));
  if (c.torch_dtype.has_value()) return *c.torch_dtype;
  VC_ASSIGN_OR_RETURN(const std::unique_ptr<TensorStore> t, TensorStore::Open(dir));
  VC_ASSIGN_OR_RETURN(const TensorView embed,
                      t->Get("model.embed_tokens.weight", {c.vocab_size, int64_t{c.hidden_size}}));
  return embed.dtype;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const kernels::Backend* backend) {
  ModelOptions options;
  options.backend = backend;
  return Load(dir, options);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const ModelOptions& options) {
  // A bad VC_THREADS stops a worker here, at startup, rather than leaving the kernels to guess.
  VC_RETURN_IF_ERROR(kernels::KernelThreadsFromEnv().status());
  if (options.backend == nullptr) VC_RETURN_IF_ERROR(kernels::CheckKernelsFromEnv());
  std::unique_ptr<Model> m(new Model());
  m->backend_ = options.backend != nullptr ? options.backend : &kernels::DefaultBackend();
  VC_ASSIGN_OR_RETURN(m->config_, LoadModelConfig(dir));
  VC_ASSIGN_OR_RETURN(m->tokenizer_, MakeTokenizer(m->config_, dir));
  VC_ASSIGN_OR_RETURN(m->tensors_, TensorStore::Open(dir));
  VC_RETURN_IF_ERROR(m->LoadWeights());
  m->kv_dtype_ = options.kv_dtype.value_or(m->config_.torch_dtype.value_or(m->embed_.dtype));
  return m;
}

absl::Status Model::LoadWeights() {
  const ModelConfig& c = config_;
  const TensorStore& t = *tensors_;
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  VC_ASSIGN_OR_RETURN(embed_, t.Get("model.embed_tokens.weight", {c.vocab_size, d}));
  VC_RETURN_IF_ERROR(CheckFinite("model.embed_tokens.weight", embed_, c.vocab_size * d));
  // A checkpoint with more layers than the config names would lose its last ones unseen.
  if (const std::string extra = t.FirstWithPrefix(absl::StrCat("model.layers.", c.num_layers, "."));
      !extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint has more layers than num_hidden_layers (",
                                                   c.num_layers, ") in config.json: it holds '", extra, "'"));
  }
  if (c.tie_word_embeddings) {
    lm_head_ = kernels::WeightView{embed_.data, embed_.dtype, c.vocab_size, d};
  } else {
    VC_ASSIGN_OR_RETURN(lm_head_, Matrix(t, "lm_head.weight", c.vocab_size, d));
  }
  VC_ASSIGN_OR_RETURN(final_norm_, Vector(t, "model.norm.weight", d));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer& l = layers_[i];
    VC_ASSIGN_OR_RETURN(l.q, Matrix(t, p + "self_attn.q_proj.weight", qd, d));
    VC_ASSIGN_OR_RETURN(l.k, Matrix(t, p + "self_attn.k_proj.weight", kvd, d));
    VC_ASSIGN_OR_RETURN(l.v, Matrix(t, p + "self_attn.v_proj.weight", kvd, d));
    VC_ASSIGN_OR_RETURN(l.o, Matrix(t, p + "self_attn.o_proj.weight", d, qd));
    VC_ASSIGN_OR_RETURN(l.gate, Matrix(t, p + "mlp.gate_proj.weight", f, d));
    VC_ASSIGN_OR_RETURN(l.up, Matrix(t, p + "mlp.up_proj.weight", f, d));
    VC_ASSIGN_OR_RETURN(l.down, Matrix(t, p + "mlp.down_proj.weight", d, f));
    VC_ASSIGN_OR_RETURN(l.attn_norm, Vector(t, p + "input_layernorm.weight", d));
    VC_ASSIGN_OR_RETURN(l.mlp_norm, Vector(t, p + "post_attention_layernorm.weight", d));
    if (c.qkv_bias) {
      VC_ASSIGN_OR_RETURN(l.q_bias, Vector(t, p + "self_attn.q_proj.bias", qd));
      VC_ASSIGN_OR_RETURN(l.k_bias, Vector(t, p + "self_attn.k_proj.bias", kvd));
      VC_ASSIGN_OR_RETURN(l.v_bias, Vector(t, p + "self_attn.v_proj.bias", kvd));
    }
    if (c.o_bias) {
      VC_ASSIGN_OR_RETURN(l.o_bias, Vector(t, p + "self_attn.o_proj.bias", d));
    }
  }

  const int half = c.head_dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.head_dim);
    const RopeScaling& s = c.rope_scaling;
    if (s.enabled) {
      const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2.0 * M_PI / inv;
      const double low_wavelen = old_ctx / s.low_freq_factor;
      const double high_wavelen = old_ctx / s.high_freq_factor;
      if (wavelen > low_wavelen) {
        inv = inv / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
      }
    }
    inv_freq_[i] = inv;
  }
  return absl::OkStatus();
}

KvLayout Model::kv_layout(int block_size) const {
  return KvLayout{config_.num_layers, config_.num_kv_heads, config_.head_dim, block_size, kv_dtype_};
}

void Model::RopeTables(absl::Span<const int64_t> positions, std::vector<float>* cos,
                       std::vector<float>* sin) const {
  const size_t half = inv_freq_.size();
  cos->resize(positions.size() * half);
  sin->resize(positions.size() * half);
  for (size_t r = 0; r < positions.size(); ++r) {
    for (size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[r]) * inv_freq_[i];
      (*cos)[r * half + i] = static_cast<float>(std::cos(a));
      (*sin)[r * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

absl::Status Model::Prefill(absl::Span<const int32_t> tokens, SeqId seq, int chunk, AttentionCache& cache,
                            std::vector<float>* logits) const {
  if (chunk < 1) return absl::InvalidArgumentError("prefill chunk must be at least 1");
  std::vector<float> scratch;
  std::vector<bool> unused;
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(chunk)) {
    const SequenceChunk c{seq, tokens.subspan(start, std::min(tokens.size() - start, static_cast<size_t>(chunk)))};
    // Only the last row of the last chunk is the caller's to sample from.
    const bool last = start + static_cast<size_t>(chunk) >= tokens.size() && logits != nullptr;
    VC_RETURN_IF_ERROR(
        Forward({&c, 1}, cache, LogitsFor::kLastRows, last ? logits : &scratch, last ? nullptr : &unused));
  }
  return absl::OkStatus();
}

absl::Status NonFiniteLogits() {
  return absl::DataLossError("the model computed a NaN or infinite logit: its weights overflow float32");
}

absl::Status Model::Forward(absl::Span<const SequenceChunk> chunks, AttentionCache& cache,
                            LogitsFor which, std::vector<float>* logits, std::vector<bool>* finite) const {
  const ModelConfig& c = config_;
  const kernels::Backend& k = *backend_;
  int64_t n = 0;
  for (const SequenceChunk& ch : chunks) {
    if (ch.tokens.empty()) return absl::InvalidArgumentError("empty sequence chunk");
    for (int32_t t : ch.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " outside the vocabulary [0, ",
                                                       c.vocab_size, ")"));
      }
    }
    const int64_t end = cache.Length(ch.seq) + static_cast<int64_t>(ch.tokens.size());
    if (end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("position ", end - 1, " is beyond the model's context of ",
                                                     c.max_position_embeddings));
    }
    n += static_cast<int64_t>(ch.tokens.size());
  }
  if (n == 0) {
    logits->clear();
    return absl::OkStatus();
  }
  // Reserve every chunk's blocks first, so a full cache fails before anything changes.
  std::vector<int64_t> old_len;
  for (const SequenceChunk& ch : chunks) {
    old_len.push_back(cache.Length(ch.seq));
    absl::Status st = cache.Reserve(ch.seq, old_len.back() + static_cast<int64_t>(ch.tokens.size()));
    if (!st.ok()) {
      // Truncating to the old lengths releases what the earlier chunks reserved.
      for (size_t i = 0; i + 1 < old_len.size(); ++i) (void)cache.Truncate(chunks[i].seq, old_len[i]);
      return st;
    }
  }

  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const int64_t qd = int64_t{c.num_heads} * hd, kvd = int64_t{c.num_kv_heads} * hd;
  std::vector<int64_t> pos(n);
  std::vector<SeqId> seq_of(n);
  std::vector<int32_t> token(n);
  {
    int64_t r = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (size_t j = 0; j < chunks[i].tokens.size(); ++j, ++r) {
        pos[r] = old_len[i] + static_cast<int64_t>(j);
        seq_of[r] = chunks[i].seq;
        token[r] = chunks[i].tokens[j];
      }
    }
  }
  std::vector<float> cos, sin;
  RopeTables(pos, &cos, &sin);
  std::vector<QueryRow> rows(n);
  for (int64_t r = 0; r < n; ++r) rows[r] = {seq_of[r], pos[r]};

  std::vector<float> x(n * d), h(n * d), q(n * qd), kk(n * kvd), vv(n * kvd), att(n * qd), o(n * d);
  std::vector<float> g(n * f), u(n * f);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < d; ++i) x[r * d + i] = ElementAt(embed_, int64_t{token[r]} * d + i);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& l = layers_[li];
    k.RmsNorm(x.data(), n, d, l.attn_norm.data(), c.rms_norm_eps, h.data());
    {
      const kernels::WeightView ws[] = {l.q, l.k, l.v};
      float* const ys[] = {q.data(), kk.data(), vv.data()};
      k.MatMuls(h.data(), n, ws, ys, 3);
    }
    AddBias(l.q_bias, n, q.data());
    AddBias(l.k_bias, n, kk.data());
    AddBias(l.v_bias, n, vv.data());
    k.Rope(q.data(), n, c.num_heads, c.head_dim, cos.data(), sin.data());
    k.Rope(kk.data(), n, c.num_kv_heads, c.head_dim, cos.data(), sin.data());
    RoundThroughDType(kk.data(), n * kvd, kv_dtype_);
    RoundThroughDType(vv.data(), n * kvd, kv_dtype_);
    for (int64_t r = 0; r < n; ++r) cache.Write(li, seq_of[r], pos[r], kk.data() + r * kvd, vv.data() + r * kvd);
    cache.Attend(li, rows, q.data(), c.num_heads, scale, k, att.data());
    k.MatMul(att.data(), n, l.o, o.data());
    AddBias(l.o_bias, n, o.data());
    for (int64_t i = 0; i < n * d; ++i) x[i] += o[i];
    k.RmsNorm(x.data(), n, d, l.mlp_norm.data(), c.rms_norm_eps, h.data());
    {
      const kernels::WeightView ws[] = {l.gate, l.up};
      float* const ys[] = {g.data(), u.data()};
      k.MatMuls(h.data(), n, ws, ys, 2);
    }
    k.SwiGlu(g.data(), u.data(), n * f, g.data());
    k.MatMul(g.data(), n, l.down, o.data());
    for (int64_t i = 0; i < n * d; ++i) x[i] += o[i];
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    cache.Commit(chunks[i].seq, old_len[i] + static_cast<int64_t>(chunks[i].tokens.size()));
  }
  forward_passes_.fetch_add(1, std::memory_order_relaxed);

  // Final norm and LM head only for the rows whose logits are wanted.
  std::vector<int64_t> out_rows;
  if (which == LogitsFor::kAllRows) {
    for (int64_t r = 0; r < n; ++r) out_rows.push_back(r);
  } else {
    int64_t r = 0;
    for (const SequenceChunk& ch : chunks) {
      r += static_cast<int64_t>(ch.tokens.size());
      out_rows.push_back(r - 1);
    }
  }
  const int64_t m = static_cast<int64_t>(out_rows.size());
  std::vector<float> sel(m * d);
  for (int64_t i = 0; i < m; ++i) std::copy_n(x.data() + out_rows[i] * d, d, sel.data() + i * d);
  k.RmsNorm(sel.data(), m, d, final_norm_.data(), c.rms_norm_eps, sel.data());
  logits->resize(static_cast<size_t>(m * c.vocab_size));
  k.MatMul(sel.data(), m, lm_head_, logits->data());
  // Finite weights can still overflow (values near the largest bf16): a token would then be
  // sampled from NaN, silently. Refused, or told row by row.
  if (finite != nullptr) finite->assign(static_cast<size_t>(m), true);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = logits->data() + i * c.vocab_size;
    if (std::all_of(row, row + c.vocab_size, [](float z) { return std::isfinite(z); })) continue;
    if (finite == nullptr) return NonFiniteLogits();
    (*finite)[static_cast<size_t>(i)] = false;
  }
  return absl::OkStatus();
}

}  // namespace vc
