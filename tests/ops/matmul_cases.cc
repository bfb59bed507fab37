// Cases for matmul and batch_matmul: every transpose combination, alpha != 1,
// extents (5, 7, 3) that split unevenly over 2, 3 and 4 shards, extents
// smaller than the shard count (empty shards, K = 0 pieces), and batch ranks
// 3 and 4; matmul_bias; matmul_bias_gelu with both GELUs; matmul_add.

#include <string>
#include <tuple>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

// y[..., i, j] = alpha * Σ_l op(a)[..., i, l] op(b)[..., l, j] in double, from
// the stored layouts directly.
std::vector<Tensor> ReferenceGemm(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& sa = in[0].shape();
  const Shape& sb = in[1].shape();
  const int rank = sa.rank();
  const bool ta = attrs.Bool("transpose_a"), tb = attrs.Bool("transpose_b");
  const double alpha = attrs.Float("alpha");
  const int64_t m = ta ? sa[rank - 1] : sa[rank - 2];
  const int64_t k = ta ? sa[rank - 2] : sa[rank - 1];
  const int64_t n = tb ? sb[rank - 2] : sb[rank - 1];
  int64_t batch = 1;
  std::vector<int64_t> out_dims;
  for (int i = 0; i < rank - 2; ++i) {
    batch *= sa[i];
    out_dims.push_back(sa[i]);
  }
  out_dims.push_back(m);
  out_dims.push_back(n);
  const std::vector<double> a = in[0].ToDoubleVector(), b = in[1].ToDoubleVector();
  std::vector<double> y(static_cast<size_t>(batch * m * n));
  for (int64_t t = 0; t < batch; ++t) {
    const double* pa = a.data() + t * m * k;
    const double* pb = b.data() + t * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double av = ta ? pa[l * m + i] : pa[i * k + l];
          const double bv = tb ? pb[j * k + l] : pb[l * n + j];
          sum += av * bv;
        }
        y[static_cast<size_t>((t * m + i) * n + j)] = alpha * sum;
      }
    }
  }
  return {FromDoubles(Shape(out_dims), RefFloatDType(in), y)};
}

// Stored shapes for op(a) (…, m, k) and op(b) (…, k, n) under the flags.
Shape StoredA(std::vector<int64_t> batch, int64_t m, int64_t k, bool ta) {
  batch.push_back(ta ? k : m);
  batch.push_back(ta ? m : k);
  return Shape(batch);
}
Shape StoredB(std::vector<int64_t> batch, int64_t k, int64_t n, bool tb) {
  batch.push_back(tb ? n : k);
  batch.push_back(tb ? k : n);
  return Shape(batch);
}

OpTestCase Gemm(std::string op, std::string label, const std::vector<int64_t>& batch, int64_t m, int64_t k, int64_t n,
                bool ta, bool tb, double alpha, uint64_t seed) {
  return MakeCase(std::move(op), std::move(label),
                  {RandomUniform(StoredA(batch, m, k, ta), seed), RandomUniform(StoredB(batch, k, n, tb), seed + 1)},
                  ReferenceGemm, {{"transpose_a", ta}, {"transpose_b", tb}, {"alpha", alpha}});
}

// matmul_bias_gelu: z = x @ w + bias, y = GELU(z), in double (matmul_bias:
// z alone, `gelu` false).
std::vector<Tensor> ReferenceLinear(const std::vector<Tensor>& in, const AttrMap& attrs, bool gelu) {
  const bool tanh_approx = gelu && attrs.String("approximate") == "tanh";
  const int64_t m = in[0].shape()[0], k = in[0].shape()[1], n = in[1].shape()[1];
  const std::vector<double> x = in[0].ToDoubleVector(), w = in[1].ToDoubleVector(), bias = in[2].ToDoubleVector();
  std::vector<double> y(static_cast<size_t>(m * n)), z(y.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias[static_cast<size_t>(j)];
      for (int64_t l = 0; l < k; ++l) sum += x[static_cast<size_t>(i * k + l)] * w[static_cast<size_t>(l * n + j)];
      z[static_cast<size_t>(i * n + j)] = sum;
      y[static_cast<size_t>(i * n + j)] = ReferenceGelu(sum, tanh_approx);
    }
  }
  const DType dtype = RefFloatDType(in);
  if (!gelu) return {FromDoubles(Shape{m, n}, dtype, z)};
  return {FromDoubles(Shape{m, n}, dtype, y), FromDoubles(Shape{m, n}, dtype, z)};
}

std::vector<Tensor> ReferenceMatmulBiasGelu(const std::vector<Tensor>& in, const AttrMap& attrs) {
  return ReferenceLinear(in, attrs, true);
}

std::vector<Tensor> ReferenceMatmulBias(const std::vector<Tensor>& in, const AttrMap& attrs) {
  return ReferenceLinear(in, attrs, false);
}

OpTestCase MatmulBiasGelu(std::string label, int64_t m, int64_t k, int64_t n, const std::string& approximate,
                          uint64_t seed) {
  return MakeCase(
      "matmul_bias_gelu", std::move(label),
      {RandomUniform(Shape{m, k}, seed), RandomUniform(Shape{k, n}, seed + 1), RandomUniform(Shape{n}, seed + 2)},
      ReferenceMatmulBiasGelu, {{"approximate", approximate}});
}

OpTestCase MatmulBias(std::string label, int64_t m, int64_t k, int64_t n, uint64_t seed) {
  return MakeCase(
      "matmul_bias", std::move(label),
      {RandomUniform(Shape{m, k}, seed), RandomUniform(Shape{k, n}, seed + 1), RandomUniform(Shape{n}, seed + 2)},
      ReferenceMatmulBias, {});
}

}  // namespace

std::vector<OpTestCase> MatmulCases() {
  std::vector<OpTestCase> cases;
  // matmul (5, 7) x (7, 3): M, K, N all split unevenly at p = 2, 3, 4.
  cases.push_back(Gemm("matmul", "nn_5x7x3", {}, 5, 7, 3, false, false, 1.0, 1));
  cases.push_back(Gemm("matmul", "tn_5x7x3", {}, 5, 7, 3, true, false, 1.0, 3));
  cases.push_back(Gemm("matmul", "nt_5x7x3", {}, 5, 7, 3, false, true, 1.0, 5));
  cases.push_back(Gemm("matmul", "tt_5x7x3", {}, 5, 7, 3, true, true, 1.0, 7));
  cases.push_back(Gemm("matmul", "nn_alpha", {}, 6, 5, 9, false, false, -1.5, 9));
  cases.push_back(Gemm("matmul", "tt_alpha", {}, 3, 8, 5, true, true, 0.25, 11));
  cases.push_back(Gemm("matmul", "tn_alpha", {}, 7, 3, 4, true, false, 2.0, 13));
  cases.push_back(Gemm("matmul", "nt_alpha", {}, 4, 6, 7, false, true, -0.5, 15));
  // Extents below the shard count: at p = 3, 4 some shards hold no rows, no
  // columns or no K (their partial sums are zeros).
  cases.push_back(Gemm("matmul", "tiny_2x3x1_empty_shards", {}, 2, 3, 1, false, false, 1.0, 17));
  // Large enough for oneDNN's blocked micro-kernels (tails in every direction);
  // no finite differences at this size.
  OpTestCase big = Gemm("matmul", "large_37x41x29", {}, 37, 41, 29, false, true, 1.0, 19);
  big.check_grad = false;
  big.rtol = big.atol = 1e-4;
  cases.push_back(big);

  // transpose_a with a long K goes through a transpose and NN in blocks of
  // 128 rows (ops/cpu/matmul.cc): row blocks and 8 x 8 tiles with tails, K
  // not a multiple of the tile, with and without transpose_b.
  for (auto [label, m, k, n, tb, alpha] : {std::tuple{"large_tn_203x517x70", 203, 517, 70, false, 1.0},
                                           std::tuple{"large_tt_131x600x65_alpha", 131, 600, 65, true, 0.5}}) {
    OpTestCase t = Gemm("matmul", label, {}, m, k, n, true, tb, alpha, 35);
    t.check_grad = false;
    t.rtol = t.atol = 1e-4;
    cases.push_back(t);
  }

  // batch_matmul, rank 3: batch 3 splits unevenly over 2 and 4 shards.
  cases.push_back(Gemm("batch_matmul", "nn_3x5x4x6", {3}, 5, 4, 6, false, false, 1.0, 21));
  cases.push_back(Gemm("batch_matmul", "tn_alpha", {3}, 5, 4, 3, true, false, -2.0, 23));
  cases.push_back(Gemm("batch_matmul", "nt", {3}, 4, 5, 3, false, true, 1.0, 25));
  cases.push_back(Gemm("batch_matmul", "tt_alpha", {3}, 3, 4, 5, true, true, 0.5, 27));
  // Rank 4: both batch axes get S(i) signatures.
  cases.push_back(Gemm("batch_matmul", "rank4_nn", {2, 3}, 4, 5, 2, false, false, 1.0, 29));
  cases.push_back(Gemm("batch_matmul", "rank4_tt_alpha", {3, 2}, 2, 3, 5, true, true, 1.5, 31));
  OpTestCase big_batch = Gemm("batch_matmul", "large_5x17x33x9", {5}, 17, 33, 9, true, false, 1.0, 33);
  big_batch.check_grad = false;
  big_batch.rtol = big_batch.atol = 1e-4;
  cases.push_back(big_batch);
  OpTestCase long_k = Gemm("batch_matmul", "large_tn_2x70x520x66", {2}, 70, 520, 66, true, false, 1.0, 37);
  long_k.check_grad = false;
  long_k.rtol = long_k.atol = 1e-4;
  cases.push_back(long_k);

  // matmul_bias_gelu: both GELUs, extents splitting unevenly (rows with x,
  // columns with weight and bias), fewer rows and columns than shards, K = 0
  // (z = bias), and a size past the pool's grain where the epilogue runs on
  // each thread's own block (two row blocks and column tails).
  cases.push_back(MatmulBiasGelu("exact_5x7x3", 5, 7, 3, "none", 41));
  cases.push_back(MatmulBiasGelu("tanh_6x5x9", 6, 5, 9, "tanh", 44));
  cases.push_back(MatmulBiasGelu("tiny_2x3x1_empty_shards", 2, 3, 1, "tanh", 47));
  cases.push_back(MatmulBiasGelu("k0_3x0x4", 3, 0, 4, "none", 50));
  for (const auto& [label, approximate] :
       {std::pair{"large_exact_67x129x131", "none"}, std::pair{"large_tanh_67x129x131", "tanh"}}) {
    OpTestCase t = MatmulBiasGelu(label, 67, 129, 131, approximate, 53);
    t.check_grad = false;
    t.rtol = t.atol = 1e-4;
    cases.push_back(t);
  }

  // matmul_bias: the same extents (M, N and K split unevenly: K's pieces
  // take a partial bias), empty shards, K = 0 (y = bias) and a size whose
  // epilogue runs on each thread's own block.
  cases.push_back(MatmulBias("5x7x3", 5, 7, 3, 61));
  cases.push_back(MatmulBias("6x5x9", 6, 5, 9, 64));
  cases.push_back(MatmulBias("tiny_2x3x1_empty_shards", 2, 3, 1, 67));
  cases.push_back(MatmulBias("k0_3x0x4", 3, 0, 4, 70));
  OpTestCase big_linear = MatmulBias("large_67x129x131", 67, 129, 131, 73);
  big_linear.check_grad = false;
  big_linear.rtol = big_linear.atol = 1e-4;
  cases.push_back(big_linear);

  // matmul_add: every transpose, alpha, uneven splits (a partial y takes a
  // partial c), empty shards, K = 0 (y = c), and a large one cut over the
  // pool (the addend added on each thread's own block).
  const auto matmul_add = [](std::string label, int64_t m, int64_t k, int64_t n, bool ta, bool tb, double alpha,
                             uint64_t seed) {
    OpTestCase c = Gemm("matmul_add", std::move(label), {}, m, k, n, ta, tb, alpha, seed);
    c.inputs.push_back(RandomUniform(Shape{m, n}, seed + 2));
    c.reference = [](const std::vector<Tensor>& in, const AttrMap& attrs) {
      const Tensor product = ReferenceGemm(in, attrs)[0];
      std::vector<double> y = product.ToDoubleVector();
      const std::vector<double> addend = in[2].ToDoubleVector();
      for (size_t i = 0; i < y.size(); ++i) y[i] += addend[i];
      return std::vector<Tensor>{FromDoubles(product.shape(), RefFloatDType(in), y)};
    };
    return c;
  };
  cases.push_back(matmul_add("nn_5x7x3", 5, 7, 3, false, false, 1.0, 81));
  cases.push_back(matmul_add("nt_alpha", 4, 6, 7, false, true, -0.5, 84));
  cases.push_back(matmul_add("tn", 7, 3, 4, true, false, 1.0, 87));
  cases.push_back(matmul_add("tt_alpha", 3, 8, 5, true, true, 0.25, 90));
  cases.push_back(matmul_add("tiny_2x3x1_empty_shards", 2, 3, 1, false, false, 1.0, 93));
  cases.push_back(matmul_add("k0_3x0x4", 3, 0, 4, false, false, 1.0, 96));
  OpTestCase big_add = matmul_add("large_67x129x131", 67, 129, 131, false, true, 1.0, 99);
  big_add.check_grad = false;
  big_add.rtol = big_add.atol = 1e-4;
  cases.push_back(big_add);
  return cases;
}

}  // namespace tessera::ops::testing
