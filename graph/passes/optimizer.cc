// The optimizer pass: gradient clipping and one update op per variable.

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

absl::StatusOr<ValueId> First(absl::StatusOr<std::vector<ValueId>> outputs) {
  if (!outputs.ok()) return outputs.status();
  return outputs->front();
}

// A zero-initialised, non-trainable state variable shaped like `variable`.
absl::StatusOr<ValueId> AddState(Graph& graph, ValueId variable, std::string_view suffix) {
  const Value v = graph.value(variable);  // copies: AddVariable appends to the graph
  const Node& n = graph.producer(variable);
  VariableOptions options;
  options.trainable = false;
  options.dtype = v.meta.dtype;
  options.weight_decay = false;
  options.placement = v.placement_hint;
  options.sbp = v.sbp_hint;
  options.layer_idx = n.layer_idx;
  options.scope = n.scope;
  return graph.AddVariable(StrCat(v.name, ".", suffix), v.meta.shape, InitRule::Zeros(), options);
}

// The global p-norm of every gradient, as torch.nn.utils.clip_grad_norm_
// computes it: (Σ |g|^p)^(1/p) (for p = 2 the square_sum of each, as ever),
// or max |g| for p = infinity. An f32 scalar. A p past f32's range is
// infinity too (its limit): the kernels' f32 exponent would be inf, and
// 1/p zero, and the norm came out 0 (clipping off) or 1.
absl::StatusOr<ValueId> GlobalNorm(Graph& graph, const GradientMap& gradients, double p, const NodeOptions& at) {
  const bool inf = std::isinf(p) || p > std::numeric_limits<float>::max();
  ValueId total = kNoValue;
  std::vector<ValueId> maxima;  // p = inf: each gradient's max |g|, as (1,)
  for (const auto& [var, grad] : gradients) {
    ValueId g = grad;
    if (graph.value(g).meta.dtype != DType::kF32) {
      ASSIGN_OR_RETURN(g, First(graph.AddOp("cast", {g}, {{"dtype", DType::kF32}}, at)));
    }
    if (p == 2.0) {
      ASSIGN_OR_RETURN(g, First(graph.AddOp("square_sum", {g}, {}, at)));
    } else {
      ASSIGN_OR_RETURN(g, First(graph.AddOp("abs", {g}, {}, at)));
      if (inf) {
        // A split gradient's max is a partial max, combined by the boxing.
        ASSIGN_OR_RETURN(g, First(graph.AddOp("reduce_max", {g}, {}, at)));
        ASSIGN_OR_RETURN(g, First(graph.AddOp("reshape", {g}, {{"shape", std::vector<int64_t>{1}}}, at)));
        maxima.push_back(g);
        continue;
      }
      if (p != 1.0) {
        ASSIGN_OR_RETURN(g, First(graph.AddOp("scalar_pow", {g}, {{"exponent", p}}, at)));
      }
      ASSIGN_OR_RETURN(g, First(graph.AddOp("reduce_sum", {g}, {}, at)));
    }
    if (total == kNoValue) {
      total = g;
    } else {
      ASSIGN_OR_RETURN(total, First(graph.AddOp("add", {total, g}, {}, at)));
    }
  }
  if (inf) {
    // The largest of the maxima, exactly (the op set has no element-wise max).
    ASSIGN_OR_RETURN(ValueId all, First(graph.AddOp("concat", maxima, {{"axis", int64_t{0}}}, at)));
    return First(graph.AddOp("reduce_max", {all}, {}, at));
  }
  if (p == 2.0) return First(graph.AddOp("sqrt", {total}, {}, at));
  if (p == 1.0) return total;
  return First(graph.AddOp("scalar_pow", {total}, {{"exponent", 1.0 / p}}, at));
}

// Scales every gradient by min(1, max_norm / (norm + 1e-6)), norm the global
// p-norm of all of them (torch.nn.utils.clip_grad_norm_). Returns the norm.
absl::StatusOr<ValueId> ClipByGlobalNorm(Graph& graph, GradientMap& gradients, double max_norm, double norm_type) {
  const NodeOptions at{.layer_idx = kUnassignedLayer, .scope = "optimizer/clip", .name = ""};  // after its inputs
  ASSIGN_OR_RETURN(ValueId norm, GlobalNorm(graph, gradients, norm_type, at));
  ASSIGN_OR_RETURN(ValueId denominator, First(graph.AddOp("scalar_add", {norm}, {{"value", 1e-6}}, at)));
  ASSIGN_OR_RETURN(ValueId max_value, First(graph.AddOp(
      "fill", {}, {{"shape", std::vector<int64_t>{}}, {"dtype", DType::kF32}, {"value", max_norm}}, at)));
  ASSIGN_OR_RETURN(ValueId ratio, First(graph.AddOp("div", {max_value, denominator}, {}, at)));
  // min(1, r) = 1 - relu(1 - r): the op set has no element-wise minimum.
  ASSIGN_OR_RETURN(ValueId one_minus, First(graph.AddOp("scalar_mul", {ratio}, {{"value", -1.0}}, at)));
  ASSIGN_OR_RETURN(one_minus, First(graph.AddOp("scalar_add", {one_minus}, {{"value", 1.0}}, at)));
  ASSIGN_OR_RETURN(ValueId excess, First(graph.AddOp("relu", {one_minus}, {}, at)));
  ASSIGN_OR_RETURN(ValueId scale, First(graph.AddOp("scalar_mul", {excess}, {{"value", -1.0}}, at)));
  ASSIGN_OR_RETURN(scale, First(graph.AddOp("scalar_add", {scale}, {{"value", 1.0}}, at)));
  for (auto& [var, grad] : gradients) {
    // On the variable's stage, where its update reads it: the scalar crosses
    // the pipeline, not the gradient (twice).
    const NodeOptions on_stage = OnVariablesStage(graph, var, at);
    ValueId factor = scale;
    if (graph.value(grad).meta.dtype != DType::kF32) {
      ASSIGN_OR_RETURN(factor,
                       First(graph.AddOp("cast", {scale}, {{"dtype", graph.value(grad).meta.dtype}}, on_stage)));
    }
    ASSIGN_OR_RETURN(grad, First(graph.AddOp("mul", {grad, factor}, {}, on_stage)));
  }
  return norm;
}

}  // namespace

NodeOptions OnVariablesStage(const Graph& graph, ValueId var, NodeOptions at) {
  at.layer_idx = graph.producer(var).layer_idx;
  return at;
}

bool WeightDecayApplies(const Graph& graph, ValueId variable, const OptimizerOptions& options) {
  const VariableInfo& info = graph.variable_info(variable);
  if (info.weight_decay.has_value()) return *info.weight_decay;
  // Case-insensitive: Hugging Face BERT's "LayerNorm" is a norm.
  const std::string name = absl::AsciiStrToLower(graph.value(variable).name);
  for (const std::string& pattern : options.no_weight_decay_patterns) {
    if (name.find(absl::AsciiStrToLower(pattern)) != std::string::npos) return false;
  }
  return true;
}

absl::StatusOr<OptimizerResult> ApplyOptimizer(Graph& graph, const GradientMap& gradients,
                                               const OptimizerOptions& options, ValueId skip, ValueId skipped) {
  if (skip != kNoValue && (!graph.IsValidValue(skip) || graph.value(skip).meta.dtype != DType::kF32 ||
                           graph.value(skip).meta.shape.NumElements() != 1)) {
    return absl::InvalidArgumentError(StrCat("optimizer: skip ", ValueRef(skip), " is not one f32 value"));
  }
  if (skipped != kNoValue && (skip == kNoValue || !graph.IsValidValue(skipped) ||
                              graph.value(skipped).meta.dtype != DType::kF32 ||
                              graph.value(skipped).meta.shape.NumElements() != 1)) {
    return absl::InvalidArgumentError(
        StrCat("optimizer: skipped ", ValueRef(skipped), " is not one f32 value after a skip"));
  }
  const auto with_skip = [skip](std::vector<ValueId> inputs) {
    if (skip != kNoValue) inputs.push_back(skip);
    return inputs;
  };
  const auto with_skip_and_skipped = [&with_skip, skipped](std::vector<ValueId> inputs) {
    inputs = with_skip(std::move(inputs));
    if (skipped != kNoValue) inputs.push_back(skipped);
    return inputs;
  };
  OptimizerResult result;
  for (const auto& [var, grad] : gradients) {
    if (!graph.IsValidValue(var) || !graph.IsVariable(var)) {
      return absl::InvalidArgumentError(StrCat("optimizer: ", ValueRef(var), " is not a variable"));
    }
    if (!graph.IsValidValue(grad) || graph.value(grad).meta != graph.value(var).meta) {
      return absl::InvalidArgumentError(StrCat("optimizer: the gradient of '", graph.value(var).name,
                                               "' is not a value of its meta ", graph.value(var).meta.ToString()));
    }
  }

  auto lr = graph.FindInput(options.lr_input_name);
  if (lr.ok()) {
    const TensorMeta& meta = graph.value(*lr).meta;
    if (meta.dtype != DType::kF32 || meta.shape.NumElements() != 1) {
      return absl::InvalidArgumentError(StrCat("optimizer: input '", options.lr_input_name, "' is ",
                                               meta.ToString(), "; the learning rate must be one f32"));
    }
    result.lr = *lr;
  } else {
    ASSIGN_OR_RETURN(result.lr, graph.AddInput(options.lr_input_name, TensorMeta{DType::kF32, Shape{}}));
  }

  GradientMap grads = gradients;
  if (options.clip_grad_max_norm.has_value() && !grads.empty()) {
    // (NaN compared false and ran as no clipping; infinity is no clipping.)
    if (!(*options.clip_grad_max_norm > 0) || std::isinf(*options.clip_grad_max_norm)) {
      return absl::InvalidArgumentError(
          StrCat("optimizer: clip_grad_max_norm must be a positive finite number, got ", *options.clip_grad_max_norm));
    }
    const double p = options.clip_grad_norm_type;
    if (!(p > 0)) {  // NaN too
      return absl::InvalidArgumentError(
          StrCat("optimizer: clip_grad_norm_type must be positive (or infinity), got ", p));
    }
    ASSIGN_OR_RETURN(result.grad_norm, ClipByGlobalNorm(graph, grads, *options.clip_grad_max_norm, p));
    if (!graph.FindFetch("grad_norm").ok()) RETURN_IF_ERROR(graph.MarkFetch("grad_norm", result.grad_norm));
  }

  for (const auto& [var, grad] : grads) {
    const double weight_decay = WeightDecayApplies(graph, var, options) ? options.weight_decay : 0.0;
    const Node& var_node = graph.producer(var);
    const NodeOptions at{.layer_idx = var_node.layer_idx,
                         .scope = StrCat("optimizer/", graph.value(var).name),
                         .name = ""};
    if (options.kind == OptimizerKind::kSgd) {
      // Momentum 0 keeps no buffer (as torch.optim.SGD): the update has
      // neither its input nor its output. (A buffer as large as the model
      // was kept, and checkpointed, holding the last gradient.)
      const bool buffered = options.momentum != 0;
      std::vector<ValueId> inputs = {var, grad};
      ValueId buffer = kNoValue;
      if (buffered) {
        ASSIGN_OR_RETURN(buffer, AddState(graph, var, "momentum"));
        inputs.push_back(buffer);
      }
      inputs.push_back(result.lr);
      ASSIGN_OR_RETURN(
          std::vector<ValueId> outs,
          graph.AddOp("sgd_update", with_skip(inputs),
                      {{"momentum", options.momentum}, {"weight_decay", weight_decay}, {"nesterov", options.nesterov}},
                      at));
      RETURN_IF_ERROR(graph.SetVariableUpdate(var, outs[0]));
      if (buffered) {
        RETURN_IF_ERROR(graph.SetVariableUpdate(buffer, outs[1]));
        result.state[var] = {buffer};
      }
    } else {
      ASSIGN_OR_RETURN(ValueId m, AddState(graph, var, "adam_m"));
      ASSIGN_OR_RETURN(ValueId v, AddState(graph, var, "adam_v"));
      ASSIGN_OR_RETURN(std::vector<ValueId> outs,
                       graph.AddOp("adamw_update", with_skip_and_skipped({var, grad, m, v, result.lr}),
                                   {{"beta1", options.beta1},
                                    {"beta2", options.beta2},
                                    {"eps", options.eps},
                                    {"weight_decay", weight_decay},
                                    {"bias_correction", options.bias_correction}},
                                   at));
      RETURN_IF_ERROR(graph.SetVariableUpdate(var, outs[0]));
      RETURN_IF_ERROR(graph.SetVariableUpdate(m, outs[1]));
      RETURN_IF_ERROR(graph.SetVariableUpdate(v, outs[2]));
      result.state[var] = {m, v};
    }
  }
  return result;
}

}  // namespace tessera::graph
