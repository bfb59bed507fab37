#pragma once
// Plain-loop references for the nn/ layers and GPT-2 (test oracles, double
// accumulation): no ops, no graph, so they check the layers independently.
// Shapes: B batch, T sequence, C hidden, H heads, D = C / H, F MLP hidden.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

namespace tessera::nn::testing {

using Floats = std::vector<float>;

// a (m, k) @ b (k, n) [+ bias (n)]
inline Floats MatmulRef(const Floats& a, const Floats& b, int64_t m, int64_t k, int64_t n, const Floats* bias = nullptr) {
  Floats y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? (*bias)[static_cast<size_t>(j)] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += double(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(p * n + j)];
      y[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  }
  return y;
}

inline Floats LayerNormRef(const Floats& x, int64_t rows, int64_t C, const Floats& gamma, const Floats& beta, double eps) {
  Floats y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[static_cast<size_t>(r * C + c)];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += std::pow(x[static_cast<size_t>(r * C + c)] - mean, 2);
    var /= static_cast<double>(C);
    const double rstd = 1 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r * C + c);
      y[i] = static_cast<float>((x[i] - mean) * rstd * gamma[static_cast<size_t>(c)] + beta[static_cast<size_t>(c)]);
    }
  }
  return y;
}

inline float GeluTanhRef(float x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return static_cast<float>(0.5 * x * (1 + std::tanh(c * (x + 0.044715 * double(x) * x * x))));
}

// GPT-2 attention without dropout: x (B, T, C); w_attn (C, 3, C) = HF's
// (C, 3C); b_attn (3, C); mask (B, T) (true = keep) or empty.
inline Floats AttentionRef(const Floats& x, int64_t B, int64_t T, int64_t C, int64_t H, const Floats& w_attn,
                    const Floats& b_attn, const Floats& w_proj, const Floats& b_proj, bool causal,
                    const std::vector<bool>& mask) {
  const int64_t D = C / H, N = B * T;
  const Floats qkv = MatmulRef(x, w_attn, N, C, 3 * C, &b_attn);  // (N, 3C): the HF layout
  auto at = [&](int64_t b, int64_t t, int part, int64_t h, int64_t d) {
    return qkv[static_cast<size_t>((b * T + t) * 3 * C + part * C + h * D + d)];
  };
  Floats context(static_cast<size_t>(N * C));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(static_cast<size_t>(T), -std::numeric_limits<double>::infinity());
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < T; ++s) {
          if ((causal && s > t) || (!mask.empty() && !mask[static_cast<size_t>(b * T + s)])) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(at(b, t, 0, h, d)) * at(b, s, 1, h, d);
          p[static_cast<size_t>(s)] = dot / std::sqrt(static_cast<double>(D));
          max = std::max(max, p[static_cast<size_t>(s)]);
        }
        double sum = 0;
        for (double& v : p) sum += (v = std::isinf(v) ? 0 : std::exp(v - max));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t s = 0; s < T; ++s) acc += p[static_cast<size_t>(s)] / sum * at(b, s, 2, h, d);
          context[static_cast<size_t>((b * T + t) * C + h * D + d)] = static_cast<float>(acc);
        }
      }
    }
  }
  return MatmulRef(context, w_proj, N, C, C, &b_proj);
}

inline Floats MlpRef(const Floats& x, int64_t N, int64_t C, int64_t F, const Floats& w_fc, const Floats& b_fc,
              const Floats& w_proj, const Floats& b_proj) {
  Floats h = MatmulRef(x, w_fc, N, C, F, &b_fc);
  for (float& v : h) v = GeluTanhRef(v);
  return MatmulRef(h, w_proj, N, F, C, &b_proj);
}

inline Floats Add(Floats a, const Floats& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

}  // namespace tessera::nn::testing
