// The op harness: every registered op, every case, three checks (see
// op_test_util.h), plus the coverage rules that make a missing case fail.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "core/tensor_util.h"
#include "core/text.h"
#include "ops/eager.h"
#include "ops/registry.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {

const std::vector<OpTestCase>& AllOpTestCases() {
  static const std::vector<OpTestCase>* const all = [] {
    auto* v = new std::vector<OpTestCase>();
    for (auto family : {ElementwiseCases, MatmulCases, NormSoftmaxCases, ShapeOpCases, ReduceCases, MiscCases, AttentionCases}) {
      for (OpTestCase& c : family()) v->push_back(std::move(c));
    }
    return v;
  }();
  return *all;
}


namespace {

// A partial max's combination, as the collectives' (a NaN wins).
double MaxNanWins(double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b); }

const OpSchema& SchemaOf(const OpTestCase& c) {
  const OpSchema* s = BuiltinOps().Find(c.op);
  TESSERA_CHECK(s != nullptr, "test case for unregistered op '", c.op, "'");
  return *s;
}

AttrMap Canonical(const OpTestCase& c) {
  auto attrs = SchemaOf(c).CanonicalizeAttrs(c.attrs);
  TESSERA_CHECK(attrs.ok(), attrs.status().ToString());
  return *attrs;
}

std::vector<Tensor> RunFull(const OpTestCase& c, const std::vector<Tensor>& inputs) {
  EagerOptions options;
  options.step = c.step;
  auto out = RunOp(c.op, inputs, c.attrs, options);
  TESSERA_CHECK(out.ok(), out.status().ToString());
  return *out;
}

// Element-wise closeness; returns "" or a description of the first failure.
std::string Compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.shape() != want.shape()) return StrCat("shape ", got.shape().ToString(), " vs ", want.shape().ToString());
  if (got.dtype() != want.dtype()) return StrCat("dtype ", DTypeName(got.dtype()), " vs ", DTypeName(want.dtype()));
  for (int64_t i = 0; i < got.NumElements(); ++i) {
    const double g = ElementAsDouble(got, i), w = ElementAsDouble(want, i);
    if (std::isnan(g) != std::isnan(w)) return StrCat("element ", i, ": ", g, " vs ", w);
    if (std::isnan(w) || g == w) continue;
    if (std::isinf(w) || std::isinf(g)) return StrCat("element ", i, ": ", g, " vs ", w);
    if (std::abs(g - w) > atol + rtol * std::abs(w)) return StrCat("element ", i, ": got ", g, ", want ", w);
  }
  return "";
}

class OpCaseTest : public ::testing::TestWithParam<size_t> {
 protected:
  const OpTestCase& Case() const { return AllOpTestCases()[GetParam()]; }
};

TEST_P(OpCaseTest, MatchesReference) {
  const OpTestCase& c = Case();
  ASSERT_TRUE(c.reference) << c.op << "/" << c.label << " has no reference";
  const std::vector<Tensor> got = RunFull(c, c.inputs);
  const std::vector<Tensor> want = c.reference(c.inputs, Canonical(c));
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(Compare(got[k], want[k], c.rtol, c.atol), "") << c.op << "/" << c.label << " output " << k;
  }
}

TEST_P(OpCaseTest, GradientMatchesFiniteDifferences) {
  const OpTestCase& c = Case();
  if (!SchemaOf(c).differentiable() || !c.check_grad) GTEST_SKIP() << "no gradient check for this case";
  const absl::StatusOr<GradientCheck> check = CheckGradient(c, BuiltinOps());
  ASSERT_TRUE(check.ok()) << check.status();
  int64_t elements = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (SchemaOf(c).InputDifferentiable(static_cast<int>(i)) && IsFloatingPoint(c.inputs[i].dtype())) {
      elements += c.inputs[i].NumElements();
    }
  }
  EXPECT_EQ(check->checked, elements) << c.op << "/" << c.label;
  EXPECT_EQ(check->mismatch, "");
}

// Splits `full` into p local pieces as `sbp` says.
std::vector<Tensor> SplitInput(const Tensor& full, const Sbp& sbp, int64_t p, uint64_t seed) {
  std::vector<Tensor> shards;
  if (sbp.is_split()) {
    for (int64_t r = 0; r < p; ++r) {
      auto slice = LocalSlice(full.shape(), {sbp}, {p}, r);
      TESSERA_CHECK(slice.ok(), slice.status().ToString());
      auto block = ExtractBlock(full, slice->offset, slice->local);
      TESSERA_CHECK(block.ok(), block.status().ToString());
      shards.push_back(*block);
    }
    return shards;
  }
  if (sbp.is_broadcast()) return std::vector<Tensor>(static_cast<size_t>(p), full);
  TESSERA_CHECK(IsFloatingPoint(full.dtype()), "partial SBP on a non-float input");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t r = 0; r < p; ++r) shards.push_back(full.Clone());
  for (int64_t i = 0; i < full.NumElements(); ++i) {
    const double x = ElementAsDouble(full, i);
    if (sbp.is_partial_sum() && (full.dtype() == DType::kBF16 || full.dtype() == DType::kF16)) {
      // Random parts would round in 16 bits and no longer sum to x; halves
      // do not: x/2, x/4, ..., and the last part again the one before it.
      double part = x;
      for (int64_t r = 0; r < p; ++r) {
        if (r + 1 < p) part /= 2;
        SetElementFromDouble(shards[static_cast<size_t>(r)], i, part);
      }
    } else if (sbp.is_partial_sum()) {
      double rest = x;
      for (int64_t r = 0; r + 1 < p; ++r) {
        const double part = dist(rng);
        SetElementFromDouble(shards[static_cast<size_t>(r)], i, part);
        rest -= part;
      }
      SetElementFromDouble(shards.back(), i, rest);
    } else {  // partial max: one owner holds x, the others something smaller
      const int64_t owner = static_cast<int64_t>(rng() % static_cast<uint64_t>(p));
      for (int64_t r = 0; r < p; ++r) {
        if (r != owner) SetElementFromDouble(shards[static_cast<size_t>(r)], i, x - 0.5 - std::abs(dist(rng)));
      }
    }
  }
  return shards;
}

TEST_P(OpCaseTest, EverySbpSignatureMatchesUnsplitRun) {
  const OpTestCase& c = Case();
  const OpSchema& schema = SchemaOf(c);
  if (!schema.has_sbp() || !c.check_sbp) GTEST_SKIP() << "no SBP check for this case";
  const AttrMap attrs = Canonical(c);
  std::vector<TensorMeta> metas;
  for (const Tensor& t : c.inputs) metas.push_back(t.meta());
  const std::vector<Tensor> full = RunFull(c, c.inputs);
  int checked = 0;
  for (int64_t p : {2, 3, 4}) {
    for (const SbpSignature& sig : schema.SbpSignatures(metas, attrs, p)) {
      SCOPED_TRACE(StrCat(c.op, "/", c.label, " p=", p, " signature ", sig.ToString()));
      ASSERT_EQ(sig.inputs.size(), c.inputs.size());
      ASSERT_EQ(sig.outputs.size(), full.size());
      std::vector<std::vector<Tensor>> split_inputs;
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        split_inputs.push_back(SplitInput(c.inputs[i], sig.inputs[i], p, 77 + i));
      }
      std::vector<std::vector<Tensor>> shard_outputs(full.size());
      for (int64_t r = 0; r < p; ++r) {
        KernelContext ctx;
        ctx.attrs = &attrs;
        ctx.step = c.step;
        for (size_t i = 0; i < c.inputs.size(); ++i) {
          ctx.inputs.push_back(split_inputs[i][static_cast<size_t>(r)]);
          auto slice = LocalSlice(c.inputs[i].shape(), {sig.inputs[i]}, {p}, r);
          ASSERT_TRUE(slice.ok()) << slice.status();
          ctx.input_slices.push_back(*slice);
        }
        for (size_t k = 0; k < full.size(); ++k) {
          auto slice = LocalSlice(full[k].shape(), {sig.outputs[k]}, {p}, r);
          ASSERT_TRUE(slice.ok()) << slice.status();
          auto out = Tensor::Empty(slice->local, full[k].dtype());
          ASSERT_TRUE(out.ok());
          ctx.outputs.push_back(*out);
          ctx.output_slices.push_back(*slice);
        }
        const absl::Status status = RunKernel(schema, ctx);
        ASSERT_TRUE(status.ok()) << status;
        for (size_t k = 0; k < full.size(); ++k) shard_outputs[k].push_back(ctx.outputs[k]);
      }
      for (size_t k = 0; k < full.size(); ++k) {
        const Sbp& sbp = sig.outputs[k];
        const double rtol = std::max(c.rtol, 1e-5) * 10, atol = std::max(c.atol, 1e-5) * 10;
        if (sbp.is_broadcast()) {
          for (int64_t r = 0; r < p; ++r) {
            EXPECT_EQ(Compare(shard_outputs[k][static_cast<size_t>(r)], full[k], rtol, atol), "")
                << "output " << k << " on shard " << r;
          }
          continue;
        }
        Tensor assembled = full[k].Clone();
        for (int64_t r = 0; r < p; ++r) {
          const Tensor& piece = shard_outputs[k][static_cast<size_t>(r)];
          if (sbp.is_split()) {
            auto slice = LocalSlice(full[k].shape(), {sbp}, {p}, r);
            ASSERT_TRUE(CopyBlock(piece, std::vector<int64_t>(slice->offset.size(), 0), assembled, slice->offset,
                                  slice->local).ok());
            continue;
          }
          for (int64_t i = 0; i < assembled.NumElements(); ++i) {
            const double v = ElementAsDouble(piece, i);
            const double acc = r == 0 ? v : ElementAsDouble(assembled, i);
            SetElementFromDouble(assembled, i, r == 0 ? v : (sbp.is_partial_sum() ? acc + v : MaxNanWins(acc, v)));
          }
        }
        EXPECT_EQ(Compare(assembled, full[k], rtol, atol), "") << "output " << k;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << c.op << " declares SBP signatures but none applied to this case";
}

std::string CaseName(const ::testing::TestParamInfo<size_t>& info) {
  const OpTestCase& c = AllOpTestCases()[info.param];
  std::string name = StrCat(c.op, "_", c.label, "_", info.param);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpCaseTest, ::testing::Range<size_t>(0, AllOpTestCases().size()), CaseName);

TEST(OpCoverage, EveryRegisteredOpHasCasesAndEveryCaseAnOp) {
  std::set<std::string> with_case, with_grad_case, with_sbp_case;
  for (const OpTestCase& c : AllOpTestCases()) {
    ASSERT_NE(BuiltinOps().Find(c.op), nullptr) << "case for unregistered op '" << c.op << "'";
    with_case.insert(c.op);
    if (c.check_grad) with_grad_case.insert(c.op);
    if (c.check_sbp) with_sbp_case.insert(c.op);
  }
  for (const std::string& name : BuiltinOps().Names()) {
    const OpSchema& schema = *BuiltinOps().Find(name);
    EXPECT_TRUE(with_case.count(name)) << "op '" << name << "' is registered without a test case";
    EXPECT_NE(schema.FindKernel(DeviceType::kCpu), nullptr) << "op '" << name << "' has no CPU kernel";
    if (schema.differentiable()) {
      EXPECT_TRUE(with_grad_case.count(name)) << "differentiable op '" << name << "' has no gradient-checked case";
    }
    EXPECT_TRUE(schema.has_sbp()) << "op '" << name << "' declares no SBP signatures";
    EXPECT_TRUE(with_sbp_case.count(name)) << "op '" << name << "' has no SBP-checked case";
  }
}

}  // namespace
}  // namespace tessera::ops::testing
