#include "scheduler/lower.h"

#include <algorithm>
#include <set>
#include <utility>

#include "comm/proto/plan_codec.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::scheduler {
namespace {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::NodeKind;
using graph::ValueId;

// Where a value lives in the plan: tensor `tensor` of the desc produced by
// the task of node `producer`.
struct Slot {
  NodeId producer = graph::kNoNode;
  int tensor = 0;
};

}  // namespace

absl::StatusOr<LoweredPlan> LowerToPlan(const Graph& graph, const LowerOptions& options) {
  if (options.iterations < 1) return absl::InvalidArgumentError(StrCat("scheduler: iterations must be >= 1, got ", options.iterations));
  if (options.default_quota < 1 || options.source_quota < 1) return absl::InvalidArgumentError("scheduler: quotas must be >= 1");
  for (const Node& node : graph.nodes()) {
    if (node.kind == NodeKind::kRepeat || node.kind == NodeKind::kAcc) {
      return absl::UnimplementedError(StrCat("scheduler: gradient accumulation (", node.op, " node ", node.id,
                                             ") is not supported yet; use num_accumulation_steps=1"));
    }
  }
  if (graph.losses().empty() && graph.fetches().empty()) {
    return absl::InvalidArgumentError("scheduler: the graph has no loss and no fetch");
  }

  // Update nodes: variable -> the op node that updates it in place; state
  // variables -> (owning variable, state index).
  std::map<NodeId, ValueId> update_owner;                     // update node -> variable
  std::map<ValueId, NodeId> update_of;                        // variable -> update node
  std::map<ValueId, std::pair<ValueId, int32_t>> state_of;    // state var -> (variable, index)
  const auto& updates = graph.variable_updates();
  for (const auto& [var, new_value] : updates) {
    const Node& producer = graph.producer(new_value);
    if (producer.kind != NodeKind::kOp || producer.inputs.empty()) {
      return absl::UnimplementedError(StrCat("scheduler: the update of variable '", graph.value(var).name,
                                             "' is not an op output"));
    }
    const ValueId owner = producer.inputs[0];
    if (!graph.IsVariable(owner) || !updates.contains(owner) || updates.at(owner) != producer.outputs[0]) {
      return absl::UnimplementedError(StrCat("scheduler: the update of variable '", graph.value(var).name, "' (op ",
                                             producer.op, ") is not an in-place update of its input 0"));
    }
    update_owner[producer.id] = owner;
    update_of[owner] = producer.id;
  }
  for (const auto& [node_id, owner] : update_owner) {
    const Node& node = graph.node(node_id);
    for (size_t k = 1; k < node.outputs.size(); ++k) {
      ValueId state = graph::kNoValue;
      for (const auto& [var, new_value] : updates) {
        if (new_value == node.outputs[k]) state = var;
      }
      if (state == graph::kNoValue) continue;
      if (state == owner || std::find(node.inputs.begin(), node.inputs.end(), state) == node.inputs.end()) {
        return absl::UnimplementedError(StrCat("scheduler: output ", k, " of ", node.op, " updates '",
                                               graph.value(state).name, "', which it does not read"));
      }
      state_of[state] = {owner, static_cast<int32_t>(k - 1)};
    }
  }
  // State variables belong to their owner's task: nothing else may read them.
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kOp || update_owner.contains(node.id)) continue;
    for (ValueId in : node.inputs) {
      if (state_of.contains(in)) {
        return absl::UnimplementedError(StrCat("scheduler: optimizer state '", graph.value(in).name,
                                               "' is read by ", node.op, " (node ", node.id, ")"));
      }
    }
  }

  // Consumers: reader node -> producer node; the sink reads losses and fetches.
  std::vector<std::pair<std::string, ValueId>> sinks;
  for (size_t i = 0; i < graph.losses().size(); ++i) {
    sinks.emplace_back(i == 0 ? std::string("loss") : StrCat("loss", i), graph.losses()[i]);
  }
  for (const auto& fetch : graph.fetches()) sinks.push_back(fetch);
  for (const auto& [name, value] : sinks) {
    if (state_of.contains(value)) return absl::UnimplementedError(StrCat("scheduler: cannot fetch optimizer state '", name, "'"));
  }

  const auto slot_of = [&](ValueId v) {
    const graph::Value& value = graph.value(v);
    return Slot{value.producer, value.output_index};
  };
  // Which nodes get a task, and their readers.
  std::map<NodeId, std::set<NodeId>> readers;  // producer node -> reader nodes (kSinkNode for the sink)
  constexpr NodeId kSinkNode = -2;
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kOp) continue;
    const bool is_update = update_owner.contains(node.id);
    for (ValueId in : node.inputs) {
      if (state_of.contains(in)) continue;
      // The update runs inside the owner's task: it reads the variable there.
      if (is_update && in == update_owner.at(node.id)) continue;
      readers[graph.value(in).producer].insert(is_update ? graph.value(update_owner.at(node.id)).producer : node.id);
    }
  }
  for (const auto& [name, value] : sinks) readers[graph.value(value).producer].insert(kSinkNode);

  comm::PlanBuilder builder(options.iterations);
  LoweredPlan out;
  std::map<NodeId, uint64_t> task_of;
  const uint32_t stream = kComputeStream;
  for (const Node& node : graph.nodes()) {
    const std::string& first_name = node.outputs.empty() ? node.op : graph.value(node.outputs[0]).name;
    switch (node.kind) {
      case NodeKind::kInput: {
        if (!readers.contains(node.id)) break;  // fed but unused: no task
        const uint64_t id = builder.AddTask(proto::ACTOR_KIND_SOURCE, StrCat("input:", first_name), stream, options.device_index);
        builder.task(id).set_callback(StrCat("input:", first_name));
        out.sources[StrCat("input:", first_name)] = node.outputs[0];
        task_of[node.id] = id;
        break;
      }
      case NodeKind::kVariable: {
        if (state_of.contains(node.outputs[0])) break;
        if (!readers.contains(node.id)) break;  // never read: nothing to hold
        const uint64_t id = builder.AddTask(proto::ACTOR_KIND_PARAMETER, StrCat("param:", first_name), stream, options.device_index);
        builder.task(id).set_callback(StrCat("init:", first_name));
        task_of[node.id] = id;
        break;
      }
      case NodeKind::kOp: {
        if (update_owner.contains(node.id)) break;
        if (node.inputs.empty()) {
          // A constant (ones, fill...): computed once by its initializer and
          // held like a variable that is never updated (a compute actor needs
          // at least one consumed desc).
          const uint64_t id = builder.AddTask(proto::ACTOR_KIND_PARAMETER, StrCat("const:", node.op, ":", node.id), stream, options.device_index);
          builder.task(id).set_callback(StrCat("const:", node.id));
          out.constants[StrCat("const:", node.id)] = node.id;
          task_of[node.id] = id;
          break;
        }
        const std::string name = node.scope.empty() ? StrCat(node.op, ":", node.id) : StrCat(node.scope, "/", node.op, ":", node.id);
        const uint64_t id = builder.AddTask(proto::ACTOR_KIND_COMPUTE, name, stream, options.device_index);
        builder.SetOp(id, node.op, node.attrs);
        task_of[node.id] = id;
        break;
      }
      default:
        break;
    }
  }
  const uint64_t sink = builder.AddTask(proto::ACTOR_KIND_SINK, "sink:fetch", stream, options.device_index);
  builder.task(sink).set_callback(kSinkCallback);

  // One desc per producing task, holding all the node's outputs.
  std::map<NodeId, int64_t> desc_of;
  for (const auto& [node_id, task] : task_of) {
    const Node& node = graph.node(node_id);
    std::vector<uint64_t> consumers;
    for (NodeId r : readers[node_id]) {
      const uint64_t c = r == kSinkNode ? sink : task_of.at(r);
      if (std::find(consumers.begin(), consumers.end(), c) == consumers.end()) consumers.push_back(c);
    }
    std::vector<TensorMeta> tensors;
    for (ValueId v : node.outputs) tensors.push_back(graph.value(v).meta);
    const int32_t quota = node.kind == NodeKind::kInput ? options.source_quota : options.default_quota;
    const bool held = node.kind == NodeKind::kVariable || (node.kind == NodeKind::kOp && node.inputs.empty());
    desc_of[node_id] = builder.AddRegisterDesc(task, consumers, held ? 1 : quota, tensors);
  }
  const auto ref = [&](ValueId v) {
    const Slot s = slot_of(v);
    return std::pair<int64_t, int32_t>{desc_of.at(s.producer), s.tensor};
  };

  // Op inputs / outputs.
  for (const auto& [node_id, task] : task_of) {
    const Node& node = graph.node(node_id);
    if (node.kind == NodeKind::kOp && node.inputs.empty()) continue;  // a constant
    if (node.kind == NodeKind::kOp) {
      for (ValueId in : node.inputs) {
        const auto [desc, tensor] = ref(in);
        builder.AddInput(task, desc, tensor);
      }
      for (size_t k = 0; k < node.outputs.size(); ++k) builder.AddOutput(task, desc_of.at(node_id), static_cast<int32_t>(k));
    } else if (node.kind == NodeKind::kVariable) {
      const ValueId var = node.outputs[0];
      std::vector<ValueId> init = {var};
      auto it = update_of.find(var);
      if (it != update_of.end()) {
        const Node& update = graph.node(it->second);
        // State tensors, in output order.
        std::vector<ValueId> states(update.outputs.size() > 0 ? update.outputs.size() - 1 : 0, graph::kNoValue);
        for (const auto& [state, owner_index] : state_of) {
          if (owner_index.first == var) states[static_cast<size_t>(owner_index.second)] = state;
        }
        for (ValueId state : states) {
          if (state == graph::kNoValue) return absl::UnimplementedError(StrCat("scheduler: ", update.op, " has an output that updates nothing"));
          builder.AddState(task, graph.value(state).meta);
          init.push_back(state);
        }
        builder.SetOp(task, update.op, update.attrs);
        for (ValueId in : update.inputs) {
          if (in == var) {
            builder.AddInput(task, desc_of.at(node_id), 0);
          } else if (state_of.contains(in)) {
            builder.AddStateInput(task, state_of.at(in).second);
          } else {
            const auto [desc, tensor] = ref(in);
            builder.AddInput(task, desc, tensor);
          }
        }
        builder.AddOutput(task, desc_of.at(node_id), 0);
        for (size_t k = 1; k < update.outputs.size(); ++k) builder.AddStateOutput(task, static_cast<int32_t>(k - 1));
      }
      out.initializers[StrCat("init:", graph.value(var).name)] = std::move(init);
    }
  }
  // The Parameter tasks consume the descs their update reads (registered by
  // AddRegisterDesc through the readers map above).

  out.plan = builder.Build();
  // Name the tensors for `tessera plan`.
  for (auto& desc : *out.plan.mutable_register_descs()) {
    for (const auto& [node_id, id] : desc_of) {
      if (id != desc.id()) continue;
      const Node& node = graph.node(node_id);
      for (int k = 0; k < desc.tensors_size() && k < static_cast<int>(node.outputs.size()); ++k) {
        const graph::Value& value = graph.value(node.outputs[static_cast<size_t>(k)]);
        desc.mutable_tensors(k)->set_name(value.name.empty() ? graph::ValueRef(value.id) : value.name);
      }
    }
  }
  // The sink receives every tensor of each consumed desc, in consumed order.
  std::vector<std::string> flat;
  std::map<std::pair<int64_t, int32_t>, size_t> position;
  for (int64_t desc_id : builder.task(sink).consumed_register_desc_ids()) {
    for (const auto& [node_id, id] : desc_of) {
      if (id != desc_id) continue;
      for (size_t k = 0; k < graph.node(node_id).outputs.size(); ++k) {
        position[{desc_id, static_cast<int32_t>(k)}] = flat.size();
        flat.push_back("");
      }
    }
  }
  for (const auto& [name, value] : sinks) {
    const size_t at = position.at(ref(value));
    if (!flat[at].empty()) return absl::UnimplementedError(StrCat("scheduler: '", name, "' and '", flat[at], "' are the same value"));
    flat[at] = name;
  }
  out.sink_names = std::move(flat);
  return out;
}

}  // namespace tessera::scheduler
