#include "train/engine.h"

#include <mutex>
#include <utility>
#include <vector>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/status.h"
#include "ops/eager.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Compile(graph::Graph graph, const CompileOptions& options) {
  if (options.train) {
    if (graph.losses().size() != 1) {
      return absl::InvalidArgumentError(StrCat("engine: training needs exactly one loss, the graph has ", graph.losses().size()));
    }
    ASSIGN_OR_RETURN(graph::GradientMap gradients, graph::Autodiff(graph));
    ASSIGN_OR_RETURN(graph::OptimizerResult optimizer, graph::ApplyOptimizer(graph, gradients, options.optimizer));
    (void)optimizer;
  }
  ASSIGN_OR_RETURN(std::vector<graph::ValueId> remap, graph::EliminateDeadCode(graph));
  (void)remap;
  return std::make_unique<Engine>(std::move(graph), options);
}

absl::StatusOr<proto::Plan> Engine::Plan(int64_t iterations) const {
  scheduler::LowerOptions lower = options_.lower;
  lower.iterations = iterations;
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(graph_, lower));
  return lowered.plan;
}

absl::Status Engine::Run(int64_t iterations, const FeedFn& feed, const FetchFn& fetch) {
  scheduler::LowerOptions lower = options_.lower;
  lower.iterations = iterations;
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(graph_, lower));

  actors::RuntimeOptions runtime;
  runtime.stall_timeout_s = options_.stall_timeout_s;
  for (const auto& [callback, value] : lowered.sources) {
    const std::string input = graph_.value(value).name;
    runtime.callbacks.sources[callback] = [&feed, input](int64_t iteration, const std::vector<Tensor>& outputs) {
      if (!feed) return absl::FailedPreconditionError(StrCat("no feed for input '", input, "'"));
      return feed(iteration, input, outputs.at(0));
    };
  }
  for (const auto& [callback, values] : lowered.initializers) {
    std::vector<graph::InitRule> rules;
    for (graph::ValueId v : values) rules.push_back(graph_.variable_info(v).init);
    runtime.callbacks.initializers[callback] = [rules](const std::vector<Tensor>& tensors) -> absl::Status {
      if (tensors.size() != rules.size()) return absl::InternalError("initializer: tensor count mismatch");
      for (size_t i = 0; i < rules.size(); ++i) {
        ASSIGN_OR_RETURN(std::vector<Tensor> init, ops::RunOp(rules[i].op, {}, rules[i].attrs));
        if (init.size() != 1) return absl::InternalError(StrCat("initializer op ", rules[i].op, " gave ", init.size(), " tensors"));
        Tensor target = tensors[i];
        RETURN_IF_ERROR(target.CopyFrom(init[0]));
      }
      return absl::OkStatus();
    };
  }
  for (const auto& [callback, node_id] : lowered.constants) {
    const graph::Node node = graph_.node(node_id);
    runtime.callbacks.initializers[callback] = [node](const std::vector<Tensor>& tensors) -> absl::Status {
      ASSIGN_OR_RETURN(std::vector<Tensor> values, ops::RunOp(node.op, {}, node.attrs));
      if (values.size() != tensors.size()) return absl::InternalError(StrCat("constant ", node.op, ": output count mismatch"));
      for (size_t i = 0; i < values.size(); ++i) {
        Tensor target = tensors[i];
        RETURN_IF_ERROR(target.CopyFrom(values[i]));
      }
      return absl::OkStatus();
    };
  }
  const std::vector<std::string> names = lowered.sink_names;
  runtime.callbacks.sinks[scheduler::kSinkCallback] = [&fetch, names](int64_t iteration, const std::vector<Tensor>& inputs) -> absl::Status {
    if (!fetch) return absl::OkStatus();
    std::map<std::string, Tensor> values;
    for (size_t i = 0; i < inputs.size() && i < names.size(); ++i) {
      if (!names[i].empty()) values[names[i]] = inputs[i];
    }
    return fetch(iteration, values);
  };
  // DESIGN §2: the plan always goes through its serialised form.
  const std::string bytes = actors::SerializePlan(lowered.plan);
  ASSIGN_OR_RETURN(std::unique_ptr<actors::Runtime> rt, actors::Runtime::LoadSerialized(bytes, std::move(runtime)));
  return rt->Run();
}

}  // namespace tessera
