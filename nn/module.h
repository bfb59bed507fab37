#pragma once
// nn::Module: the base of the layers in nn/ (DESIGN §6). Layers are written
// in global view: they emit ops into a graph::GraphBuilder and never mention a
// device, a stream or a collective. Parallelism is expressed only through SBP
// hints on parameters (and on graph inputs, by models), with one fixed
// convention that the scheduler implements:
//
//   a hint is a 2-entry NdSbp over the mesh of the layer's stage:
//     (data-parallel axis, tensor-parallel axis)
//   the stage comes from the layer's layer_idx (0 = first, -1 = last, as
//   LiBai's; graph::kUnassignedLayer: the scheduler runs it on the latest
//   stage among its inputs').
//
//   parameter                               hint
//   Linear "col" weight (in, out)           (B, S(1))   output features split
//   Linear "col" bias (out)                 (B, S(0))
//   Linear "row" weight (in, out)           (B, S(0))   input features split; output P over tp
//   Linear "row" bias (out)                 (B, B)      added after the output is made B
//   Linear "data", LayerNorm, Embedding     (B, B)
//   VocabEmbedding weight (vocab, hidden)   (B, S(0))   vocabulary split
//   graph inputs (batch-major)              (S(0), B)   batch split over data parallel
//   the residual stream (TransformerLayer)  (S(0), B)   whole on every tp rank
//
// Activations are otherwise left to SBP inference. The residual-stream hint
// (LiBai's to_global(sbp=[S(0), B]) at the same points) is what makes the
// greedy inference take Megatron's layout: from a tp-replicated input the
// column matmul B x S(1) is free, and each row-parallel output (P) pays one
// all-reduce back into the stream; without it, inference prefers to
// all-gather the (smaller) weights.
//
// How a module reaches the GraphBuilder: through the Syms it is called on.
// A module is constructed with its sizes and options only (no builder, no
// graph), like a PyTorch module; its parameters are DECLARED in the
// constructor (name, shape, init, hint) and MATERIALISED as graph variables
// the first time the module is called, in the builder of the Sym it is called
// on (Sym::builder()). From then on the module is bound to that builder:
// calling it again (weight sharing: the same variables are reused) with Syms
// of another builder is an error recorded in the builder. So a model builds a
// fresh module tree per graph (modules are cheap), and tests can list a tree's
// parameter names, shapes and hints before building anything
// (NamedParameters()).
//
// Names: a parent registers each child under a local name in its constructor
// (RegisterModule("attn", attn_)); a parameter's graph name is the dotted path
// from the root ("h.0.attn.c_attn.weight"), independent of any builder scope
// the caller may have opened. While a module runs it opens a builder scope
// named after itself with its layer_idx, so every node it emits is tagged
// with its scope and pipeline layer (nested calls nest: "h.0.attn").
// layer_idx -1 (graph::kLastLayer) is the last stage, as LiBai's;
// graph::kUnassignedLayer keeps the enclosing scope's layer, which is
// unassigned at the top level (the scheduler then places a node after its
// inputs).
//
// Randomness (DESIGN §4): a parameter's init draws from Philox keyed by
// (init seed, tensor_id = StreamKey(full name)); a dropout site by (dropout
// seed, StreamKey(site name and call index), step, global index). Keys come
// from names, not creation order, so they do not depend on how the graph was
// built, and every site has its own stream. Seeds are set on any module with
// set_seeds() and inherited by its descendants (default RandomSeeds{}).
//
// Errors follow the builder's sticky-error rule: a module called on an
// invalid Sym returns an invalid Sym; failures are recorded in the builder
// and surface from GraphBuilder::Finish().
//
// Ownership: a module owns its parameter declarations and, by value, its
// child modules (members of the derived class); RegisterModule only records a
// pointer to a member, so modules are neither copyable nor movable (hold
// containers of them as std::vector<std::unique_ptr<...>>). Variables belong
// to the builder's graph; a module keeps their Syms. Not thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/sbp.h"
#include "core/shape.h"
#include "graph/builder.h"

namespace tessera::nn {

using graph::GraphBuilder;
using graph::Sym;

// ---- The hint convention (see above).
NdSbp Replicated();                 // (B, B)
NdSbp TensorParallelSplit(int axis);  // (B, S(axis))
NdSbp BatchSplit();                 // (S(0), B): batch-major activations and graph inputs

// A 32-bit key for a random stream (a Philox counter word), from a name
// (FNV-1a): the same name always gives the same key.
int64_t StreamKey(std::string_view name);

struct RandomSeeds {
  int64_t init = 0;     // parameter init (normal)
  int64_t dropout = 1;  // dropout masks
};

// How a parameter gets its first value.
struct ParameterInit {
  enum class Kind : uint8_t { kNormal, kZeros, kOnes };
  Kind kind = Kind::kZeros;
  double mean = 0;
  double std = 0;

  static ParameterInit Normal(double std, double mean = 0) { return {Kind::kNormal, mean, std}; }
  static ParameterInit Zeros() { return {Kind::kZeros, 0, 0}; }
  static ParameterInit Ones() { return {Kind::kOnes, 0, 0}; }
};

// A declared parameter (name local to its module).
struct ParameterSpec {
  std::string name;
  Shape shape;
  ParameterInit init;
  NdSbp sbp;
  // nullopt: the optimizer's name patterns decide (biases and norms excluded).
  std::optional<bool> weight_decay = std::nullopt;
};

struct NamedParameter {
  std::string name;           // full dotted name, e.g. "h.0.ln_1.weight"
  const ParameterSpec* spec;  // owned by the module
  Sym value;                  // invalid until the module is materialised
};

class Module {
 public:
  explicit Module(int64_t layer_idx = 0) : layer_idx_(layer_idx) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The local name given by the parent ("" for a root).
  const std::string& name() const { return name_; }
  // The dotted path from the root ("h.0.attn"; "" for a root).
  std::string full_name() const;
  int64_t layer_idx() const { return layer_idx_; }

  void set_seeds(RandomSeeds seeds) { seeds_ = seeds; }
  // This module's seeds, else the nearest ancestor's, else RandomSeeds{}.
  RandomSeeds seeds() const;

  // Every parameter of this module and its descendants, depth first in
  // registration order (own parameters before children's).
  std::vector<NamedParameter> NamedParameters() const;
  // One of this module's own parameters by local name (invalid Sym before
  // materialisation; CHECK-fails on an undeclared name, a bug in the layer).
  Sym parameter(std::string_view local_name) const;

  // Creates the variables of this module and all its descendants in `b`
  // (those not created yet). Calling a module does this for its own.
  void Materialize(GraphBuilder& b);

 protected:
  // Records `child` (a member of the derived class) under `name`.
  void RegisterModule(std::string name, Module& child);
  void DeclareParameter(ParameterSpec spec);

  // Start of every Forward: the builder of `x` after binding the module to it
  // and materialising its own parameters, or null (return an invalid Sym)
  // when `x` is invalid, the builder already failed, or the module is bound
  // to another builder (recorded as an error).
  GraphBuilder* Prepare(const Sym& x);
  // A scope for the nodes this call emits: the module's name and layer_idx.
  GraphBuilder::ScopeGuard EnterScope(GraphBuilder& b) const { return b.Scope(name_, layer_idx_); }

 private:
  bool Bind(GraphBuilder& b);
  void MaterializeOwn(GraphBuilder& b);

  std::string name_;
  int64_t layer_idx_;
  Module* parent_ = nullptr;
  std::optional<RandomSeeds> seeds_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<ParameterSpec> specs_;
  std::vector<Sym> values_;  // parallel to specs_
  GraphBuilder* builder_ = nullptr;
};

}  // namespace tessera::nn
