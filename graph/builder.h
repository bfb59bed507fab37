#pragma once
// The builder API: what nn/, models/ and embedding users call to write a
// model in global view (DESIGN §6). A GraphBuilder owns a Graph; a Sym is a
// symbolic tensor handle with arithmetic operators, so model code reads like
// PyTorch module code:
//
//   GraphBuilder b;
//   Sym x = b.Input("x", {DType::kF32, Shape{8, 5}});                 // (B, 5)
//   Sym w = b.Variable("fc.weight", {5, 7}, InitRule::Normal(0, 0.02, seed, 0));
//   Sym h = Gelu(Matmul(x, w) + bias);                                 // (B, 7)
//   b.MarkLoss(ReduceMean(SparseSoftmaxCrossEntropy(logits, labels)));
//   ASSIGN_OR_RETURN(Graph graph, b.Finish());
//
// Errors are STICKY rather than returned per call, so expressions compose
// without error plumbing: the first failure (bad shapes, unknown op, handles
// from another builder) is recorded in status(); every later call is a no-op
// returning an invalid Sym; Finish() returns that first error. The message
// names the op and the input shapes (from shape inference). Check status()
// or Finish() once after building.
//
// Scopes prefix variable names and tag nodes ("h.0" + "ln_1.weight" ->
// "h.0.ln_1.weight"); a scope may set the pipeline layer_idx of everything
// created inside it.
//
// Not thread-safe. A Sym borrows its builder, which must outlive it; the
// builder is neither copyable nor movable for that reason.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace tessera::graph {

class GraphBuilder;

// A symbolic tensor: a value id in its builder's graph. Cheap to copy.
// Default-constructed or produced after an error it is invalid; operations on
// invalid Syms yield invalid Syms (the builder holds the error).
class Sym {
 public:
  Sym() = default;
  Sym(GraphBuilder* builder, ValueId id) : builder_(builder), id_(id) {}

  bool valid() const { return builder_ != nullptr && id_ != kNoValue; }
  ValueId id() const { return id_; }
  GraphBuilder* builder() const { return builder_; }
  // Meta of a valid Sym; an empty f32 scalar meta for an invalid one.
  const TensorMeta& meta() const;
  const Shape& shape() const { return meta().shape; }
  DType dtype() const { return meta().dtype; }
  int rank() const { return shape().rank(); }

 private:
  GraphBuilder* builder_ = nullptr;
  ValueId id_ = kNoValue;
};

class GraphBuilder {
 public:
  // `registry` null = ops::BuiltinOps(); borrowed.
  explicit GraphBuilder(const ops::OpRegistry* registry = nullptr);
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  // Applies a registered op; returns all its outputs (empty after an error).
  std::vector<Sym> Op(std::string_view op, const std::vector<Sym>& inputs, const ops::AttrMap& attrs = {});
  // Applies an op and returns its first output.
  Sym Apply(std::string_view op, const std::vector<Sym>& inputs, const ops::AttrMap& attrs = {});

  // A variable named `scope.name`; `options.layer_idx` / `scope` default to
  // the current scope's.
  Sym Variable(std::string_view name, const Shape& shape, const InitRule& init, VariableOptions options = {});
  // A graph input fed per iteration (not prefixed by the scope).
  Sym Input(std::string name, const TensorMeta& meta);

  void MarkLoss(const Sym& loss);
  void MarkFetch(std::string name, const Sym& value);
  // (A placement hint is not supported yet: Engine::Compile refuses it.
  // An input's or a variable's sbp is split or broadcast, never partial.)
  void SetHints(const Sym& value, std::optional<Placement> placement, std::optional<NdSbp> sbp);

  // RAII scope: `auto scope = b.Scope("h.0", 0);` — ends when it goes out of scope.
  class [[nodiscard]] ScopeGuard {
   public:
    explicit ScopeGuard(GraphBuilder* builder) : builder_(builder) {}
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;
    ~ScopeGuard();

   private:
    GraphBuilder* builder_;
  };
  // kUnassignedLayer keeps the enclosing scope's layer; -1 is the last stage.
  ScopeGuard Scope(std::string_view name, int64_t layer_idx = kUnassignedLayer);
  // RAII: the ops applied until it ends form one recomputable segment (a
  // transformer layer): with activation checkpointing on, backward
  // recomputes them from the segment's inputs instead of keeping their
  // outputs (Node::checkpoint_segment). Same scope name and layer.
  ScopeGuard Recomputable();
  const std::string& scope() const;
  int64_t layer_idx() const;
  int64_t checkpoint_segment() const;

  // The first error, or OK.
  const absl::Status& status() const { return status_; }
  // Records an error (kept only if it is the first). For helpers built on top.
  void Fail(absl::Status status);

  const Graph& graph() const { return graph_; }
  Graph& mutable_graph() { return graph_; }
  // The graph, or the first error. Moves the graph out: the builder and its
  // Syms must not be used afterwards.
  absl::StatusOr<Graph> Finish();

 private:
  friend class Sym;
  struct ScopeFrame {
    std::string name;  // full dotted name
    int64_t layer_idx;
    int64_t segment = kNoSegment;
  };
  bool CheckSyms(std::string_view what, const std::vector<Sym>& syms);

  Graph graph_;
  absl::Status status_;
  std::vector<ScopeFrame> scopes_;
  int64_t next_segment_ = 0;
};

// ---- Operators and helpers. All emit registered ops into the operands'
// builder; binary ops broadcast (numpy rules).
Sym operator+(const Sym& a, const Sym& b);  // add
Sym operator-(const Sym& a, const Sym& b);  // sub
Sym operator*(const Sym& a, const Sym& b);  // mul
Sym operator/(const Sym& a, const Sym& b);  // div
Sym operator-(const Sym& x);                // neg
Sym operator+(const Sym& x, double c);      // scalar_add
Sym operator+(double c, const Sym& x);
Sym operator-(const Sym& x, double c);
Sym operator-(double c, const Sym& x);
Sym operator*(const Sym& x, double c);      // scalar_mul
Sym operator*(double c, const Sym& x);
Sym operator/(const Sym& x, double c);

struct MatmulOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  double alpha = 1.0;
};
Sym Matmul(const Sym& a, const Sym& b, const MatmulOptions& options = {});
Sym BatchMatmul(const Sym& a, const Sym& b, const MatmulOptions& options = {});
Sym BiasAdd(const Sym& x, const Sym& bias);
// x (M, K) @ weight (K, N) + bias (N,) as one op (the GEMM's epilogue adds
// the bias): the bits of BiasAdd(Matmul(x, weight), bias).
Sym MatmulBias(const Sym& x, const Sym& weight, const Sym& bias);
Sym Gelu(const Sym& x, std::string_view approximate = "none");
Sym Relu(const Sym& x);
Sym Silu(const Sym& x);
Sym Tanh(const Sym& x);
Sym Exp(const Sym& x);
Sym Log(const Sym& x);
Sym Sqrt(const Sym& x);
Sym Rsqrt(const Sym& x);
Sym Pow(const Sym& x, double exponent);
Sym Softmax(const Sym& x);
Sym LogSoftmax(const Sym& x);
Sym ReduceSum(const Sym& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Sym ReduceMean(const Sym& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Sym Reshape(const Sym& x, const Shape& shape);
Sym Transpose(const Sym& x, std::vector<int64_t> perm);
Sym Cast(const Sym& x, DType dtype);
// Per-row loss (N,) of logits (N, V) against class ids (N,).
Sym SparseSoftmaxCrossEntropy(const Sym& logits, const Sym& labels);

}  // namespace tessera::graph
