// Reference kernels: one float accumulator per output, summed in index order. Slow and plain.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/kernels.h"

namespace vc::kernels {
namespace {

inline float LoadWeight(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

class Reference final : public Backend {
 public:
  absl::string_view name() const override { return "reference"; }

  void MatMul(const float* x, int64_t n, const WeightView& w, float* y) const override {
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * w.cols;
      for (int64_t o = 0; o < w.rows; ++o) {
        float acc = 0.0f;
        for (int64_t c = 0; c < w.cols; ++c) acc += xr[c] * LoadWeight(w.data, w.dtype, o * w.cols + c);
        y[r * w.rows + o] = acc;
      }
    }
  }

  void RmsNorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps,
               float* y) const override {
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * dim;
      float ss = 0.0f;
      for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = xr[i] * inv * weight[i];
    }
  }

  void Rope(float* x, int64_t n, int heads, int head_dim, const float* cos,
            const float* sin) const override {
    const int half = head_dim / 2;
    for (int64_t r = 0; r < n; ++r) {
      for (int h = 0; h < heads; ++h) {
        float* v = x + (r * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float c = cos[r * half + i], s = sin[r * half + i];
          const float a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
    }
  }

  void SwiGlu(const float* gate, const float* up, int64_t count, float* out) const override {
    for (int64_t i = 0; i < count; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }

  void PagedAttention(const float* q, int64_t n, int num_heads, const AttentionRow* rows,
                      const PagedKvLayer& kv, float scale, float* out) const override {
    const int d = kv.head_dim;
    const int group = num_heads / kv.num_kv_heads;
    std::vector<float> p;
    for (int64_t r = 0; r < n; ++r) {
      const int32_t len = rows[r].kv_len;
      p.resize(static_cast<size_t>(len));
      for (int h = 0; h < num_heads; ++h) {
        const float* qh = q + (r * num_heads + h) * d;
        float* oh = out + (r * num_heads + h) * d;
        const int kvh = h / group;
        const int64_t elem = static_cast<int64_t>(DTypeSize(kv.dtype));
        auto at = [&](const void* base, int32_t j) {
          const int32_t block = rows[r].block_table[j / kv.block_size];
          return static_cast<const char*>(base) +
                 (block * kv.block_stride + (static_cast<int64_t>(j % kv.block_size) * kv.num_kv_heads + kvh) * d) * elem;
        };
        float m = -INFINITY;
        for (int32_t j = 0; j < len; ++j) {
          const void* kj = at(kv.k, j);
          float s = 0.0f;
          for (int i = 0; i < d; ++i) s += qh[i] * KvElement(kj, kv.dtype, i);
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        float l = 0.0f;
        for (int32_t j = 0; j < len; ++j) {
          p[j] = std::exp(p[j] - m);
          l += p[j];
        }
        for (int i = 0; i < d; ++i) oh[i] = 0.0f;
        for (int32_t j = 0; j < len; ++j) {
          const void* vj = at(kv.v, j);
          for (int i = 0; i < d; ++i) oh[i] += p[j] * KvElement(vj, kv.dtype, i);
        }
        if (len > 0) {
          const float inv = 1.0f / l;
          for (int i = 0; i < d; ++i) oh[i] *= inv;
        }
      }
    }
  }

  void CompressedAttention(const float* q, int64_t n, int num_heads, int num_kv_heads, int d,
                           const CompressedKvHead* kv, float scale, float* out) const override {
    const int group = num_heads / num_kv_heads;
    std::vector<float> p, kbuf(d), vbuf(d);
    for (int64_t r = 0; r < n; ++r) {
      for (int h = 0; h < num_heads; ++h) {
        const CompressedKvHead& c = kv[r * num_kv_heads + h / group];
        const int32_t qt = c.quant.tokens, len = qt + c.dense.count;
        const float* qh = q + (r * num_heads + h) * d;
        float* oh = out + (r * num_heads + h) * d;
        p.resize(static_cast<size_t>(len));
        float m = -INFINITY;
        for (int32_t j = 0; j < len; ++j) {
          const float* kj = j < qt ? DequantKey(c.quant, d, j, kbuf.data()) : c.dense.k + c.dense.rows[j - qt] * c.dense.stride;
          float s = 0.0f;
          for (int i = 0; i < d; ++i) s += qh[i] * kj[i];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        float l = 0.0f;
        for (int32_t j = 0; j < len; ++j) {
          p[j] = std::exp(p[j] - m);
          l += p[j];
        }
        for (int i = 0; i < d; ++i) oh[i] = 0.0f;
        for (int32_t j = 0; j < len; ++j) {
          const float* vj = j < qt ? DequantValue(c.quant, d, j, vbuf.data()) : c.dense.v + c.dense.rows[j - qt] * c.dense.stride;
          for (int i = 0; i < d; ++i) oh[i] += p[j] * vj[i];
        }
        if (len > 0) {
          const float inv = 1.0f / l;
          for (int i = 0; i < d; ++i) oh[i] *= inv;
        }
      }
    }
  }

 private:
  static const float* DequantKey(const QuantizedKvHead& qk, int d, int32_t j, float* buf) {
    const int64_t g = StoredGroup(qk, j / qk.key_group) * d;
    const int64_t run = int64_t{qk.key_group} * qk.bits / 8;  // bytes of one channel of one group
    for (int c = 0; c < d; ++c) {
      const int code = UnpackCode(qk.k_codes + (g + c) * run, qk.bits, j % qk.key_group);
      buf[c] = qk.k_min[g + c] + code * qk.k_scale[g + c];
    }
    return buf;
  }
  static const float* DequantValue(const QuantizedKvHead& qk, int d, int32_t j, float* buf) {
    const int64_t t = StoredToken(qk, j);
    const uint8_t* row = qk.v_codes + t * d * qk.bits / 8;
    const int64_t g = t * (d / qk.value_group);
    for (int c = 0; c < d; ++c) {
      buf[c] = qk.v_min[g + c / qk.value_group] + UnpackCode(row, qk.bits, c) * qk.v_scale[g + c / qk.value_group];
    }
    return buf;
  }
};

}  // namespace

const Backend& ReferenceBackend() {
  static const Reference* backend = new Reference();
  return *backend;
}

}  // namespace vc::kernels
