#include "graph/builder.h"

#include "core/text.h"

namespace tessera::graph {

const TensorMeta& Sym::meta() const {
  static const TensorMeta kEmpty{};
  return valid() ? builder_->graph_.value(id_).meta : kEmpty;
}

GraphBuilder::GraphBuilder(const ops::OpRegistry* registry) : graph_(registry) {}

void GraphBuilder::Fail(absl::Status status) {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

bool GraphBuilder::CheckSyms(std::string_view what, const std::vector<Sym>& syms) {
  if (!status_.ok()) return false;
  for (size_t i = 0; i < syms.size(); ++i) {
    if (syms[i].builder() != this) {
      Fail(absl::InvalidArgumentError(StrCat(what, ": operand ", i, syms[i].builder() == nullptr
                                                                        ? " is an invalid (default) Sym"
                                                                        : " belongs to another GraphBuilder")));
      return false;
    }
  }
  return true;
}

std::vector<Sym> GraphBuilder::Op(std::string_view op, const std::vector<Sym>& inputs, const ops::AttrMap& attrs) {
  if (!CheckSyms(StrCat("op '", op, "'"), inputs)) return {};
  std::vector<ValueId> ids;
  for (const Sym& s : inputs) ids.push_back(s.id());
  auto outputs = graph_.AddOp(op, ids, attrs,
                              {.layer_idx = layer_idx(), .scope = scope(), .name = "", .checkpoint_segment = checkpoint_segment()});
  if (!outputs.ok()) {
    Fail(outputs.status());
    return {};
  }
  std::vector<Sym> syms;
  for (ValueId id : *outputs) syms.emplace_back(this, id);
  return syms;
}

Sym GraphBuilder::Apply(std::string_view op, const std::vector<Sym>& inputs, const ops::AttrMap& attrs) {
  std::vector<Sym> outputs = Op(op, inputs, attrs);
  return outputs.empty() ? Sym() : outputs.front();
}

Sym GraphBuilder::Variable(std::string_view name, const Shape& shape, const InitRule& init,
                           VariableOptions options) {
  if (!status_.ok()) return Sym();
  if (options.layer_idx == kUnassignedLayer) options.layer_idx = layer_idx();
  if (options.scope.empty()) options.scope = scope();
  std::string full = scope().empty() ? std::string(name) : StrCat(scope(), ".", name);
  auto id = graph_.AddVariable(std::move(full), shape, init, options);
  if (!id.ok()) {
    Fail(id.status());
    return Sym();
  }
  return Sym(this, *id);
}

Sym GraphBuilder::Input(std::string name, const TensorMeta& meta) {
  if (!status_.ok()) return Sym();
  auto id = graph_.AddInput(std::move(name), meta, {.layer_idx = layer_idx(), .scope = scope(), .name = ""});
  if (!id.ok()) {
    Fail(id.status());
    return Sym();
  }
  return Sym(this, *id);
}

void GraphBuilder::MarkLoss(const Sym& loss) {
  if (CheckSyms("MarkLoss", {loss})) Fail(graph_.MarkLoss(loss.id()));
}

void GraphBuilder::MarkFetch(std::string name, const Sym& value) {
  if (CheckSyms(StrCat("MarkFetch '", name, "'"), {value})) Fail(graph_.MarkFetch(std::move(name), value.id()));
}

void GraphBuilder::SetHints(const Sym& value, std::optional<Placement> placement, std::optional<NdSbp> sbp) {
  if (CheckSyms("SetHints", {value})) Fail(graph_.SetHints(value.id(), std::move(placement), std::move(sbp)));
}

GraphBuilder::ScopeGuard GraphBuilder::Scope(std::string_view name, int64_t layer_idx) {
  std::string full = scope().empty() ? std::string(name) : StrCat(scope(), ".", name);
  scopes_.push_back({std::move(full), layer_idx != kUnassignedLayer ? layer_idx : this->layer_idx(), checkpoint_segment()});
  return ScopeGuard(this);
}

GraphBuilder::ScopeGuard GraphBuilder::Recomputable() {
  scopes_.push_back({scope(), layer_idx(), next_segment_++});
  return ScopeGuard(this);
}

int64_t GraphBuilder::checkpoint_segment() const { return scopes_.empty() ? kNoSegment : scopes_.back().segment; }

GraphBuilder::ScopeGuard::~ScopeGuard() { builder_->scopes_.pop_back(); }

const std::string& GraphBuilder::scope() const {
  static const std::string kNone;
  return scopes_.empty() ? kNone : scopes_.back().name;
}

int64_t GraphBuilder::layer_idx() const { return scopes_.empty() ? kUnassignedLayer : scopes_.back().layer_idx; }

absl::StatusOr<Graph> GraphBuilder::Finish() {
  if (!status_.ok()) return status_;
  Graph out = std::move(graph_);
  graph_ = Graph(&out.registry());
  status_ = absl::FailedPreconditionError("GraphBuilder::Finish was called; the builder is spent");
  return out;
}

// ---- Operators and helpers.
namespace {

// The builder of the first valid operand; null when none (the result is then
// invalid, and the error — if any — is already in that builder).
GraphBuilder* BuilderOf(std::initializer_list<const Sym*> syms) {
  for (const Sym* s : syms) {
    if (s->builder() != nullptr) return s->builder();
  }
  return nullptr;
}

Sym Unary(std::string_view op, const Sym& x, const ops::AttrMap& attrs = {}) {
  GraphBuilder* b = BuilderOf({&x});
  return b ? b->Apply(op, {x}, attrs) : Sym();
}

Sym Binary(std::string_view op, const Sym& a, const Sym& y, const ops::AttrMap& attrs = {}) {
  GraphBuilder* b = BuilderOf({&a, &y});
  return b ? b->Apply(op, {a, y}, attrs) : Sym();
}

}  // namespace

Sym operator+(const Sym& a, const Sym& b) { return Binary("add", a, b); }
Sym operator-(const Sym& a, const Sym& b) { return Binary("sub", a, b); }
Sym operator*(const Sym& a, const Sym& b) { return Binary("mul", a, b); }
Sym operator/(const Sym& a, const Sym& b) { return Binary("div", a, b); }
Sym operator-(const Sym& x) { return Unary("neg", x); }
Sym operator+(const Sym& x, double c) { return Unary("scalar_add", x, {{"value", c}}); }
Sym operator+(double c, const Sym& x) { return x + c; }
Sym operator-(const Sym& x, double c) { return x + (-c); }
Sym operator-(double c, const Sym& x) { return (-x) + c; }
Sym operator*(const Sym& x, double c) { return Unary("scalar_mul", x, {{"value", c}}); }
Sym operator*(double c, const Sym& x) { return x * c; }
Sym operator/(const Sym& x, double c) { return x * (1.0 / c); }

Sym Matmul(const Sym& a, const Sym& b, const MatmulOptions& options) {
  return Binary("matmul", a, b,
                {{"transpose_a", options.transpose_a}, {"transpose_b", options.transpose_b}, {"alpha", options.alpha}});
}
Sym BatchMatmul(const Sym& a, const Sym& b, const MatmulOptions& options) {
  return Binary("batch_matmul", a, b,
                {{"transpose_a", options.transpose_a}, {"transpose_b", options.transpose_b}, {"alpha", options.alpha}});
}
Sym BiasAdd(const Sym& x, const Sym& bias) { return Binary("bias_add", x, bias); }
Sym MatmulBias(const Sym& x, const Sym& weight, const Sym& bias) {
  GraphBuilder* b = BuilderOf({&x, &weight, &bias});
  return b ? b->Apply("matmul_bias", {x, weight, bias}) : Sym();
}
Sym Gelu(const Sym& x, std::string_view approximate) {
  return Unary("gelu", x, {{"approximate", std::string(approximate)}});
}
Sym Relu(const Sym& x) { return Unary("relu", x); }
Sym Silu(const Sym& x) { return Unary("silu", x); }
Sym Tanh(const Sym& x) { return Unary("tanh", x); }
Sym Exp(const Sym& x) { return Unary("exp", x); }
Sym Log(const Sym& x) { return Unary("log", x); }
Sym Sqrt(const Sym& x) { return Unary("sqrt", x); }
Sym Rsqrt(const Sym& x) { return Unary("rsqrt", x); }
Sym Pow(const Sym& x, double exponent) { return Unary("scalar_pow", x, {{"exponent", exponent}}); }
Sym Softmax(const Sym& x) { return Unary("softmax", x); }
Sym LogSoftmax(const Sym& x) { return Unary("log_softmax", x); }
Sym ReduceSum(const Sym& x, std::vector<int64_t> axes, bool keepdim) {
  return Unary("reduce_sum", x, {{"axes", std::move(axes)}, {"keepdim", keepdim}});
}
Sym ReduceMean(const Sym& x, std::vector<int64_t> axes, bool keepdim) {
  return Unary("reduce_mean", x, {{"axes", std::move(axes)}, {"keepdim", keepdim}});
}
Sym Reshape(const Sym& x, const Shape& shape) { return Unary("reshape", x, {{"shape", shape.dims()}}); }
Sym Transpose(const Sym& x, std::vector<int64_t> perm) { return Unary("transpose", x, {{"perm", std::move(perm)}}); }
Sym Cast(const Sym& x, DType dtype) { return Unary("cast", x, {{"dtype", dtype}}); }
Sym SparseSoftmaxCrossEntropy(const Sym& logits, const Sym& labels) {
  return Binary("sparse_softmax_cross_entropy", logits, labels);
}

}  // namespace tessera::graph
