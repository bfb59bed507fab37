// Reverse-mode autodiff over the logical graph: each op's gradient rule
// (ops/) emits backward ops through a GradEmitter that appends them here.

#include <map>
#include <set>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

// Appends emitted ops to the graph, tagged like the forward node they
// differentiate and marked backward.
class SymbolicGradEmitter final : public ops::GradEmitter {
 public:
  explicit SymbolicGradEmitter(Graph& graph) : graph_(graph) {}

  void SetContext(int64_t layer_idx, std::string scope) {
    options_.layer_idx = layer_idx;
    options_.scope = std::move(scope);
    options_.backward = true;
  }

  absl::StatusOr<std::vector<ValueId>> Emit(std::string_view op, const std::vector<ValueId>& inputs,
                                            const ops::AttrMap& attrs) override {
    return graph_.AddOp(op, inputs, attrs, options_);
  }
  TensorMeta Meta(ValueId value) const override { return graph_.value(value).meta; }

 private:
  Graph& graph_;
  NodeOptions options_;
};

// "%7 = matmul(%3, %4)" for error messages.
std::string DescribeNode(const Graph& graph, const Node& n) {
  std::vector<std::string> outs, ins;
  for (ValueId v : n.outputs) outs.push_back(ValueRef(v));
  for (ValueId v : n.inputs) ins.push_back(ValueRef(v));
  return StrCat(Join(outs, ", "), " = ", n.op, "(", Join(ins, ", "), ")");
}

}  // namespace

absl::StatusOr<GradientMap> Autodiff(Graph& graph, ValueId loss, const AutodiffOptions& options) {
  if (!graph.IsValidValue(loss)) return absl::InvalidArgumentError(StrCat("autodiff: loss ", ValueRef(loss), " does not exist"));
  const TensorMeta loss_meta = graph.value(loss).meta;
  if (loss_meta.shape.rank() != 0) {
    return absl::InvalidArgumentError(StrCat("autodiff: the loss ", ValueRef(loss), " is ", loss_meta.ToString(),
                                             "; it must be a scalar (reduce it first, e.g. with reduce_mean)"));
  }
  if (!IsFloatingPoint(loss_meta.dtype)) {
    return absl::InvalidArgumentError(StrCat("autodiff: the loss ", ValueRef(loss), " is ", loss_meta.ToString(),
                                             "; it must be floating point"));
  }

  std::vector<ValueId> wrt = options.wrt;
  if (wrt.empty()) {
    for (ValueId v : graph.Variables()) {
      if (graph.variable_info(v).trainable) wrt.push_back(v);
    }
  }
  const NodeId last = graph.value(loss).producer;  // nodes after it cannot affect the loss
  const size_t num_forward_values = static_cast<size_t>(graph.num_values());

  // Forward: which values depend on a wrt value through differentiable inputs.
  std::vector<bool> requires_grad(num_forward_values, false);
  for (ValueId v : wrt) {
    if (!graph.IsValidValue(v)) return absl::InvalidArgumentError(StrCat("autodiff: wrt value ", ValueRef(v), " does not exist"));
    requires_grad[static_cast<size_t>(v)] = true;
  }
  for (NodeId id = 0; id <= last; ++id) {
    const Node& n = graph.node(id);
    if (n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) {
      return absl::FailedPreconditionError(StrCat("autodiff: the graph has a '", n.op, "' node (", ValueRef(n.outputs[0]),
                                                  "); run autodiff before gradient accumulation"));
    }
    const ops::OpSchema* schema = graph.schema(n);
    if (schema == nullptr) continue;
    bool any = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      any = any || (schema->InputDifferentiable(static_cast<int>(i)) && requires_grad[static_cast<size_t>(n.inputs[i])]);
    }
    if (any) {
      for (ValueId out : n.outputs) requires_grad[static_cast<size_t>(out)] = true;
    }
  }

  // Backward: gradient contributions per forward value, summed on first use.
  std::vector<std::vector<ValueId>> contributions(num_forward_values);
  std::map<ValueId, ValueId> summed;
  auto sum_of = [&](ValueId v) -> absl::StatusOr<ValueId> {
    auto it = summed.find(v);
    if (it != summed.end()) return it->second;
    const std::vector<ValueId>& parts = contributions[static_cast<size_t>(v)];
    if (parts.empty()) return kNoValue;
    ValueId total = parts.front();
    for (size_t i = 1; i < parts.size(); ++i) {
      const NodeOptions at{.layer_idx = graph.producer(v).layer_idx,
                           .scope = StrCat("grad/", graph.producer(v).scope),
                           .name = "",
                           .backward = true};
      ASSIGN_OR_RETURN(std::vector<ValueId> out, graph.AddOp("add", {total, parts[i]}, {}, at));
      total = out.front();
    }
    // An activation laid out by a hint gets its gradient in the same layout
    // (partial entries broadcast: the gradient of a partial sum is the same
    // on every rank), so backward mirrors forward — Megatron's layout, where
    // the residual stream's gradient is reduced once per layer — rather than
    // whatever is locally cheapest.
    const Value& forward = graph.value(v);
    if (forward.sbp_hint && !graph.IsVariable(v) && !graph.value(total).sbp_hint) {
      NdSbp hint = *forward.sbp_hint;
      for (Sbp& s : hint) {
        if (s.is_partial()) s = Sbp::Broadcast();
      }
      RETURN_IF_ERROR(graph.SetHints(total, graph.value(total).placement_hint, hint));
    }
    summed[v] = total;
    return total;
  };

  const NodeOptions seed_at{.layer_idx = graph.node(last).layer_idx,
                            .scope = StrCat("grad/", graph.node(last).scope),
                            .name = "",
                            .backward = true};
  ASSIGN_OR_RETURN(std::vector<ValueId> seed,
                   graph.AddOp("ones", {}, {{"shape", std::vector<int64_t>{}}, {"dtype", loss_meta.dtype}}, seed_at));
  contributions[static_cast<size_t>(loss)].push_back(seed.front());

  SymbolicGradEmitter emitter(graph);
  for (NodeId id = last; id >= 0; --id) {
    const Node n = graph.node(id);  // a copy: emitting appends nodes
    const ops::OpSchema* schema = graph.schema(n);
    if (schema == nullptr) continue;
    bool any_output_grad = false;
    for (ValueId out : n.outputs) any_output_grad = any_output_grad || !contributions[static_cast<size_t>(out)].empty();
    bool any_input_needs = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      any_input_needs = any_input_needs || (schema->InputDifferentiable(static_cast<int>(i)) &&
                                            requires_grad[static_cast<size_t>(n.inputs[i])]);
    }
    if (!any_output_grad || !any_input_needs) continue;
    if (!schema->differentiable()) {
      return absl::UnimplementedError(StrCat("autodiff: op '", n.op, "' (node ", n.id, ": ", DescribeNode(graph, n),
                                             ") has no gradient rule, but the loss needs gradients through it"));
    }
    std::vector<ValueId> output_grads;
    for (ValueId out : n.outputs) {
      ASSIGN_OR_RETURN(ValueId g, sum_of(out));
      output_grads.push_back(g);
    }
    emitter.SetContext(n.layer_idx, StrCat("grad/", n.scope));
    ops::GradBuilder builder(emitter, n.op, n.inputs, n.outputs, output_grads, n.attrs);
    schema->grad()(builder);
    if (!builder.status().ok()) {
      return absl::Status(builder.status().code(),
                          StrCat("autodiff at node ", n.id, " (", DescribeNode(graph, n), "): ", builder.status().message()));
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId input = n.inputs[i];
      const ValueId g = builder.input_grads()[i];
      if (g == kNoValue || !schema->InputDifferentiable(static_cast<int>(i)) ||
          !requires_grad[static_cast<size_t>(input)]) {
        continue;
      }
      if (graph.value(g).meta != graph.value(input).meta) {
        return absl::InternalError(StrCat("autodiff: the gradient rule of '", n.op, "' gives input ", i, " (",
                                          ValueRef(input), " ", graph.value(input).meta.ToString(), ") a gradient of ",
                                          graph.value(g).meta.ToString()));
      }
      contributions[static_cast<size_t>(input)].push_back(g);
    }
  }

  GradientMap gradients;
  for (ValueId v : wrt) {
    ASSIGN_OR_RETURN(ValueId g, sum_of(v));
    if (g != kNoValue) gradients[v] = g;
  }
  return gradients;
}

absl::StatusOr<GradientMap> Autodiff(Graph& graph, const AutodiffOptions& options) {
  if (graph.losses().size() != 1) {
    return absl::InvalidArgumentError(
        StrCat("autodiff: the graph has ", graph.losses().size(), " marked losses; mark exactly one or pass it"));
  }
  return Autodiff(graph, graph.losses().front(), options);
}

}  // namespace tessera::graph
