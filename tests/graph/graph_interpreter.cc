#include "tests/graph/graph_interpreter.h"

#include "core/status.h"
#include "core/text.h"
#include "ops/eager.h"

namespace tessera::graph::testing {

absl::Status GraphInterpreter::InitVariables() {
  for (ValueId id : graph_.Variables()) {
    const VariableInfo& info = graph_.variable_info(id);
    ASSIGN_OR_RETURN(std::vector<Tensor> out,
                     ops::RunOp(info.init.op, {}, info.init.attrs,
                                {.registry = &graph_.registry(), .pool = nullptr, .step = 0, .device = {}}));
    variables_[id] = out.front();
  }
  return absl::OkStatus();
}

absl::Status GraphInterpreter::SetVariable(std::string_view name, const Tensor& value) {
  ASSIGN_OR_RETURN(ValueId id, graph_.FindVariable(name));
  if (value.meta() != graph_.value(id).meta) {
    return absl::InvalidArgumentError(StrCat("variable '", name, "' is ", graph_.value(id).meta.ToString(),
                                             ", given ", value.meta().ToString()));
  }
  variables_[id] = value.Clone();
  return absl::OkStatus();
}

absl::StatusOr<Tensor> GraphInterpreter::GetVariable(std::string_view name) const {
  ASSIGN_OR_RETURN(ValueId id, graph_.FindVariable(name));
  auto it = variables_.find(id);
  if (it == variables_.end()) return absl::FailedPreconditionError(StrCat("variable '", name, "' has no value"));
  return it->second;
}

namespace {

enum class Region : uint8_t { kPre, kMicro, kPost };

// Which nodes run once per micro-batch (they read a repeat output, directly
// or not, and not through an acc), which after the accumulation (they read an
// acc output), and which before everything (the rest). Graph inputs read by
// micro-batch nodes are fed per micro-batch.
absl::StatusOr<std::vector<Region>> Regions(const Graph& graph) {
  std::vector<Region> node_region(static_cast<size_t>(graph.num_nodes()), Region::kPre);
  auto region_of = [&](ValueId v) { return node_region[static_cast<size_t>(graph.value(v).producer)]; };
  for (bool changed = true; changed;) {
    changed = false;
    for (const Node& n : graph.nodes()) {
      Region r = Region::kPre;
      if (n.kind == NodeKind::kRepeat) r = Region::kMicro;
      if (n.kind == NodeKind::kAcc) r = Region::kPost;
      if (n.kind == NodeKind::kOp) {
        for (ValueId in : n.inputs) {
          if (region_of(in) == Region::kPost) {
            if (r == Region::kMicro) return absl::InvalidArgumentError(StrCat("node ", n.id, " mixes micro-batch and accumulated values"));
            r = Region::kPost;
          } else if (region_of(in) == Region::kMicro) {
            if (r == Region::kPost) return absl::InvalidArgumentError(StrCat("node ", n.id, " mixes micro-batch and accumulated values"));
            r = Region::kMicro;
          }
        }
      }
      if (n.kind == NodeKind::kInput) r = node_region[static_cast<size_t>(n.id)];  // set below
      if (r != node_region[static_cast<size_t>(n.id)]) {
        node_region[static_cast<size_t>(n.id)] = r;
        changed = true;
      }
      if (r == Region::kMicro && n.kind == NodeKind::kOp) {
        for (ValueId in : n.inputs) {
          const Node& producer = graph.producer(in);
          if (producer.kind == NodeKind::kInput && node_region[static_cast<size_t>(producer.id)] != Region::kMicro) {
            node_region[static_cast<size_t>(producer.id)] = Region::kMicro;
            changed = true;
          }
        }
      }
    }
  }
  return node_region;
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> GraphInterpreter::Run(const std::map<std::string, Tensor>& feeds,
                                                          int64_t step) {
  int64_t num_micro_batches = 1;
  for (const Node& n : graph_.nodes()) {
    if (n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) num_micro_batches = n.attrs.Int("num_micro_batches");
  }
  ASSIGN_OR_RETURN(std::vector<Region> regions, Regions(graph_));

  std::vector<Tensor> values(static_cast<size_t>(graph_.num_values()));
  std::map<NodeId, Tensor> sums;  // acc node -> running sum
  const ops::EagerOptions options{.registry = &graph_.registry(), .pool = nullptr, .step = step, .device = {}};
  auto evaluate = [&](const Node& n, int64_t micro_batch) -> absl::Status {
    const ValueId first = n.outputs.front();
    switch (n.kind) {
      case NodeKind::kVariable: {
        auto it = variables_.find(first);
        if (it == variables_.end()) {
          return absl::FailedPreconditionError(StrCat("variable '", graph_.value(first).name, "' has no value"));
        }
        values[static_cast<size_t>(first)] = it->second;
        return absl::OkStatus();
      }
      case NodeKind::kInput: {
        const Value& v = graph_.value(first);
        auto it = feeds.find(v.name);
        if (it == feeds.end()) return absl::InvalidArgumentError(StrCat("no feed for input '", v.name, "'"));
        Tensor feed = it->second;
        if (regions[static_cast<size_t>(n.id)] == Region::kMicro && num_micro_batches > 1 && v.meta.shape.rank() > 0) {
          // The feed holds the global batch; micro-batch k takes rows [k n, (k + 1) n).
          const int64_t rows = v.meta.shape[0];
          if (feed.shape().rank() > 0 && feed.shape()[0] == rows * num_micro_batches) {
            ASSIGN_OR_RETURN(feed, feed.SliceRows(micro_batch * rows, rows));
          }
        }
        if (feed.meta() != v.meta) {
          return absl::InvalidArgumentError(StrCat("feed '", v.name, "' is ", it->second.meta().ToString(),
                                                   ", the input is ", v.meta.ToString(), " per micro-batch (",
                                                   num_micro_batches, " micro-batches)"));
        }
        values[static_cast<size_t>(first)] = feed;
        return absl::OkStatus();
      }
      case NodeKind::kRepeat:
        values[static_cast<size_t>(first)] = values[static_cast<size_t>(n.inputs[0])];
        return absl::OkStatus();
      case NodeKind::kAcc:
        values[static_cast<size_t>(first)] = sums.at(n.id);
        return absl::OkStatus();
      case NodeKind::kOp: {
        std::vector<Tensor> inputs;
        for (ValueId in : n.inputs) inputs.push_back(values[static_cast<size_t>(in)]);
        auto outputs = ops::RunOp(n.op, inputs, n.attrs, options);
        if (!outputs.ok()) {
          return absl::Status(outputs.status().code(), StrCat("node ", n.id, ": ", outputs.status().message()));
        }
        for (size_t i = 0; i < n.outputs.size(); ++i) values[static_cast<size_t>(n.outputs[i])] = (*outputs)[i];
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  };

  for (int64_t k = 0; k < num_micro_batches; ++k) {
    for (const Node& n : graph_.nodes()) {
      const Region region = regions[static_cast<size_t>(n.id)];
      if (region == Region::kMicro || (region == Region::kPre && k == 0)) RETURN_IF_ERROR(evaluate(n, k));
      if (n.kind == NodeKind::kAcc) {
        const Tensor& part = values[static_cast<size_t>(n.inputs[0])];
        if (k == 0) {
          sums[n.id] = part.Clone();
        } else {
          ASSIGN_OR_RETURN(std::vector<Tensor> sum, ops::RunOp("add", {sums[n.id], part}, {}, options));
          sums[n.id] = sum.front();
        }
      }
    }
  }
  for (const Node& n : graph_.nodes()) {
    if (regions[static_cast<size_t>(n.id)] == Region::kPost) RETURN_IF_ERROR(evaluate(n, 0));
  }
  for (const auto& [var, new_value] : graph_.variable_updates()) variables_[var] = values[static_cast<size_t>(new_value)];
  return values;
}

}  // namespace tessera::graph::testing
