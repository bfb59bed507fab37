// Dynamic loss scaling (fp16 mixed precision): the loss is multiplied by a
// scale before autodiff, the gradients divided by it after, and a step whose
// gradients overflowed is skipped while the scale halves.

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

absl::StatusOr<ValueId> First(absl::StatusOr<std::vector<ValueId>> outputs) {
  if (!outputs.ok()) return outputs.status();
  return outputs->front();
}

}  // namespace

absl::StatusOr<LossScaleResult> ScaleLoss(Graph& graph, ValueId loss, const LossScaleOptions& options) {
  if (!(options.initial_scale > 0) || !(options.initial_scale <= 3.0e38)) {
    return absl::InvalidArgumentError(
        StrCat("loss scaling: the initial scale must be in (0, 3e38], got ", options.initial_scale));
  }
  if (!graph.IsValidValue(loss) || graph.value(loss).meta.dtype != DType::kF32 ||
      graph.value(loss).meta.shape.NumElements() != 1) {
    return absl::InvalidArgumentError("loss scaling: the loss must be one f32 value");
  }
  LossScaleResult result;
  // The scale's variables on the loss's stage; a loss of no given layer is
  // on the last stage (the sink's), where the scale's update is made too
  // (UnscaleGradients): left unassigned, a variable would follow its
  // earliest reader to stage 0 and its update could not reach it.
  const int64_t loss_layer = graph.producer(loss).layer_idx;
  const NodeOptions at{
      .layer_idx = loss_layer == kUnassignedLayer ? kLastLayer : loss_layer, .scope = "amp/loss_scale", .name = ""};
  VariableOptions variable;
  variable.trainable = false;
  variable.weight_decay = false;
  variable.layer_idx = at.layer_idx;
  variable.scope = at.scope;
  ASSIGN_OR_RETURN(result.scale,
                   graph.AddVariable("amp.loss_scale", Shape{}, InitRule::Constant(options.initial_scale), variable));
  ASSIGN_OR_RETURN(result.good_steps,
                   graph.AddVariable("amp.loss_scale_good_steps", Shape{}, InitRule::Zeros(), variable));
  ASSIGN_OR_RETURN(result.skipped_steps,
                   graph.AddVariable("amp.skipped_steps", Shape{}, InitRule::Zeros(), variable));
  ValueId scale = result.scale;
  if (graph.value(loss).meta.shape != Shape{}) {
    ASSIGN_OR_RETURN(scale,
                     First(graph.AddOp("reshape", {scale}, {{"shape", graph.value(loss).meta.shape.dims()}}, at)));
  }
  ASSIGN_OR_RETURN(result.scaled_loss, First(graph.AddOp("mul", {loss, scale}, {}, at)));
  return result;
}

absl::StatusOr<UnscaleResult> UnscaleGradients(Graph& graph, GradientMap& gradients, const LossScaleResult& scaled,
                                               const LossScaleOptions& options) {
  if (options.growth_interval < 1) {
    return absl::InvalidArgumentError(
        StrCat("loss scaling: the growth interval must be >= 1, got ", options.growth_interval));
  }
  if (gradients.empty()) return absl::InvalidArgumentError("loss scaling: no gradients");
  const NodeOptions at{.layer_idx = kUnassignedLayer, .scope = "amp/unscale", .name = ""};
  ASSIGN_OR_RETURN(
      ValueId one,
      First(graph.AddOp("fill", {}, {{"shape", std::vector<int64_t>{}}, {"dtype", DType::kF32}, {"value", 1.0}}, at)));
  ASSIGN_OR_RETURN(ValueId inverse, First(graph.AddOp("div", {one, scaled.scale}, {}, at)));
  ValueId total = kNoValue;
  for (auto& [var, grad] : gradients) {
    if (graph.value(grad).meta.dtype != DType::kF32) {
      return absl::InvalidArgumentError(StrCat("loss scaling: the gradient of '", graph.value(var).name, "' is ",
                                               DTypeName(graph.value(grad).meta.dtype), ", not f32"));
    }
    // On the variable's stage, where its update reads it: the scalars cross
    // the pipeline, not the gradient (twice).
    const NodeOptions on_stage = OnVariablesStage(graph, var, at);
    ASSIGN_OR_RETURN(grad, First(graph.AddOp("mul", {grad, inverse}, {}, on_stage)));
    ASSIGN_OR_RETURN(ValueId flag, First(graph.AddOp("nonfinite", {grad}, {}, on_stage)));
    if (total == kNoValue) {
      total = flag;
    } else {
      ASSIGN_OR_RETURN(total, First(graph.AddOp("add", {total, flag}, {}, at)));
    }
  }
  // found_inf = min(1, total): the flags are 0 or 1, so relu(1 - total) is 1
  // iff none is set (the op set has no element-wise minimum).
  ASSIGN_OR_RETURN(ValueId none, First(graph.AddOp("scalar_mul", {total}, {{"value", -1.0}}, at)));
  ASSIGN_OR_RETURN(none, First(graph.AddOp("scalar_add", {none}, {{"value", 1.0}}, at)));
  ASSIGN_OR_RETURN(none, First(graph.AddOp("relu", {none}, {}, at)));
  ASSIGN_OR_RETURN(ValueId found_inf, First(graph.AddOp("scalar_mul", {none}, {{"value", -1.0}}, at)));
  ASSIGN_OR_RETURN(found_inf, First(graph.AddOp("scalar_add", {found_inf}, {{"value", 1.0}}, at)));
  // On the scale variables' stage: an update is made where its variable is.
  const NodeOptions on_scale_stage = OnVariablesStage(graph, scaled.scale, at);
  ASSIGN_OR_RETURN(std::vector<ValueId> updated,
                   graph.AddOp("loss_scale_update", {scaled.scale, found_inf, scaled.good_steps},
                               {{"growth_interval", options.growth_interval}}, on_scale_stage));
  RETURN_IF_ERROR(graph.SetVariableUpdate(scaled.scale, updated[0]));
  RETURN_IF_ERROR(graph.SetVariableUpdate(scaled.good_steps, updated[1]));
  RETURN_IF_ERROR(graph.MarkFetch("loss_scale", scaled.scale));
  RETURN_IF_ERROR(graph.MarkFetch("skipped", found_inf));
  ASSIGN_OR_RETURN(ValueId skipped, First(graph.AddOp("add", {scaled.skipped_steps, found_inf}, {}, on_scale_stage)));
  RETURN_IF_ERROR(graph.SetVariableUpdate(scaled.skipped_steps, skipped));
  return UnscaleResult{.skip = found_inf, .skipped = scaled.skipped_steps};
}

}  // namespace tessera::graph
