// Test cases of the fused attention ops (ops/attention.cc). The references
// are plain double loops from the definition (scores, masks, softmax, the
// weighted sum; the backward from P = e^(s - lse)), independent of the
// kernels' tiling. Below the cases: shapes across the kernels' blocks, the
// unfused composition, thread counts and bad inputs.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/text.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Dims {
  int64_t B, H, T, S, D;
};
Dims DimsOf(const std::vector<Tensor>& in) {
  const Shape& q = in[0].shape();
  return {q[0], q[1], q[2], in[1].shape()[2], q[3]};
}

// Whether query t sees key s (mask: the (B, S) flags, or empty).
bool Visible(const Dims& d, const std::vector<double>& mask, bool causal, int64_t b, int64_t t, int64_t s) {
  if (causal && s > t + d.S - d.T) return false;
  return mask.empty() || mask[static_cast<size_t>(b * d.S + s)] != 0;
}

struct Forward {
  std::vector<double> y, lse, p;  // p: (B, H, T, S) probabilities
};

// The dropout multipliers of the (B, H, T, S) probabilities: what the
// dropout op with the same attributes keeps (at step 0), times 1 / (1 -
// rate); ones without dropout.
std::vector<double> DropoutMultipliers(const Dims& d, const AttrMap& attrs) {
  const double rate = attrs.Float("dropout_rate");
  const auto n = static_cast<size_t>(d.B * d.H * d.T * d.S);
  if (rate == 0) return std::vector<double>(n, 1.0);
  auto ones = Tensor::Empty(Shape{d.B, d.H, d.T, d.S}, DType::kF32);
  EXPECT_TRUE(ones.ok());
  for (int64_t i = 0; i < ones->NumElements(); ++i) ones->data<float>()[i] = 1.0f;
  auto kept =
      RunOp("dropout", {*ones}, {{"rate", rate}, {"seed", attrs.Int("seed")}, {"tensor_id", attrs.Int("tensor_id")}});
  EXPECT_TRUE(kept.ok()) << kept.status();
  std::vector<double> z = (*kept)[0].ToDoubleVector();
  for (double& v : z) v = v != 0 ? 1.0 / (1.0 - rate) : 0.0;
  return z;
}

Forward AttentionForward(const std::vector<Tensor>& in, const AttrMap& attrs, bool masked) {
  const Dims d = DimsOf(in);
  const std::vector<double> z = DropoutMultipliers(d, attrs);
  const std::vector<double> q = in[0].ToDoubleVector(), k = in[1].ToDoubleVector(), v = in[2].ToDoubleVector();
  const std::vector<double> mask = masked ? in[3].ToDoubleVector() : std::vector<double>{};
  const double scale = attrs.Float("scale");
  const bool causal = attrs.Bool("causal");
  Forward f;
  f.y.assign(static_cast<size_t>(d.B * d.H * d.T * d.D), 0.0);
  f.lse.assign(static_cast<size_t>(d.B * d.H * d.T), kNegInf);
  f.p.assign(static_cast<size_t>(d.B * d.H * d.T * d.S), 0.0);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t bh = b * d.H + h;
      for (int64_t t = 0; t < d.T; ++t) {
        std::vector<double> score(static_cast<size_t>(d.S), kNegInf);
        double m = kNegInf;
        for (int64_t s = 0; s < d.S; ++s) {
          if (!Visible(d, mask, causal, b, t, s)) continue;
          double dot = 0;
          for (int64_t i = 0; i < d.D; ++i) dot += q[((bh * d.T) + t) * d.D + i] * k[((bh * d.S) + s) * d.D + i];
          score[static_cast<size_t>(s)] = scale * dot;
          m = std::max(m, scale * dot);
        }
        if (m == kNegInf) continue;
        double sum = 0;
        for (double x : score) sum += x == kNegInf ? 0.0 : std::exp(x - m);
        f.lse[static_cast<size_t>(bh * d.T + t)] = m + std::log(sum);
        for (int64_t s = 0; s < d.S; ++s) {
          const double x = score[static_cast<size_t>(s)];
          const double p = x == kNegInf ? 0.0 : std::exp(x - m) / sum;
          const auto at = static_cast<size_t>((bh * d.T + t) * d.S + s);
          f.p[at] = p;
          for (int64_t i = 0; i < d.D; ++i) {
            f.y[static_cast<size_t>((bh * d.T + t) * d.D + i)] += p * z[at] * v[((bh * d.S) + s) * d.D + i];
          }
        }
      }
    }
  }
  return f;
}

// Axes 1 and 2 of a 4-D tensor swapped: (B, T, H, D) <-> (B, H, T, D), in
// its dtype (the gradient check's references run in f64).
Tensor SwapHeads(const Tensor& t) {
  const Shape& s = t.shape();
  const std::vector<double> in = t.ToDoubleVector();
  std::vector<double> out(in.size());
  for (int64_t a = 0; a < s[0]; ++a) {
    for (int64_t i = 0; i < s[1]; ++i) {
      for (int64_t j = 0; j < s[2]; ++j) {
        for (int64_t d = 0; d < s[3]; ++d) {
          out[static_cast<size_t>(((a * s[2] + j) * s[1] + i) * s[3] + d)] =
              in[static_cast<size_t>(((a * s[1] + i) * s[2] + j) * s[3] + d)];
        }
      }
    }
  }
  return FromDoubles(Shape{s[0], s[2], s[1], s[3]}, t.dtype(), out);
}

// A reference over (B, H, T, D) inputs made to take layout "bthd" ones:
// their 4-D inputs and outputs swapped to and from (B, H, T, D).
ReferenceFn InLayout(ReferenceFn bhtd) {
  return [bhtd](const std::vector<Tensor>& in, const AttrMap& attrs) {
    if (attrs.String("layout") != "bthd") return bhtd(in, attrs);
    std::vector<Tensor> swapped;
    for (const Tensor& t : in) swapped.push_back(t.shape().rank() == 4 ? SwapHeads(t) : t);
    std::vector<Tensor> out = bhtd(swapped, attrs);
    for (Tensor& t : out) {
      if (t.shape().rank() == 4) t = SwapHeads(t);
    }
    return out;
  };
}

ReferenceFn AttentionRef(bool masked) {
  return InLayout([masked](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const Forward f = AttentionForward(in, attrs, masked);
    const DType dtype = RefFloatDType(in);
    const Shape& q = in[0].shape();
    return std::vector<Tensor>{FromDoubles(q, dtype, f.y), FromDoubles(Shape{q[0], q[1], q[2]}, dtype, f.lse)};
  });
}

// The backward from its inputs (q, k, v, y, lse, dy[, mask]) as the op
// defines it: P from lse, D = Σ dy ⊙ y from the given y.
ReferenceFn AttentionGradRef(bool masked) {
  return InLayout([masked](const std::vector<Tensor>& in, const AttrMap& attrs) {
    const Dims d = DimsOf(in);
    const std::vector<double> q = in[0].ToDoubleVector(), k = in[1].ToDoubleVector(), v = in[2].ToDoubleVector();
    const std::vector<double> y = in[3].ToDoubleVector(), lse = in[4].ToDoubleVector(), dy = in[5].ToDoubleVector();
    const std::vector<double> mask = masked ? in[6].ToDoubleVector() : std::vector<double>{};
    const double scale = attrs.Float("scale");
    const bool causal = attrs.Bool("causal");
    const std::vector<double> z = DropoutMultipliers(d, attrs);
    std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t bh = b * d.H + h;
        for (int64_t t = 0; t < d.T; ++t) {
          const auto row = static_cast<size_t>((bh * d.T + t) * d.D);
          const double l = lse[static_cast<size_t>(bh * d.T + t)];
          if (l == kNegInf) continue;
          double delta = 0;
          for (int64_t i = 0; i < d.D; ++i) delta += dy[row + i] * y[row + i];
          for (int64_t s = 0; s < d.S; ++s) {
            if (!Visible(d, mask, causal, b, t, s)) continue;
            const auto key = static_cast<size_t>((bh * d.S + s) * d.D);
            double dot = 0, dp = 0;
            for (int64_t i = 0; i < d.D; ++i) {
              dot += q[row + i] * k[key + i];
              dp += dy[row + i] * v[key + i];
            }
            const double p = std::exp(scale * dot - l);
            const double zt = z[static_cast<size_t>((bh * d.T + t) * d.S + s)];
            const double ds = p * (dp * zt - delta);
            for (int64_t i = 0; i < d.D; ++i) {
              dq[row + i] += scale * ds * k[key + i];
              dk[key + i] += scale * ds * q[row + i];
              dv[key + i] += p * zt * dy[row + i];
            }
          }
        }
      }
    }
    const DType dtype = RefFloatDType(in);
    return std::vector<Tensor>{FromDoubles(in[0].shape(), dtype, dq), FromDoubles(in[1].shape(), dtype, dk),
                               FromDoubles(in[2].shape(), dtype, dv)};
  });
}

struct Geometry {
  std::string label;
  Dims d;
  bool causal;
  double scale;
  double dropout_rate = 0;
  bool bthd = false;  // layout "bthd": q (B, T, H, D), k, v (B, S, H, D)
};

// A forward case, and a gradient case whose y and lse come from the
// reference forward (as the backward sees them in training).
void AddCases(std::vector<OpTestCase>& cases, const Geometry& g, bool masked, uint64_t seed, bool check_grad) {
  const Dims& d = g.d;
  const Shape queries = g.bthd ? Shape{d.B, d.T, d.H, d.D} : Shape{d.B, d.H, d.T, d.D};
  const Shape keys = g.bthd ? Shape{d.B, d.S, d.H, d.D} : Shape{d.B, d.H, d.S, d.D};
  std::vector<Tensor> in = {RandomUniform(queries, seed, -1.5, 1.5), RandomUniform(keys, seed + 1, -1.5, 1.5),
                            RandomUniform(keys, seed + 2)};
  if (masked) {
    Tensor mask = RandomBools({d.B, d.S}, seed + 3, 0.7);
    if (d.B > 1) {  // batch row 1 drops every key: its outputs are zeros
      for (int64_t s = 0; s < d.S; ++s) mask.data<bool>()[d.S + s] = false;
    }
    in.push_back(mask);
  }
  const std::string name = masked ? "flash_attention_masked" : "flash_attention";
  AttrMap attrs = {{"scale", g.scale}, {"causal", g.causal}};
  if (g.bthd) attrs.Set("layout", std::string("bthd"));
  if (g.dropout_rate > 0) {
    attrs.Set("dropout_rate", g.dropout_rate);
    attrs.Set("seed", static_cast<int64_t>(seed));
    attrs.Set("tensor_id", int64_t{77});
  }
  OpTestCase forward = MakeCase(name, g.label, in, AttentionRef(masked), attrs);
  forward.grad_outputs = {0};  // lse is a saved statistic
  forward.check_grad = check_grad;
  cases.push_back(forward);

  auto canonical = BuiltinOps().Find(name)->CanonicalizeAttrs(attrs);
  EXPECT_TRUE(canonical.ok()) << canonical.status();
  const std::vector<Tensor> fwd = AttentionRef(masked)(in, *canonical);
  std::vector<Tensor> grad_in = {in[0], in[1], in[2], fwd[0], fwd[1], RandomUniform(queries, seed + 4)};
  if (masked) grad_in.push_back(in[3]);
  cases.push_back(MakeCase(name + "_grad", g.label, grad_in, AttentionGradRef(masked), attrs));
}

}  // namespace

std::vector<OpTestCase> AttentionCases() {
  std::vector<OpTestCase> cases;
  const std::vector<Geometry> small = {
      {"causal square", {2, 3, 5, 5, 4}, true, 0.5},
      {"full T < S", {2, 2, 3, 6, 3}, false, 0.7},
      {"causal T > S (rows without keys)", {1, 2, 6, 4, 3}, true, 1.0},
      {"causal T < S", {2, 1, 3, 7, 5}, true, 0.3},
      {"causal, dropout 0.3", {2, 2, 5, 5, 3}, true, 0.6, 0.3},
      {"full T < S, dropout 0.5", {2, 2, 3, 6, 4}, false, 0.5, 0.5},
  };
  uint64_t seed = 100;
  for (const Geometry& g : small) {
    AddCases(cases, g, /*masked=*/false, seed, /*check_grad=*/true);
    AddCases(cases, g, /*masked=*/true, seed + 10, /*check_grad=*/true);
    seed += 20;
  }
  // Across the CPU kernel's 64-row query and key blocks (and the CUDA
  // kernel's tiles): the gradient check would take too long here; the
  // gradient op's case checks the backward.
  AddCases(cases, {"blocks, causal", {1, 2, 131, 131, 16}, true, 0.25}, false, 300, false);
  AddCases(cases, {"blocks, full T < S", {2, 1, 70, 150, 8}, false, 0.35}, true, 310, false);
  AddCases(cases, {"blocks, causal, dropout 0.2", {1, 2, 100, 100, 8}, true, 0.3, 0.2}, true, 320, false);
  // Layout "bthd" (the heads of a (B·T, H·D) projection in place): its
  // splits are of axis 2 (heads) and 1 (queries), lse's still of 1 and 2.
  const std::vector<Geometry> bthd = {
      {"bthd causal square", {2, 3, 5, 5, 4}, true, 0.5, 0, true},
      {"bthd full T < S", {2, 2, 3, 6, 3}, false, 0.7, 0, true},
      {"bthd causal T > S, dropout 0.3", {1, 3, 6, 4, 3}, true, 1.0, 0.3, true},
  };
  for (const Geometry& g : bthd) {
    AddCases(cases, g, /*masked=*/false, seed, /*check_grad=*/true);
    AddCases(cases, g, /*masked=*/true, seed + 10, /*check_grad=*/true);
    seed += 20;
  }
  AddCases(cases, {"bthd blocks, causal, dropout 0.2", {2, 3, 131, 131, 16}, true, 0.25, 0.2, true}, true, 400, false);
  return cases;
}

namespace {

Tensor Run1(const std::string& op, const std::vector<Tensor>& in, const AttrMap& attrs, int index,
            ThreadPool* pool = nullptr) {
  EagerOptions options;
  options.pool = pool;
  auto out = RunOp(op, in, attrs, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[static_cast<size_t>(index)] : Tensor();
}

// The fused op gives what the unfused ops give (q kᵀ, the fused causal
// softmax, the product with v), as the model computes it without fusion.
TEST(AttentionOps, MatchesTheUnfusedComposition) {
  const Tensor q = RandomUniform({2, 4, 33, 16}, 1), k = RandomUniform({2, 4, 33, 16}, 2),
               v = RandomUniform({2, 4, 33, 16}, 3);
  const Tensor fused = Run1("flash_attention", {q, k, v}, {{"scale", 0.25}, {"causal", true}}, 0);
  const Tensor scores = Run1("batch_matmul", {q, k}, {{"transpose_b", true}}, 0);
  const Tensor probs = Run1("fused_scale_causal_softmax", {scores}, {{"scale", 0.25}}, 0);
  const Tensor y = Run1("batch_matmul", {probs, v}, {}, 0);
  const std::vector<double> a = fused.ToDoubleVector(), b = y.ToDoubleVector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << "element " << i;
}

// Kept probabilities are scaled as the dropout op scales them, 1 / (1 -
// rate) in double: the CPU kernel took the rate rounded to float (0.9: kept
// values times 9.9999976, not 10), and its keep threshold with it. Uniform
// probabilities (q = k = 0) and one key's value: y = mask / S exactly.
TEST(AttentionOps, DropoutKeepsAndScalesAsTheDropoutOp) {
  constexpr int64_t S = 64;
  for (const double rate : {0.9, 0.7, 0.45}) {
    SCOPED_TRACE(rate);
    auto zeros = Tensor::Zeros(Shape{1, 1, S, 1}, DType::kF32);
    auto value = Tensor::Zeros(Shape{1, 1, S, 1}, DType::kF32);
    ASSERT_TRUE(zeros.ok() && value.ok());
    value->data<float>()[5] = 1.0f;  // y[t] = p(t, 5) * mask(t, 5)
    const AttrMap attrs = {
        {"scale", 1.0}, {"causal", false}, {"dropout_rate", rate}, {"seed", int64_t{7}}, {"tensor_id", int64_t{3}}};
    const Tensor y = Run1("flash_attention", {*zeros, *zeros, *value}, attrs, 0);
    const float kept = static_cast<float>(1.0 / (1.0 - rate));
    auto ones = Tensor::Empty(Shape{1, 1, S, S}, DType::kF32);
    ASSERT_TRUE(ones.ok());
    for (int64_t i = 0; i < S * S; ++i) ones->data<float>()[i] = 1.0f;
    const Tensor mask = Run1("dropout", {*ones}, {{"rate", rate}, {"seed", int64_t{7}}, {"tensor_id", int64_t{3}}}, 0);
    for (int64_t t = 0; t < S; ++t) {
      EXPECT_EQ(y.data<float>()[t], mask.data<float>()[t * S + 5] / static_cast<float>(S)) << "row " << t;
      EXPECT_TRUE(y.data<float>()[t] == 0.0f || y.data<float>()[t] == kept / static_cast<float>(S)) << "row " << t;
    }
  }
}

// Every sum has one order: one thread and two give the same bits.
TEST(AttentionOps, ThreadCountDoesNotChangeTheBits) {
  const Tensor q = RandomUniform({2, 3, 100, 8}, 4), k = RandomUniform({2, 3, 100, 8}, 5),
               v = RandomUniform({2, 3, 100, 8}, 6), dy = RandomUniform({2, 3, 100, 8}, 7);
  const AttrMap attrs = {{"scale", 0.3}, {"causal", true}};
  ThreadPool pool(2);
  auto forward1 = RunOp("flash_attention", {q, k, v}, attrs);
  EagerOptions threaded;
  threaded.pool = &pool;
  auto forward2 = RunOp("flash_attention", {q, k, v}, attrs, threaded);
  ASSERT_TRUE(forward1.ok() && forward2.ok());
  EXPECT_EQ((*forward1)[0].ToDoubleVector(), (*forward2)[0].ToDoubleVector());
  EXPECT_EQ((*forward1)[1].ToDoubleVector(), (*forward2)[1].ToDoubleVector());
  const std::vector<Tensor> grad_in = {q, k, v, (*forward1)[0], (*forward1)[1], dy};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Run1("flash_attention_grad", grad_in, attrs, i).ToDoubleVector(),
              Run1("flash_attention_grad", grad_in, attrs, i, &pool).ToDoubleVector())
        << "output " << i;
  }
}

// bf16 and f16 q, k, v (mixed precision's): y and lse are the f32 op's on
// the same values, and the gradient's dq, dk, dv the f32 gradient's rounded
// to q's type (the CPU widens and computes in f32; the GPU's tensor-core
// kernels are compared with this in cuda_kernels_test).
TEST(AttentionOps, SixteenBitInputsGiveTheF32ResultsOfTheirValues) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const bool masked : {false, true}) {
      SCOPED_TRACE(StrCat(DTypeName(dtype), masked ? " masked" : ""));
      std::vector<Tensor> narrow, wide;
      for (uint64_t seed : {1, 2, 3}) {
        narrow.push_back(Run1("cast", {RandomUniform({2, 2, 37, 24}, seed, -2.0f, 2.0f)}, {{"dtype", dtype}}, 0));
        wide.push_back(Run1("cast", {narrow.back()}, {{"dtype", DType::kF32}}, 0));
      }
      if (masked) {
        narrow.push_back(RandomBools({2, 37}, 4, 0.8));
        wide.push_back(narrow.back());
      }
      const std::string name = masked ? "flash_attention_masked" : "flash_attention";
      const AttrMap attrs = {{"scale", 0.3}, {"causal", !masked}, {"dropout_rate", 0.2}, {"seed", int64_t{7}}};
      auto got = RunOp(name, narrow, attrs);
      auto want = RunOp(name, wide, attrs);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(want.ok()) << want.status();
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ((*got)[i].dtype(), DType::kF32);
        EXPECT_EQ((*got)[i].ToDoubleVector(), (*want)[i].ToDoubleVector()) << "output " << i;
      }
      const Tensor dy = RandomUniform({2, 2, 37, 24}, 5);
      std::vector<Tensor> grad_narrow = {narrow[0], narrow[1], narrow[2], (*want)[0], (*want)[1], dy};
      std::vector<Tensor> grad_wide = {wide[0], wide[1], wide[2], (*want)[0], (*want)[1], dy};
      if (masked) {
        grad_narrow.push_back(narrow[3]);
        grad_wide.push_back(wide[3]);
      }
      auto grads = RunOp(name + "_grad", grad_narrow, attrs);
      auto wide_grads = RunOp(name + "_grad", grad_wide, attrs);
      ASSERT_TRUE(grads.ok()) << grads.status();
      ASSERT_TRUE(wide_grads.ok()) << wide_grads.status();
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ((*grads)[i].dtype(), dtype);
        EXPECT_EQ((*grads)[i].ToDoubleVector(),
                  Run1("cast", {(*wide_grads)[i]}, {{"dtype", dtype}}, 0).ToDoubleVector())
            << "gradient " << i;
      }
    }
  }
}

TEST(AttentionOps, BadInputsNameWhatIsWrong) {
  const Tensor q = RandomUniform({2, 2, 4, 8}, 1);
  struct Bad {
    std::string op;
    std::vector<Tensor> in;
    AttrMap attrs;
    std::string want;
  };
  const std::vector<Bad> bad = {
      {"flash_attention", {RandomUniform({2, 4, 8}, 1), q, q}, {}, "'q'"},
      {"flash_attention", {q, RandomUniform({2, 2, 4, 6}, 2), q}, {}, "input 'k' must be (B, H, S, D)"},
      {"flash_attention", {q, q, RandomUniform({2, 2, 5, 8}, 3)}, {}, "input 'v' must have shape"},
      {"flash_attention", {q, q, RandomInts({2, 2, 4, 8}, 4, 0, 3)}, {}, "input 'v' must be f32 like q, got i64"},
      {"flash_attention", {RandomInts({2, 2, 4, 8}, 4, 0, 3), q, q}, {}, "input 'q' must be f32, bf16 or f16, got i64"},
      {"flash_attention",
       {q, Run1("cast", {q}, {{"dtype", DType::kBF16}}, 0), q},
       {},
       "'k' must be f32 like q, got bf16"},
      {"flash_attention", {q, q, q}, {{"scale", std::nan("")}}, "'scale' must be finite"},
      {"flash_attention", {q, q, q}, {{"dropout_rate", 1.0}}, "'dropout_rate' must be in [0, 1), got 1"},
      {"flash_attention", {q, q, q}, {{"layout", std::string("bhdt")}}, "'layout' must be \"bhtd\""},
      {"flash_attention",
       {q, RandomUniform({2, 4, 3, 8}, 2), q},
       {{"layout", std::string("bthd")}},
       "input 'k' must be (B, S, H, D)"},
      {"flash_attention_masked",
       {q, q, q, RandomBools({2, 4}, 5)},
       {{"layout", std::string("bthd")}},
       "'mask' must have shape (2, 2)"},
      {"flash_attention_masked", {q, q, q, RandomBools({2, 5}, 5)}, {}, "'mask' must have shape (2, 4)"},
      {"flash_attention_masked", {q, q, q, RandomUniform({2, 4}, 6)}, {}, "'mask' must be bool"},
      {"flash_attention_grad", {q, q, q, q, RandomUniform({2, 2, 5}, 7), q}, {}, "'lse' must have shape (2, 2, 4)"},
      {"flash_attention_grad", {q, q, q, q, q}, {}, "expects 6 inputs"},
  };
  for (const Bad& b : bad) {
    auto out = RunOp(b.op, b.in, b.attrs);
    ASSERT_FALSE(out.ok()) << b.op << " accepted bad input (" << b.want << ")";
    EXPECT_NE(std::string(out.status().message()).find(b.want), std::string::npos) << out.status();
  }
}

}  // namespace
}  // namespace tessera::ops::testing
