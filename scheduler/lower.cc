#include "scheduler/lower.h"

#include <algorithm>
#include <set>
#include <utility>

#include "comm/proto/actor_id.h"
#include "comm/proto/plan_codec.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::scheduler {
namespace {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::NodeKind;
using graph::ValueId;

// Boxing and pipeline transfers run on their own thread per device, so a
// compute stream never waits on a collective.
constexpr uint32_t kTransferStream = 1;

// How often a value is produced under gradient accumulation.
enum class Rate : uint8_t { kUnknown, kIteration, kMicroBatch };
struct Rates {
  int64_t num_micro_batches = 1;
  std::vector<Rate> value;  // per ValueId
};

const char* RateName(Rate rate) {
  switch (rate) {
    case Rate::kIteration: return "once per iteration";
    case Rate::kMicroBatch: return "once per micro-batch";
    case Rate::kUnknown: break;
  }
  return "at no known rate";
}

absl::StatusOr<Rates> InferRates(const Graph& graph) {
  Rates rates;
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kRepeat && node.kind != NodeKind::kAcc) continue;
    const int64_t m = node.attrs.Int("num_micro_batches");
    if (rates.num_micro_batches != 1 && rates.num_micro_batches != m) {
      return absl::InvalidArgumentError(StrCat("scheduler: ", node.op, " node ", node.id, " has ", m,
                                               " micro-batches, another node ", rates.num_micro_batches));
    }
    rates.num_micro_batches = m;
  }
  const size_t num_values = static_cast<size_t>(graph.num_values());
  rates.value.assign(num_values, Rate::kUnknown);
  if (rates.num_micro_batches == 1) {
    rates.value.assign(num_values, Rate::kIteration);
    return rates;
  }
  auto& rate = rates.value;
  const auto from_inputs = [&](const Node& node) {
    Rate r = Rate::kUnknown;
    for (ValueId in : node.inputs) {
      if (rate[static_cast<size_t>(in)] == Rate::kMicroBatch) return Rate::kMicroBatch;
      if (rate[static_cast<size_t>(in)] == Rate::kIteration) r = Rate::kIteration;
    }
    return r;
  };
  const auto set_outputs = [&](const Node& node, Rate r) {
    for (ValueId v : node.outputs) rate[static_cast<size_t>(v)] = r;
  };
  // Forward: variables and acc give iteration-rate values, repeat
  // micro-batch ones; ops follow their inputs; graph inputs are open.
  const auto forward = [&]() {
    for (const Node& node : graph.nodes()) {
      switch (node.kind) {
        case NodeKind::kVariable: set_outputs(node, Rate::kIteration); break;
        case NodeKind::kRepeat: set_outputs(node, Rate::kMicroBatch); break;
        case NodeKind::kAcc: set_outputs(node, Rate::kIteration); break;
        case NodeKind::kOp: set_outputs(node, from_inputs(node)); break;
        case NodeKind::kInput: break;
      }
    }
  };
  forward();
  // A graph input runs at the rate of the ops reading it (data: micro-batch;
  // the learning rate: iteration); one read by nothing decided is data.
  std::vector<std::vector<NodeId>> readers(num_values);
  for (const Node& node : graph.nodes()) {
    for (ValueId in : node.inputs) readers[static_cast<size_t>(in)].push_back(node.id);
  }
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kInput) continue;
    Rate r = Rate::kUnknown;
    for (NodeId reader : readers[static_cast<size_t>(node.outputs[0])]) {
      const Node& n = graph.node(reader);
      const Rate rr = n.outputs.empty() ? Rate::kUnknown : rate[static_cast<size_t>(n.outputs[0])];
      if (rr == Rate::kMicroBatch || n.kind == NodeKind::kAcc) r = Rate::kMicroBatch;
      if (rr == Rate::kIteration && r == Rate::kUnknown && n.kind != NodeKind::kRepeat) r = Rate::kIteration;
    }
    set_outputs(node, r == Rate::kUnknown ? Rate::kMicroBatch : r);
  }
  forward();
  // What is still open descends from constants only: it runs at its
  // readers' rate (resolved in reverse order, readers first).
  for (NodeId id = graph.num_nodes() - 1; id >= 0; --id) {
    const Node& node = graph.node(id);
    if (node.outputs.empty() || rate[static_cast<size_t>(node.outputs[0])] != Rate::kUnknown) continue;
    Rate r = Rate::kUnknown;
    for (ValueId v : node.outputs) {
      for (NodeId reader : readers[static_cast<size_t>(v)]) {
        const Node& n = graph.node(reader);
        Rate rr = n.outputs.empty() ? Rate::kIteration : rate[static_cast<size_t>(n.outputs[0])];
        if (n.kind == NodeKind::kRepeat) rr = Rate::kIteration;
        if (n.kind == NodeKind::kAcc) rr = Rate::kMicroBatch;
        if (r != Rate::kUnknown && rr != r) {
          return absl::UnimplementedError(StrCat("scheduler: constant ", node.op, " (node ", node.id,
                                                 ") is read both once per iteration and once per micro-batch"));
        }
        r = rr;
      }
    }
    set_outputs(node, r == Rate::kUnknown ? Rate::kIteration : r);
  }
  // Every op reads values of its own rate; repeat turns iteration-rate into
  // micro-batch-rate values and acc back.
  for (const Node& node : graph.nodes()) {
    if (node.inputs.empty()) continue;
    Rate want = node.outputs.empty() ? Rate::kIteration : rate[static_cast<size_t>(node.outputs[0])];
    if (node.kind == NodeKind::kRepeat) want = Rate::kIteration;
    if (node.kind == NodeKind::kAcc) want = Rate::kMicroBatch;
    for (ValueId in : node.inputs) {
      if (rate[static_cast<size_t>(in)] != want) {
        const graph::Value& v = graph.value(in);
        return absl::UnimplementedError(StrCat("scheduler: ", node.op, " (node ", node.id, node.scope.empty() ? "" : StrCat(", ", node.scope),
                                               ") runs ", RateName(want), " but reads '", v.name.empty() ? graph::ValueRef(in) : v.name,
                                               "', produced ", RateName(rate[static_cast<size_t>(in)])));
      }
    }
  }
  return rates;
}

// One rank's piece of a value in some layout: tensor `tensor` of the
// registers of desc `desc` (produced by a task on that rank's device).
struct Shard {
  int64_t desc = -1;
  int32_t tensor = 0;
};

// The lowering of one graph: tasks per rank of each node's stage, boxing and
// transfers between layouts, in node order (a topological order).
// How each micro-batch-rate value's tensor of the whole iteration is laid
// out over the m micro-batches, as an SBP over a virtual axis of m parts:
// data inputs are S(0) (the trainer feeds rows [k·b, (k+1)·b)), repeat and
// constants B, and every op takes the first SBP signature (for the
// iteration-level shapes) whose inputs match its inputs' layouts, so a
// transpose moves S(0) to S(1) and a reduction over the batch gives P.
// nullopt where no signature matches (the layout is unknown).
std::vector<std::optional<Sbp>> InferMicroLayouts(const Graph& graph, const Rates& rates) {
  std::vector<std::optional<Sbp>> layout(static_cast<size_t>(graph.num_values()));
  const int64_t m = rates.num_micro_batches;
  if (m <= 1) return layout;
  const auto micro = [&](ValueId v) { return rates.value[static_cast<size_t>(v)] == Rate::kMicroBatch; };
  for (const Node& node : graph.nodes()) {
    const auto set_all = [&](const std::optional<Sbp>& sbp) {
      for (ValueId out : node.outputs) layout[static_cast<size_t>(out)] = micro(out) ? sbp : std::optional<Sbp>(Sbp::Broadcast());
    };
    switch (node.kind) {
      case NodeKind::kInput: {
        const bool batched = !node.outputs.empty() && graph.value(node.outputs[0]).meta.shape.rank() > 0;
        set_all(batched ? Sbp::Split(0) : Sbp::Broadcast());
        continue;
      }
      case NodeKind::kVariable:
      case NodeKind::kRepeat:
      case NodeKind::kAcc:
        set_all(Sbp::Broadcast());
        continue;
      case NodeKind::kOp:
        break;
    }
    std::vector<Sbp> inputs;
    std::vector<TensorMeta> metas;
    bool known = true;
    for (ValueId in : node.inputs) {
      const std::optional<Sbp>& sbp = layout[static_cast<size_t>(in)];
      if (!sbp) known = false;
      inputs.push_back(sbp.value_or(Sbp::Broadcast()));
      TensorMeta meta = graph.value(in).meta;
      if (sbp && sbp->is_split() && sbp->axis() < meta.shape.rank()) {
        int64_t extent = 0;
        if (__builtin_mul_overflow(meta.shape[sbp->axis()], m, &extent)) known = false;
        meta.shape[sbp->axis()] = extent;
      }
      metas.push_back(std::move(meta));
    }
    const ops::OpSchema* schema = graph.schema(node);
    std::optional<std::vector<Sbp>> outputs;
    if (node.inputs.empty()) {
      outputs = std::vector<Sbp>(node.outputs.size(), Sbp::Broadcast());  // a constant: the same every micro-batch
    } else if (known && schema != nullptr) {
      // The signatures are asked of the iteration's shapes. An op whose
      // "shape" attribute gives its output shape (reshape, broadcast_to) is
      // asked once per output axis the micro-batches may lie along, with
      // that extent of the attribute scaled to match.
      std::vector<std::pair<ops::AttrMap, int>> variants = {{node.attrs, -1}};
      if (const ops::AttrValue* shape = node.attrs.Find("shape"); shape != nullptr && std::holds_alternative<std::vector<int64_t>>(*shape)) {
        const std::vector<int64_t>& dims = std::get<std::vector<int64_t>>(*shape);
        for (size_t b = 0; b < dims.size(); ++b) {
          int64_t scaled = 0;
          if (dims[b] <= 0 || __builtin_mul_overflow(dims[b], m, &scaled)) continue;
          std::vector<int64_t> iteration = dims;
          iteration[b] = scaled;
          ops::AttrMap attrs = node.attrs;
          attrs.Set("shape", iteration);
          variants.emplace_back(std::move(attrs), static_cast<int>(b));
        }
      }
      for (const auto& [attrs, axis] : variants) {
        if (!schema->InferMeta(metas, attrs).ok()) continue;  // not this op's iteration-level shapes
        for (const ops::SbpSignature& sig : schema->SbpSignatures(metas, attrs, m)) {
          if (sig.inputs != inputs || sig.outputs.size() != node.outputs.size()) continue;
          if (axis >= 0 && !(sig.outputs[0].is_split() && sig.outputs[0].axis() == axis)) continue;
          outputs = sig.outputs;
          break;
        }
        if (outputs) break;
      }
    }
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId out = node.outputs[k];
      if (!micro(out)) {
        layout[static_cast<size_t>(out)] = Sbp::Broadcast();
      } else if (outputs) {
        layout[static_cast<size_t>(out)] = (*outputs)[k];
      }
    }
  }
  return layout;
}

class Lowering {
 public:
  Lowering(const Graph& graph, const LowerOptions& options, const Rates& rates, const DeviceMesh& mesh,
           const SbpAssignment& sbp, std::vector<proto::RankLocation> locations)
      : graph_(graph),
        options_(options),
        rates_(rates),
        mesh_(mesh),
        sbp_(sbp),
        locations_(std::move(locations)),
        builder_(options.iterations) {}

  absl::StatusOr<LoweredPlan> Run();

 private:
  struct LayoutKey {
    ValueId value;
    int64_t stage;
    std::string sbp;
    auto operator<=>(const LayoutKey&) const = default;
  };

  const Placement& placement(int64_t stage) const { return mesh_.stage_placement(stage); }
  // Global rank of parallel id `parallel_id` of `stage`, and where it runs.
  int64_t Rank(int64_t stage, int64_t parallel_id) const { return placement(stage).rank(parallel_id); }
  const proto::RankLocation& Device(int64_t stage, int64_t parallel_id) const {
    return locations_[static_cast<size_t>(Rank(stage, parallel_id))];
  }
  // Local slice of value v on parallel id `i` of `stage` in layout `sbp`.
  absl::StatusOr<TensorSlice> SliceOf(ValueId v, const NdSbp& sbp, int64_t i) const {
    return LocalSlice(graph_.value(v).meta.shape, sbp, mesh_.hierarchy(), i);
  }
  absl::StatusOr<TensorMeta> LocalMeta(ValueId v, const NdSbp& sbp, int64_t i) const {
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(v, sbp, i));
    return TensorMeta{graph_.value(v).meta.dtype, slice.local};
  }
  std::string Suffix(int64_t stage, int64_t i) const {
    return mesh_.world_size() == 1 ? std::string() : StrCat("@", options_.device_index + Rank(stage, i));
  }
  bool MicroRate(ValueId v) const { return rates_.value[static_cast<size_t>(v)] == Rate::kMicroBatch; }
  void SetRate(uint64_t task, bool micro) {
    if (!micro || rates_.num_micro_batches == 1) return;
    builder_.task(task).set_pieces_per_iteration(rates_.num_micro_batches);
    builder_.task(task).set_acts_per_step(rates_.num_micro_batches);
  }
  // Records where the outputs of a node's task on parallel id i live.
  void Produced(const Node& node, int64_t stage, int64_t i, int64_t desc) {
    const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}].resize(static_cast<size_t>(placement(stage).size()));
      shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}][static_cast<size_t>(i)] = {desc, static_cast<int32_t>(k)};
    }
  }
  // DESIGN §7: a per-micro-batch value that backward reads on stage s is
  // kept for stages - s micro-batches, so stage s can run that many forwards
  // ahead of its backwards and no further: 1F1B emerges from back-pressure.
  int32_t Quota(const std::vector<ValueId>& values, int64_t stage, int32_t base) const {
    for (ValueId v : values) {
      if (kept_for_backward_.contains(v) && MicroRate(v)) {
        return std::max(base, static_cast<int32_t>(mesh_.num_stages() - stage));
      }
    }
    return base;
  }
  // A task on (device, stream) of this node; its id must fit (the builder's
  // errors are sticky, so the first one is returned here).
  absl::StatusOr<uint64_t> NewTask(proto::ActorKind kind, std::string name, uint32_t stream,
                                   const proto::RankLocation& device) {
    const uint64_t task = builder_.AddTask(kind, std::move(name), stream, device.device_index(), device.node());
    RETURN_IF_ERROR(builder_.status());
    return task;
  }
  // A desc on one rank holding `tensors`, produced by `task`.
  absl::StatusOr<int64_t> NewDesc(uint64_t task, int32_t quota, const std::vector<TensorMeta>& tensors) {
    const int64_t desc = builder_.AddRegisterDesc(task, {}, quota, tensors);
    RETURN_IF_ERROR(builder_.status());
    return desc;
  }
  // Makes `v` available in layout (stage, sbp) on every rank of the stage.
  absl::Status Ensure(ValueId v, int64_t stage, const NdSbp& sbp);
  // The shard of v in (stage, sbp) on parallel id i, read by `consumer`.
  absl::StatusOr<Shard> Read(ValueId v, int64_t stage, const NdSbp& sbp, int64_t i, uint64_t consumer) {
    RETURN_IF_ERROR(Ensure(v, stage, sbp));
    const Shard shard = shards_.at({v, stage, NdSbpToString(sbp)}).at(static_cast<size_t>(i));
    builder_.AddConsumer(shard.desc, consumer);
    return shard;
  }
  // An op input / output ref with its slice (split values) and, for random
  // ops under micro-batching, the micro-batch stride along the value's batch
  // axis: the iteration's tensor is the micro-batches side by side on that
  // axis (DESIGN §4), so the draws do not depend on how many there are.
  absl::Status SetRef(proto::TensorRef* ref, ValueId v, const TensorSlice& slice, bool draws) {
    const Shape& logical = graph_.value(v).meta.shape;
    int axis = -1;  // the axis the micro-batches are laid along, if they move the draws
    if (draws && MicroRate(v) && rates_.num_micro_batches > 1 && logical.rank() > 0) {
      const std::optional<Sbp>& layout = micro_layout[static_cast<size_t>(v)];
      if (!layout) {
        return absl::UnimplementedError(StrCat(
            "scheduler: '", graph_.value(v).name.empty() ? graph::ValueRef(v) : graph_.value(v).name, "' (",
            graph_.value(v).meta.ToString(), ") feeds a random op under gradient accumulation, but no op's SBP "
            "signature says along which axis its micro-batches lie, so its random numbers would depend on "
            "num_accumulation_steps"));
      }
      // Split: the micro-batches lie along that axis. Broadcast or partial:
      // every micro-batch draws at the same indices, as one iteration would.
      if (layout->is_split()) axis = layout->axis();
    }
    if (slice.local == logical && axis < 0) return absl::OkStatus();
    for (int a = 0; a < logical.rank(); ++a) {
      int64_t extent = logical[a];
      if (a == axis) {
        ASSIGN_OR_RETURN(extent, CheckedMul(logical[a], rates_.num_micro_batches,
                                            StrCat("axis ", a, " of '", graph_.value(v).name, "' x micro-batches")));
      }
      ref->mutable_slice()->add_logical_shape(extent);
      ref->mutable_slice()->add_offset(slice.offset[static_cast<size_t>(a)]);
    }
    if (axis >= 0) {
      ref->set_micro_batch_stride(logical[axis]);
      ref->set_micro_batch_axis(axis);
    }
    return absl::OkStatus();
  }
  absl::Status LowerNode(const Node& node);
  absl::Status LowerUpdate(const Node& update, ValueId owner);
  absl::Status LowerSink();

  const Graph& graph_;
  const LowerOptions& options_;
  const Rates& rates_;
  const DeviceMesh& mesh_;
  const SbpAssignment& sbp_;
  const std::vector<proto::RankLocation> locations_;  // by global rank
  comm::PlanBuilder builder_;
  LoweredPlan out_;
  std::map<LayoutKey, std::vector<Shard>> shards_;  // per parallel id of the stage
  std::map<ValueId, std::vector<uint64_t>> param_tasks_;  // variable -> Parameter task per parallel id
  std::set<ValueId> read_;                               // values some task or the sink reads
  std::set<ValueId> kept_for_backward_;                  // values read by backward (autodiff) nodes
  // Per value, for the coordinator's launch order: accs upstream, and
  // whether it is computed from gradients (autodiff's backward nodes).
  std::vector<int32_t> epoch_;
  std::vector<bool> backward_;
  // Per conversion (boxing or transfer), in creation order: the node whose
  // output it converts. Its id names groups and tasks; the plan's order is
  // by producer (see OrderConversions).
  std::vector<NodeId> conversion_producer_;
  int64_t NewConversion(ValueId v) {
    conversion_producer_.push_back(graph_.value(v).producer);
    return static_cast<int64_t>(conversion_producer_.size()) - 1;
  }
  void OrderConversions(proto::Plan& plan) const;
  // Update nodes and optimizer state (see LowerToPlan).
 public:
  std::map<NodeId, ValueId> update_owner;
  std::map<ValueId, NodeId> update_of;
  std::map<ValueId, std::pair<ValueId, int32_t>> state_of;
  std::map<ValueId, std::vector<std::pair<ValueId, int32_t>>> states_of_owner;  // variable -> (state var, index)
  // Per value under gradient accumulation: how the iteration's tensor is
  // laid out over the micro-batches (InferMicroLayouts).
  std::vector<std::optional<Sbp>> micro_layout;
  std::vector<std::pair<std::string, ValueId>> sinks;
};

absl::Status Lowering::Ensure(ValueId v, int64_t stage, const NdSbp& sbp) {
  if (shards_.contains({v, stage, NdSbpToString(sbp)})) return absl::OkStatus();
  const ValueLayout& from = sbp_.values[static_cast<size_t>(v)];
  const bool micro = MicroRate(v);
  const graph::Value& value = graph_.value(v);
  const std::string what = value.name.empty() ? graph::ValueRef(v) : value.name;
  if (from.stage != stage) {
    // Across stages: convert on the producer's stage first, then one
    // point-to-point transfer per parallel id (stages share the mesh shape).
    // Every transfer from one rank to another shares that pair's
    // communicator; the coordinator issues them in their launch order on
    // both sides (actors/launch_order.h).
    RETURN_IF_ERROR(Ensure(v, from.stage, sbp));
    const std::vector<Shard>& source = shards_.at({v, from.stage, NdSbpToString(sbp)});
    std::vector<Shard>& target = shards_[{v, stage, NdSbpToString(sbp)}];
    const int64_t order = NewConversion(v);
    for (int64_t i = 0; i < placement(stage).size(); ++i) {
      const std::string group = StrCat("p2p/", Rank(from.stage, i), "->", Rank(stage, i));
      ASSIGN_OR_RETURN(const uint64_t send,
                       NewTask(proto::ACTOR_KIND_SEND, StrCat("send:", what, ":", order, Suffix(from.stage, i)),
                               kTransferStream, Device(from.stage, i)));
      ASSIGN_OR_RETURN(const uint64_t recv,
                       NewTask(proto::ACTOR_KIND_RECV, StrCat("recv:", what, ":", order, Suffix(stage, i)),
                               kTransferStream, Device(stage, i)));
      for (uint64_t task : {send, recv}) {
        proto::TransferDesc* t = builder_.task(task).mutable_transfer();
        t->set_group(group);
        t->set_order(order);
        t->set_peer(static_cast<uint32_t>(task == send ? Rank(stage, i) : Rank(from.stage, i)));
        proto::LaunchOrder* launch = t->mutable_launch();
        launch->set_epoch(epoch_[static_cast<size_t>(v)]);
        launch->set_backward(backward_[static_cast<size_t>(v)]);
        launch->set_stage(static_cast<int32_t>(task == send ? from.stage : stage));
        launch->set_num_stages(static_cast<int32_t>(mesh_.num_stages()));
        SetRate(task, micro);
      }
      builder_.task(send).mutable_transfer()->set_input_tensor(source[static_cast<size_t>(i)].tensor);
      builder_.AddConsumer(source[static_cast<size_t>(i)].desc, send);
      ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(v, sbp, i));
      ASSIGN_OR_RETURN(const int64_t desc,
                       NewDesc(recv, Quota({v}, stage, std::max(2, options_.default_quota)), {meta}));
      target.push_back({desc, 0});
    }
    return absl::OkStatus();
  }
  // Same stage: one Collective task per rank.
  const std::vector<Shard>& source = shards_.at({v, from.stage, NdSbpToString(from.nd_sbp)});
  const Placement& where = placement(stage);
  const int64_t order = NewConversion(v);
  std::vector<Shard> target;
  for (int64_t i = 0; i < where.size(); ++i) {
    ASSIGN_OR_RETURN(const uint64_t task,
                     NewTask(proto::ACTOR_KIND_COLLECTIVE, StrCat("boxing:", what, ":", order, Suffix(stage, i)),
                             kTransferStream, Device(stage, i)));
    proto::BoxingDesc* b = builder_.task(task).mutable_boxing();
    b->mutable_logical()->set_dtype(comm::ToProto(value.meta.dtype));
    for (int64_t d : value.meta.shape.dims()) b->mutable_logical()->add_shape(d);
    b->set_from(NdSbpToString(from.nd_sbp));
    b->set_to(NdSbpToString(sbp));
    for (int64_t h : where.hierarchy()) b->add_hierarchy(h);
    for (int64_t r : where.ranks()) b->add_ranks(static_cast<uint32_t>(r));
    b->set_rank_index(static_cast<int32_t>(i));
    b->set_group("coll");  // one communicator per member set, shared by every conversion over it
    b->set_order(order);
    proto::LaunchOrder* launch = b->mutable_launch();
    launch->set_epoch(epoch_[static_cast<size_t>(v)]);
    launch->set_backward(backward_[static_cast<size_t>(v)]);
    launch->set_stage(static_cast<int32_t>(stage));
    launch->set_num_stages(static_cast<int32_t>(mesh_.num_stages()));
    b->set_input_tensor(source[static_cast<size_t>(i)].tensor);
    b->set_description(DescribeBoxing(from, ValueLayout{stage, sbp}));
    SetRate(task, micro);
    builder_.AddConsumer(source[static_cast<size_t>(i)].desc, task);
    ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(v, sbp, i));
    ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota({v}, stage, options_.default_quota), {meta}));
    target.push_back({desc, 0});
  }
  shards_[{v, stage, NdSbpToString(sbp)}] = std::move(target);
  return absl::OkStatus();
}

// The global order of conversions: by the position of the node producing
// the converted value (a topological order of when the data can exist), then
// by creation. A conversion that depends on another's output reads a value
// produced after that one's consumer, hence after its producer, so the order
// is topological; and a gradient's all-reduce goes as soon as the gradient
// exists rather than after every later layer's backward collectives.
void Lowering::OrderConversions(proto::Plan& plan) const {
  std::vector<int64_t> by_producer(conversion_producer_.size());
  for (size_t i = 0; i < by_producer.size(); ++i) by_producer[i] = static_cast<int64_t>(i);
  std::stable_sort(by_producer.begin(), by_producer.end(), [&](int64_t a, int64_t b) {
    return conversion_producer_[static_cast<size_t>(a)] < conversion_producer_[static_cast<size_t>(b)];
  });
  std::vector<int64_t> order(by_producer.size());
  for (size_t rank = 0; rank < by_producer.size(); ++rank) order[static_cast<size_t>(by_producer[rank])] = static_cast<int64_t>(rank);
  for (proto::Task& task : *plan.mutable_tasks()) {
    if (task.has_boxing()) task.mutable_boxing()->set_order(order[static_cast<size_t>(task.boxing().order())]);
    if (task.has_transfer()) task.mutable_transfer()->set_order(order[static_cast<size_t>(task.transfer().order())]);
  }
}

absl::Status Lowering::LowerNode(const Node& node) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(node.id)];
  const int64_t stage = layout.stage;
  const Placement& where = placement(stage);
  const bool micro = !node.outputs.empty() && MicroRate(node.outputs[0]);
  const std::string& first_name = node.outputs.empty() ? node.op : graph_.value(node.outputs[0]).name;
  for (int64_t i = 0; i < where.size(); ++i) {
    const proto::RankLocation& device = Device(stage, i);
    const std::string suffix = Suffix(stage, i);
    switch (node.kind) {
      case NodeKind::kInput: {
        if (!read_.contains(node.outputs[0])) return absl::OkStatus();  // fed but unused: no task
        const std::string callback = StrCat("input:", first_name, suffix);
        ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_SOURCE, callback, kComputeStream, device));
        builder_.task(task).set_callback(callback);
        SetRate(task, micro);
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[0], layout.outputs[0], i));
        builder_.SetSource(task, first_name, graph_.value(node.outputs[0]).meta, slice);
        ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[0], layout.outputs[0], i));
        ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.source_quota), {meta}));
        Produced(node, stage, i, desc);
        break;
      }
      case NodeKind::kVariable: {
        const ValueId var = node.outputs[0];
        if (state_of.contains(var) || !read_.contains(var)) return absl::OkStatus();
        const std::string callback = StrCat("init:", first_name, suffix);
        ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_PARAMETER, StrCat("param:", first_name, suffix),
                                                      kComputeStream, device));
        builder_.task(task).set_callback(callback);
        ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(var, layout.outputs[0], i));
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(var, layout.outputs[0], i));
        const graph::InitRule& init = graph_.variable_info(var).init;
        builder_.AddInitRule(task, init.op, init.attrs, {slice});
        param_tasks_[var].push_back(task);
        ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, 1, {meta}));
        Produced(node, stage, i, desc);
        break;
      }
      case NodeKind::kOp: {
        if (update_owner.contains(node.id)) return LowerUpdate(node, update_owner.at(node.id));
        if (node.inputs.empty()) {
          // A constant (ones, fill...): computed once by its initializer and
          // held like a variable that is never updated.
          // Read once per micro-batch, it is handed out through one Repeat
          // per output, so backward can hold it as long as its quota says.
          ASSIGN_OR_RETURN(const uint64_t task,
                           NewTask(proto::ACTOR_KIND_PARAMETER, StrCat("const:", node.op, ":", node.id, suffix),
                                   kComputeStream, device));
          std::vector<TensorMeta> metas;
          std::vector<TensorSlice> slices;
          for (size_t k = 0; k < node.outputs.size(); ++k) {
            ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[k], layout.outputs[k], i));
            ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[k], layout.outputs[k], i));
            metas.push_back(meta);
            slices.push_back(slice);
          }
          builder_.AddInitRule(task, node.op, node.attrs, slices);
          ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, 1, metas));
          if (!micro || rates_.num_micro_batches == 1) {
            Produced(node, stage, i, desc);
            break;
          }
          for (size_t k = 0; k < node.outputs.size(); ++k) {
            ASSIGN_OR_RETURN(const uint64_t repeat,
                             NewTask(proto::ACTOR_KIND_REPEAT, StrCat("repeat:const:", node.id, ":", k, suffix),
                                     kComputeStream, device));
            builder_.task(repeat).set_repeat_num(rates_.num_micro_batches);
            builder_.task(repeat).set_input_tensor(static_cast<int32_t>(k));
            SetRate(repeat, true);
            builder_.AddConsumer(desc, repeat);
            ASSIGN_OR_RETURN(const int64_t views,
                             NewDesc(repeat, Quota({node.outputs[k]}, stage, options_.default_quota), {metas[k]}));
            std::vector<Shard>& shards = shards_[{node.outputs[k], stage, NdSbpToString(layout.outputs[k])}];
            shards.resize(static_cast<size_t>(where.size()));
            shards[static_cast<size_t>(i)] = {views, 0};
          }
          break;
        }
        const std::string name = StrCat(node.scope.empty() ? std::string() : StrCat(node.scope, "/"), node.op, ":", node.id, suffix);
        ASSIGN_OR_RETURN(const uint64_t task, NewTask(proto::ACTOR_KIND_COMPUTE, name, kComputeStream, device));
        builder_.SetOp(task, node.op, node.attrs);
        SetRate(task, micro);
        const ops::OpSchema* schema = graph_.schema(node);
        const bool draws = schema != nullptr && schema->draws_by_global_index();
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          ASSIGN_OR_RETURN(Shard shard, Read(node.inputs[k], stage, layout.inputs[k], i, task));
          builder_.AddInput(task, shard.desc, shard.tensor);
          ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.inputs[k], layout.inputs[k], i));
          RETURN_IF_ERROR(
              SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), node.inputs[k], slice, draws));
        }
        std::vector<TensorMeta> metas;
        for (size_t k = 0; k < node.outputs.size(); ++k) {
          ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[k], layout.outputs[k], i));
          metas.push_back(meta);
        }
        ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.default_quota), metas));
        for (size_t k = 0; k < node.outputs.size(); ++k) {
          builder_.AddOutput(task, desc, static_cast<int32_t>(k));
          ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(node.outputs[k], layout.outputs[k], i));
          RETURN_IF_ERROR(
              SetRef(builder_.task(task).mutable_outputs(static_cast<int>(k)), node.outputs[k], slice, draws));
        }
        Produced(node, stage, i, desc);
        break;
      }
      case NodeKind::kRepeat:
      case NodeKind::kAcc: {
        const bool repeat = node.kind == NodeKind::kRepeat;
        ASSIGN_OR_RETURN(
            const uint64_t task,
            NewTask(repeat ? proto::ACTOR_KIND_REPEAT : proto::ACTOR_KIND_ACC,
                    StrCat(node.op, ":", repeat ? graph_.value(node.inputs[0]).name : node.scope, ":", node.id, suffix),
                    kComputeStream, device));
        builder_.task(task).set_repeat_num(rates_.num_micro_batches);
        SetRate(task, micro);
        ASSIGN_OR_RETURN(Shard shard, Read(node.inputs[0], stage, layout.inputs[0], i, task));
        builder_.task(task).set_input_tensor(shard.tensor);
        ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(node.outputs[0], layout.outputs[0], i));
        ASSIGN_OR_RETURN(const int64_t desc, NewDesc(task, Quota(node.outputs, stage, options_.default_quota), {meta}));
        Produced(node, stage, i, desc);
        break;
      }
    }
  }
  return absl::OkStatus();
}

// The optimizer update of `owner` runs inside its Parameter task on every rank,
// in place on the variable's shard and the state shards.
absl::Status Lowering::LowerUpdate(const Node& update, ValueId owner) {
  const NodeLayout& layout = sbp_.nodes[static_cast<size_t>(update.id)];
  const NodeLayout& var_layout = sbp_.nodes[static_cast<size_t>(graph_.value(owner).producer)];
  if (!param_tasks_.contains(owner)) return absl::OkStatus();  // never read
  // State tensors, in output order.
  std::vector<ValueId> states(update.outputs.size() > 0 ? update.outputs.size() - 1 : 0, graph::kNoValue);
  if (auto it = states_of_owner.find(owner); it != states_of_owner.end()) {
    for (const auto& [state, index] : it->second) {
      if (index >= 0 && static_cast<size_t>(index) < states.size()) states[static_cast<size_t>(index)] = state;
    }
  }
  const std::vector<uint64_t>& tasks = param_tasks_.at(owner);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const uint64_t task = tasks[i];
    for (ValueId state : states) {
      if (state == graph::kNoValue) return absl::UnimplementedError(StrCat("scheduler: ", update.op, " has an output that updates nothing"));
      const NdSbp& state_sbp = sbp_.values[static_cast<size_t>(state)].nd_sbp;
      ASSIGN_OR_RETURN(TensorMeta meta, LocalMeta(state, state_sbp, static_cast<int64_t>(i)));
      ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(state, state_sbp, static_cast<int64_t>(i)));
      builder_.AddState(task, meta);
      const graph::InitRule& init = graph_.variable_info(state).init;
      builder_.AddInitRule(task, init.op, init.attrs, {slice});
    }
    builder_.SetOp(task, update.op, update.attrs);
    const int64_t own_desc = shards_.at({owner, layout.stage, NdSbpToString(var_layout.outputs[0])}).at(i).desc;
    for (size_t k = 0; k < update.inputs.size(); ++k) {
      const ValueId in = update.inputs[k];
      if (in == owner) {
        builder_.AddInput(task, own_desc, 0);
      } else if (state_of.contains(in)) {
        builder_.AddStateInput(task, state_of.at(in).second);
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(in, sbp_.values[static_cast<size_t>(in)].nd_sbp, static_cast<int64_t>(i)));
        RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), in, slice, false));
        continue;
      } else {
        ASSIGN_OR_RETURN(Shard shard, Read(in, layout.stage, layout.inputs[k], static_cast<int64_t>(i), task));
        builder_.AddInput(task, shard.desc, shard.tensor);
      }
      const proto::TensorRef& added = builder_.task(task).inputs(static_cast<int>(k));
      if (added.location_case() == proto::TensorRef::kRegisterDescId) {
        ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(in, layout.inputs[k], static_cast<int64_t>(i)));
        RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_inputs(static_cast<int>(k)), in, slice, false));
      }
    }
    builder_.AddOutput(task, own_desc, 0);
    ASSIGN_OR_RETURN(TensorSlice slice, SliceOf(owner, var_layout.outputs[0], static_cast<int64_t>(i)));
    RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_outputs(0), owner, slice, false));
    for (size_t k = 1; k < update.outputs.size(); ++k) {
      builder_.AddStateOutput(task, static_cast<int32_t>(k - 1));
      const ValueId state = states[k - 1];
      ASSIGN_OR_RETURN(TensorSlice state_slice, SliceOf(state, sbp_.values[static_cast<size_t>(state)].nd_sbp, static_cast<int64_t>(i)));
      RETURN_IF_ERROR(SetRef(builder_.task(task).mutable_outputs(static_cast<int>(k)), state, state_slice, false));
    }
  }
  return absl::OkStatus();
}

// One sink on the first rank of the last stage reads the losses and fetches
// as (B, B) there.
absl::Status Lowering::LowerSink() {
  const int64_t stage = mesh_.num_stages() - 1;
  ASSIGN_OR_RETURN(const uint64_t sink,
                   NewTask(proto::ACTOR_KIND_SINK, "sink:fetch", kComputeStream, Device(stage, 0)));
  builder_.task(sink).set_callback(kSinkCallback);
  NdSbp all_b(mesh_.hierarchy().size(), Sbp::Broadcast());
  std::vector<Shard> read;
  for (const auto& [name, value] : sinks) {
    ASSIGN_OR_RETURN(Shard shard, Read(value, stage, all_b, 0, sink));
    read.push_back(shard);
  }
  // The sink receives every tensor of each consumed desc, in consumed order.
  const proto::Plan& plan = builder_.plan();
  std::vector<std::string> flat;
  std::map<std::pair<int64_t, int32_t>, size_t> position;
  for (int64_t desc_id : builder_.task(sink).consumed_register_desc_ids()) {
    const auto& desc = plan.register_descs(static_cast<int>(desc_id));
    for (int32_t k = 0; k < desc.tensors_size(); ++k) {
      position[{desc_id, k}] = flat.size();
      flat.push_back("");
    }
  }
  for (size_t s = 0; s < sinks.size(); ++s) {
    const size_t at = position.at({read[s].desc, read[s].tensor});
    if (!flat[at].empty()) return absl::UnimplementedError(StrCat("scheduler: '", sinks[s].first, "' and '", flat[at], "' are the same value"));
    flat[at] = sinks[s].first;
  }
  for (const std::string& name : flat) builder_.task(sink).add_fetch_names(name);
  out_.sink_names = std::move(flat);
  return absl::OkStatus();
}

absl::StatusOr<LoweredPlan> Lowering::Run() {
  // Which values anything reads (tasks exist only for those).
  for (const Node& node : graph_.nodes()) {
    if (node.kind == NodeKind::kOp || node.kind == NodeKind::kRepeat || node.kind == NodeKind::kAcc) {
      for (ValueId in : node.inputs) read_.insert(in);
    }
  }
  for (const auto& [name, value] : sinks) read_.insert(value);
  for (const Node& node : graph_.nodes()) {
    if (!node.scope.starts_with("grad/")) continue;  // autodiff's backward nodes
    for (ValueId in : node.inputs) {
      if (!graph_.producer(in).scope.starts_with("grad/")) kept_for_backward_.insert(in);
    }
  }
  epoch_.assign(static_cast<size_t>(graph_.num_values()), 0);
  backward_.assign(static_cast<size_t>(graph_.num_values()), false);
  for (const Node& node : graph_.nodes()) {  // topological
    int32_t epoch = 0;
    bool backward = node.scope.starts_with("grad/");
    for (ValueId in : node.inputs) {
      epoch = std::max(epoch, epoch_[static_cast<size_t>(in)]);
      backward = backward || backward_[static_cast<size_t>(in)];
    }
    if (node.kind == NodeKind::kAcc) ++epoch;
    for (ValueId out : node.outputs) {
      epoch_[static_cast<size_t>(out)] = epoch;
      backward_[static_cast<size_t>(out)] = backward;
    }
  }
  for (const Node& node : graph_.nodes()) RETURN_IF_ERROR(LowerNode(node));
  RETURN_IF_ERROR(LowerSink());
  out_.plan = builder_.Build();
  for (const proto::RankLocation& location : locations_) *out_.plan.add_ranks() = location;
  RETURN_IF_ERROR(builder_.status());
  OrderConversions(out_.plan);
  out_.plan.set_mesh(mesh_.ToString());
  out_.plan.set_start_iteration(options_.start_iteration);
  out_.sbp_text = sbp_.ToText(graph_);
  // Name the tensors for `tessera plan` by the values they hold.
  for (const auto& [key, shards] : shards_) {
    const graph::Value& value = graph_.value(key.value);
    const std::string name = value.name.empty() ? graph::ValueRef(value.id) : value.name;
    for (const Shard& shard : shards) {
      auto* tensor = out_.plan.mutable_register_descs(static_cast<int>(shard.desc))->mutable_tensors(shard.tensor);
      if (tensor->name().empty() || tensor->name().starts_with("t")) tensor->set_name(StrCat(name, " ", key.sbp));
    }
  }
  return std::move(out_);
}

// Where each global rank runs: ranks fill node 0's devices, then node 1's...
// (DESIGN §4); without devices_per_node, every rank is on node 0 from
// cpu:device_index.
absl::StatusOr<std::vector<proto::RankLocation>> RankLocations(const LowerOptions& options, int64_t world_size) {
  const auto max_devices = static_cast<int64_t>(comm::FieldMax(comm::kDeviceIndexBits)) + 1;
  std::vector<proto::RankLocation> locations;
  if (options.devices_per_node.empty()) {
    const int64_t last_device = int64_t{options.device_index} + world_size - 1;
    if (last_device >= max_devices) {
      return absl::InvalidArgumentError(StrCat(
          world_size, " devices", options.device_index > 0 ? StrCat(" from cpu:", options.device_index) : "",
          " on one node: actor ids hold at most ", max_devices, " (device index is ", comm::kDeviceIndexBits, " bits)"));
    }
    for (int64_t r = 0; r < world_size; ++r) {
      locations.emplace_back().set_device_index(static_cast<uint32_t>(options.device_index + r));
    }
    return locations;
  }
  if (options.device_index != 0) {
    return absl::InvalidArgumentError("scheduler: device_index must be 0 when the devices span nodes");
  }
  const auto max_nodes = static_cast<int64_t>(comm::FieldMax(comm::kNodeBits)) + 1;
  if (static_cast<int64_t>(options.devices_per_node.size()) > max_nodes) {
    return absl::InvalidArgumentError(StrCat("scheduler: ", options.devices_per_node.size(),
                                             " nodes, but actor ids hold at most ", max_nodes));
  }
  int64_t total = 0;
  for (size_t node = 0; node < options.devices_per_node.size(); ++node) {
    const int64_t devices = options.devices_per_node[node];
    if (devices < 1 || devices > max_devices) {
      return absl::InvalidArgumentError(StrCat("scheduler: node ", node, " has ", devices, " devices; each node holds 1 to ",
                                               max_devices));
    }
    total += devices;
    for (int64_t d = 0; d < devices && static_cast<int64_t>(locations.size()) < world_size; ++d) {
      proto::RankLocation& location = locations.emplace_back();
      location.set_node(static_cast<uint32_t>(node));
      location.set_device_index(static_cast<uint32_t>(d));
    }
  }
  if (total != world_size) {
    return absl::InvalidArgumentError(StrCat("scheduler: the nodes hold ", total, " devices, the job needs ", world_size));
  }
  return locations;
}

}  // namespace

absl::StatusOr<LoweredPlan> LowerToPlan(const Graph& graph, const LowerOptions& options) {
  if (options.iterations < 1) return absl::InvalidArgumentError(StrCat("scheduler: iterations must be >= 1, got ", options.iterations));
  if (options.start_iteration < 0) return absl::InvalidArgumentError(StrCat("scheduler: start_iteration must be >= 0, got ", options.start_iteration));
  if (options.iterations > comm::kMaxIterations || options.start_iteration > comm::kMaxIterations) {
    return absl::InvalidArgumentError(StrCat("scheduler: iterations ", options.iterations, " from ",
                                             options.start_iteration, ": each must be at most 2^62"));
  }
  if (options.default_quota < 1 || options.source_quota < 1 || options.default_quota > comm::kMaxRegisterNum ||
      options.source_quota > comm::kMaxRegisterNum) {
    return absl::InvalidArgumentError(StrCat("scheduler: quotas must be in [1, ", comm::kMaxRegisterNum, "], got ",
                                             options.default_quota, " and source ", options.source_quota));
  }
  if (graph.losses().empty() && graph.fetches().empty()) {
    return absl::InvalidArgumentError("scheduler: the graph has no loss and no fetch");
  }
  ASSIGN_OR_RETURN(const Rates rates, InferRates(graph));
  // Acts are counted over the whole run (start_iteration + iterations) x
  // micro-batches (actors/actor.cc); the count must fit.
  ASSIGN_OR_RETURN(const int64_t last_iteration,
                   CheckedAdd(options.start_iteration, options.iterations, "scheduler: start_iteration + iterations"));
  RETURN_IF_ERROR(
      CheckedMul(last_iteration, rates.num_micro_batches, "scheduler: iterations x micro-batches").status());
  ASSIGN_OR_RETURN(const DeviceMesh mesh, DeviceMesh::Make(options.parallel));
  ASSIGN_OR_RETURN(std::vector<proto::RankLocation> locations, RankLocations(options, mesh.world_size()));
  ASSIGN_OR_RETURN(const SbpAssignment sbp, InferSbp(graph, mesh));
  for (const BoxingEdge& edge : sbp.edges) {
    if (edge.kind == BoxingEdgeKind::kVariableUpdate) {
      return absl::InternalError(StrCat("scheduler: the update of '", graph.value(edge.value).name, "' needs boxing"));
    }
  }
  // Update nodes: variable -> the op node that updates it in place; state
  // variables -> (owning variable, state index).
  std::map<NodeId, ValueId> update_owner;  // update node -> variable
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
  std::map<ValueId, ValueId> updated_by;  // new value -> the variable it updates
  for (const auto& [var, new_value] : updates) updated_by[new_value] = var;
  for (const auto& [node_id, owner] : update_owner) {
    const Node& node = graph.node(node_id);
    for (size_t k = 1; k < node.outputs.size(); ++k) {
      const auto it = updated_by.find(node.outputs[k]);
      if (it == updated_by.end()) continue;
      const ValueId state = it->second;
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
    if (rates.value[static_cast<size_t>(value)] != Rate::kIteration) {
      return absl::UnimplementedError(StrCat("scheduler: '", name, "' is computed once per micro-batch; fetch its mean over the ",
                                             "micro-batches (gradient accumulation averages losses and fetches)"));
    }
  }

  Lowering lowering(graph, options, rates, mesh, sbp, std::move(locations));
  lowering.update_owner = std::move(update_owner);
  lowering.update_of = std::move(update_of);
  for (const auto& [state, owner_index] : state_of) {
    lowering.states_of_owner[owner_index.first].emplace_back(state, owner_index.second);
  }
  lowering.state_of = std::move(state_of);
  lowering.micro_layout = InferMicroLayouts(graph, rates);
  lowering.sinks = std::move(sinks);
  return lowering.Run();
}

}  // namespace tessera::scheduler
