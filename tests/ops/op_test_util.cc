#include "tests/ops/op_test_util.h"

#include <random>

#include "core/status.h"

namespace tessera::ops::testing {

OpTestCase MakeCase(std::string op, std::string label, std::vector<Tensor> inputs, ReferenceFn reference,
                    AttrMap attrs) {
  OpTestCase c;
  c.op = std::move(op);
  c.label = std::move(label);
  c.inputs = std::move(inputs);
  c.reference = std::move(reference);
  c.attrs = std::move(attrs);
  return c;
}

Tensor RandomUniform(const Shape& shape, uint64_t seed, float low, float high) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  return FilledF32(shape, [&](int64_t) { return dist(rng); });
}

Tensor RandomInts(const Shape& shape, uint64_t seed, int64_t low, int64_t high, DType dtype) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(low, high - 1);
  auto t = Tensor::Empty(shape, dtype);
  TESSERA_CHECK(t.ok());
  for (int64_t i = 0; i < t->NumElements(); ++i) SetElementFromDouble(*t, i, static_cast<double>(dist(rng)));
  return *t;
}

Tensor RandomBools(const Shape& shape, uint64_t seed, double p_true) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution dist(p_true);
  auto t = Tensor::Empty(shape, DType::kBool);
  TESSERA_CHECK(t.ok());
  for (int64_t i = 0; i < t->NumElements(); ++i) t->data<bool>()[i] = dist(rng);
  return *t;
}

Tensor FilledF32(const Shape& shape, const std::function<float(int64_t)>& fn) {
  auto t = Tensor::Empty(shape, DType::kF32);
  TESSERA_CHECK(t.ok());
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->NumElements(); ++i) p[i] = fn(i);
  return *t;
}

Tensor ZerosF32(const Shape& shape) {
  auto t = Tensor::Zeros(shape, DType::kF32);
  TESSERA_CHECK(t.ok());
  return *t;
}

}  // namespace tessera::ops::testing
