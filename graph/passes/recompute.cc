// Activation checkpointing (DESIGN §6): recomputable segments (transformer
// layers, marked by nn/) are computed again in backward, so their forward
// values die in forward.
//
// For each segment with values that backward nodes read:
//   - the values recomputed: those backward reads that no forward node
//     outside the segment reads (what leaves the segment, the layer's output,
//     is kept: it is the checkpoint the next segment starts from);
//   - the clone: every node of the segment those values need, in order, with
//     the same op and attributes (dropout draws the same mask: its stream is
//     keyed by its attributes, the step and the element), on the same layer,
//     marked backward; inputs from the clone where they were recomputed,
//     variables as they are, and any other value (the layer's input, a kept
//     value) through depend(value, trigger);
//   - the trigger: a gradient that the first backward node reading the
//     segment takes, so the clone runs when backward reaches the segment
//     and not during forward. It cannot depend on the segment's values: a
//     node reading them would come before that first reader;
//   - the weight gradients computed before that first reader on the same
//     stage: the clone waits for them as well (folded into the smallest with
//     depend), so the inputs they hold are free before the clone runs;
//   - the backward nodes read the clone's values instead.
// The graph is replayed into a new one (nodes are only ever appended), the
// clone inserted just before the first backward reader.

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/status.h"
#include "core/text.h"
#include "graph/passes.h"

namespace tessera::graph {
namespace {

struct Segment {
  std::set<ValueId> recomputed;  // values backward reads from the clone
  std::vector<NodeId> nodes;     // the segment's nodes the clone runs, in order
  NodeId first_reader = kNoNode;
  ValueId trigger = kNoValue;
  int64_t layer_idx = kUnassignedLayer;
  // Weight gradients computed (in graph order) before the first reader, on
  // the segment's stage: the clone waits for them too.
  std::vector<ValueId> waits_for;
};

}  // namespace

absl::StatusOr<RecomputeResult> RecomputeSegments(Graph& graph, const GradientMap& gradients,
                                                  const SameStageFn& same_stage) {
  const auto segment_of = [&graph](ValueId v) -> int64_t {
    const Node& n = graph.producer(v);
    return n.kind == NodeKind::kOp && !n.backward ? n.checkpoint_segment : kNoSegment;
  };
  // Values read by forward nodes outside their segment: kept.
  std::set<ValueId> leaves;
  for (const Node& n : graph.nodes()) {
    if (n.backward) continue;
    for (ValueId in : n.inputs) {
      const int64_t s = segment_of(in);
      if (s != kNoSegment && (n.kind != NodeKind::kOp || n.checkpoint_segment != s)) leaves.insert(in);
    }
  }
  for (ValueId v : graph.losses()) leaves.insert(v);
  for (const auto& [name, v] : graph.fetches()) leaves.insert(v);
  for (const auto& [var, v] : graph.variable_updates()) leaves.insert(v);

  std::map<int64_t, Segment> segments;
  for (const Node& n : graph.nodes()) {
    if (!n.backward) continue;
    for (ValueId in : n.inputs) {
      const int64_t s = segment_of(in);
      if (s == kNoSegment || leaves.contains(in)) continue;
      Segment& seg = segments[s];
      seg.recomputed.insert(in);
      if (seg.first_reader == kNoNode) seg.first_reader = n.id;
    }
  }
  RecomputeResult result;
  std::map<NodeId, std::vector<int64_t>> clone_before;  // first reader -> segments cloned just before it
  for (auto& [s, seg] : segments) {
    // The trigger: a gradient (a backward node's output) the first reader
    // takes; failing that, a later reader's.
    for (const Node& n : graph.nodes()) {
      if (!n.backward || n.id < seg.first_reader) continue;
      bool reads = false;
      for (ValueId in : n.inputs) reads |= seg.recomputed.contains(in);
      if (!reads) continue;
      for (ValueId in : n.inputs) {
        if (graph.producer(in).backward) {
          seg.trigger = in;
          break;
        }
      }
      if (seg.trigger != kNoValue) {
        seg.first_reader = n.id;  // the clone goes before it, after its trigger
        break;
      }
    }
    if (seg.trigger == kNoValue) {
      return absl::FailedPreconditionError(StrCat("activation checkpointing: segment ", s, " (",
                                                  graph.producer(*seg.recomputed.begin()).scope,
                                                  ") is read in backward by no node that also takes a gradient"));
    }
    // Every node of the segment the recomputed values need.
    std::set<NodeId> needed;
    std::vector<ValueId> work(seg.recomputed.begin(), seg.recomputed.end());
    while (!work.empty()) {
      const ValueId v = work.back();
      work.pop_back();
      const Node& n = graph.producer(v);
      if (!needed.insert(n.id).second) continue;
      for (ValueId in : n.inputs) {
        if (segment_of(in) == s && !leaves.contains(in)) work.push_back(in);
      }
    }
    seg.nodes.assign(needed.begin(), needed.end());
    seg.layer_idx = graph.node(seg.nodes.front()).layer_idx;
    // The clone goes just before first_reader; a reader of a recomputed
    // value before it (taking no gradient) is refused below.
    clone_before[seg.first_reader].push_back(s);
  }
  // Each weight gradient computed before a segment's clone (in graph order)
  // holds its inputs until it runs; the protocol would let it run late, so
  // the planner could not reuse those bytes for the clone. The first clone
  // after it on its stage waits for it.
  std::vector<std::pair<NodeId, int64_t>> by_place;  // (first reader, segment)
  for (const auto& [s, seg] : segments) by_place.emplace_back(seg.first_reader, s);
  std::sort(by_place.begin(), by_place.end());
  std::set<ValueId> assigned;
  for (const auto& [place, s] : by_place) {
    Segment& seg = segments.at(s);
    for (const auto& [var, grad] : gradients) {
      if (!graph.IsValidValue(grad) || assigned.contains(grad) || grad == seg.trigger) continue;
      const Node& producer = graph.producer(grad);
      if (!producer.backward || producer.id >= place) continue;
      if (producer.layer_idx == kUnassignedLayer || seg.layer_idx == kUnassignedLayer) continue;
      if (same_stage && !same_stage(producer.layer_idx, seg.layer_idx)) continue;
      seg.waits_for.push_back(grad);
      assigned.insert(grad);
    }
  }
  // A reader of a recomputed value that comes before the clone's place.
  for (const Node& n : graph.nodes()) {
    if (!n.backward) continue;
    for (ValueId in : n.inputs) {
      auto it = segments.find(segment_of(in));
      if (it == segments.end() || !it->second.recomputed.contains(in)) continue;
      if (n.id < it->second.first_reader) {
        return absl::FailedPreconditionError(StrCat("activation checkpointing: ", n.scope, " reads ", ValueRef(in),
                                                    " of segment ", it->first, " before any gradient reaches it"));
      }
    }
  }

  Graph out(&graph.registry());
  std::vector<ValueId>& remap = result.remap;
  remap.assign(static_cast<size_t>(graph.num_values()), kNoValue);
  std::map<ValueId, ValueId> recomputed_as;  // old value -> the clone's value in `out`
  const auto copy_hints = [&](ValueId old_id, ValueId new_id) -> absl::Status {
    const Value& old = graph.value(old_id);
    if (old.placement_hint || old.sbp_hint) return out.SetHints(new_id, old.placement_hint, old.sbp_hint);
    return absl::OkStatus();
  };
  const auto clone = [&](int64_t s, const Segment& seg) -> absl::Status {
    // What the clone's inputs wait for: the trigger and the weight gradients,
    // folded into the smallest of them with depend (each copies only it).
    ValueId gate = seg.trigger;
    for (ValueId g : seg.waits_for) {
      if (graph.value(g).meta.shape.NumElements() * DTypeSize(graph.value(g).meta.dtype) <
          graph.value(gate).meta.shape.NumElements() * DTypeSize(graph.value(gate).meta.dtype)) {
        gate = g;
      }
    }
    ValueId gate_out = remap[static_cast<size_t>(gate)];
    for (ValueId g : seg.waits_for) {
      if (g == gate) continue;
      const Node& at = graph.node(seg.nodes.front());
      ASSIGN_OR_RETURN(
          std::vector<ValueId> after,
          out.AddOp(
              "depend", {gate_out, remap[static_cast<size_t>(g)]}, {},
              {.layer_idx = at.layer_idx, .scope = StrCat("recompute/", at.scope), .name = "", .backward = true}));
      RETURN_IF_ERROR(copy_hints(gate, after.front()));
      gate_out = after.front();
    }
    if (gate != seg.trigger) {
      const Node& at = graph.node(seg.nodes.front());
      ASSIGN_OR_RETURN(
          std::vector<ValueId> after,
          out.AddOp(
              "depend", {gate_out, remap[static_cast<size_t>(seg.trigger)]}, {},
              {.layer_idx = at.layer_idx, .scope = StrCat("recompute/", at.scope), .name = "", .backward = true}));
      RETURN_IF_ERROR(copy_hints(gate, after.front()));
      gate_out = after.front();
    }
    std::map<ValueId, ValueId> waited;  // old value -> depend(value, gate) in `out`
    for (NodeId id : seg.nodes) {
      const Node& n = graph.node(id);
      const NodeOptions at{
          .layer_idx = n.layer_idx, .scope = StrCat("recompute/", n.scope), .name = "", .backward = true};
      std::vector<ValueId> inputs;
      for (ValueId in : n.inputs) {
        if (auto it = recomputed_as.find(in); it != recomputed_as.end() && segment_of(in) == s) {
          inputs.push_back(it->second);
          continue;
        }
        const NodeKind kind = graph.producer(in).kind;
        if (kind == NodeKind::kVariable || kind == NodeKind::kRepeat) {
          inputs.push_back(remap[static_cast<size_t>(in)]);
          continue;
        }
        auto it = waited.find(in);
        if (it == waited.end()) {
          ASSIGN_OR_RETURN(std::vector<ValueId> after,
                           out.AddOp("depend", {remap[static_cast<size_t>(in)], gate_out}, {},
                                     {.layer_idx = n.layer_idx, .scope = at.scope, .name = "", .backward = true}));
          RETURN_IF_ERROR(copy_hints(in, after.front()));
          it = waited.emplace(in, after.front()).first;
        }
        inputs.push_back(it->second);
      }
      ASSIGN_OR_RETURN(std::vector<ValueId> outputs, out.AddOp(n.op, inputs, n.attrs, at));
      for (size_t i = 0; i < outputs.size(); ++i) {
        recomputed_as[n.outputs[i]] = outputs[i];
        RETURN_IF_ERROR(copy_hints(n.outputs[i], outputs[i]));
      }
    }
    ++result.segments;
    return absl::OkStatus();
  };

  for (const Node& n : graph.nodes()) {
    if (auto it = clone_before.find(n.id); it != clone_before.end()) {
      for (int64_t s : it->second) RETURN_IF_ERROR(clone(s, segments.at(s)));
    }
    const NodeOptions at = ReplayOptions(graph, n);
    std::vector<ValueId> outputs;
    switch (n.kind) {
      case NodeKind::kInput:
      case NodeKind::kVariable: {
        ASSIGN_OR_RETURN(ValueId id, ReplayLeaf(graph, n, out));
        outputs = {id};
        break;
      }
      case NodeKind::kRepeat:
      case NodeKind::kAcc:
        return absl::FailedPreconditionError("activation checkpointing runs before gradient accumulation");
      case NodeKind::kOp: {
        std::vector<ValueId> inputs;
        for (ValueId in : n.inputs) {
          auto it = n.backward ? recomputed_as.find(in) : recomputed_as.end();
          const bool from_clone = it != recomputed_as.end() && segments.contains(segment_of(in)) &&
                                  segments.at(segment_of(in)).recomputed.contains(in);
          inputs.push_back(from_clone ? it->second : remap[static_cast<size_t>(in)]);
        }
        ASSIGN_OR_RETURN(outputs, out.AddOp(n.op, inputs, n.attrs, at));
        break;
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      remap[static_cast<size_t>(n.outputs[i])] = outputs[i];
      if (n.kind != NodeKind::kVariable) RETURN_IF_ERROR(copy_hints(n.outputs[i], outputs[i]));
    }
  }
  RETURN_IF_ERROR(ReplayMarks(graph, remap, out));
  for (const auto& [var, grad] : gradients) {
    if (!graph.IsValidValue(var) || !graph.IsValidValue(grad)) {
      return absl::InvalidArgumentError(
          StrCat("activation checkpointing: bad pair ", ValueRef(var), " -> ", ValueRef(grad)));
    }
  }
  result.gradients = RemapGradients(gradients, remap);
  graph = std::move(out);
  return result;
}

}  // namespace tessera::graph
