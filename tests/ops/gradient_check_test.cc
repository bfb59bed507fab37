// The gradient check must see a wrong rule. A GELU rule that ignores
// `approximate` differs from the right one by at most 9e-4 (the exact and
// tanh derivatives are that close), which the old f32 finite differences
// (atol 2e-3) let through. Here the harness's checker runs on registries
// whose gelu / bias_gelu rule emits the gradient op of the other variant,
// and must report a mismatch well beyond its tolerance; the built-in rules
// must pass the same check.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "tests/ops/op_test_util.h"

namespace tessera::ops::testing {
namespace {

std::string OtherVariant(const std::string& approximate) { return approximate == "tanh" ? "none" : "tanh"; }

// Tessera's ops, with `op`'s gradient rule replaced by `rule`.
std::unique_ptr<OpRegistry> WithRule(const std::string& op, GradFn rule) {
  auto registry = std::make_unique<OpRegistry>();
  for (const std::string& name : BuiltinOps().Names()) {
    OpSchema schema = *BuiltinOps().Find(name);
    if (name == op) schema.Grad(rule);
    registry->MustRegister(std::move(schema));
  }
  return registry;
}

// gelu's rule as registered, except that it asks gelu_grad for the other
// variant than the forward op used.
void GeluRuleIgnoringApproximate(GradBuilder& b) {
  b.SetInputGrad(0, b.Op("gelu_grad", {b.input(0), b.output_grad(0)},
                         {{"approximate", OtherVariant(b.attrs().String("approximate"))}}));
}

// Likewise for the fused bias_gelu.
void BiasGeluRuleIgnoringApproximate(GradBuilder& b) {
  const ValueId dh = b.Op("bias_gelu_grad", {b.input(0), b.input(1), b.output_grad(0)},
                          {{"approximate", OtherVariant(b.attrs().String("approximate"))}});
  b.SetInputGrad(0, dh);
  b.SetInputGrad(1, b.SumToShape(dh, b.meta(b.input(1)).shape));
}

// The harness's cases of `op` (one per variant).
std::vector<const OpTestCase*> CasesOf(const std::string& op) {
  std::vector<const OpTestCase*> found;
  for (const OpTestCase& c : AllOpTestCases()) {
    if (c.op == op && c.check_grad) found.push_back(&c);
  }
  return found;
}

void ExpectCheckerSeesSwap(const std::string& op, GradFn wrong_rule) {
  const std::unique_ptr<OpRegistry> swapped = WithRule(op, std::move(wrong_rule));
  const std::vector<const OpTestCase*> cases = CasesOf(op);
  ASSERT_EQ(cases.size(), 2u) << "expected an exact and a tanh case of " << op;
  for (const OpTestCase* c : cases) {
    SCOPED_TRACE(c->op + "/" + c->label);
    const absl::StatusOr<GradientCheck> right = CheckGradient(*c, BuiltinOps());
    ASSERT_TRUE(right.ok()) << right.status();
    EXPECT_EQ(right->mismatch, "");
    EXPECT_LT(right->worst, 0.2) << "the built-in rule should pass with room to spare";

    const absl::StatusOr<GradientCheck> wrong = CheckGradient(*c, *swapped);
    ASSERT_TRUE(wrong.ok()) << wrong.status();
    EXPECT_NE(wrong->mismatch, "") << "a rule for the other GELU variant passed the gradient check";
    EXPECT_GT(wrong->worst, 10.0) << "the wrong rule fails, but not by a wide margin";
  }
}

TEST(GradientCheck, SeesGeluRuleThatIgnoresApproximate) {
  ExpectCheckerSeesSwap("gelu", GeluRuleIgnoringApproximate);
}

TEST(GradientCheck, SeesBiasGeluRuleThatIgnoresApproximate) {
  ExpectCheckerSeesSwap("bias_gelu", BiasGeluRuleIgnoringApproximate);
}

}  // namespace
}  // namespace tessera::ops::testing
