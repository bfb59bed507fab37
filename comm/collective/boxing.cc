#include "comm/collective/boxing.h"

#include <optional>
#include <utility>

#include "core/boxing_cost.h"
#include "core/tensor_util.h"
#include "core/text.h"

namespace tessera::comm {
namespace internal {

enum class StepKind { kCopy, kAllReduce, kReduceScatter, kAllGather, kAllToAll, kSlice, kKeepOnFirst, kEmbedShard };

// One 1-D conversion of hierarchy axis `axis`, as this rank runs it within its
// axis group. `group` is the block the group shares (the layout with this axis
// broadcast); the step turns this rank's `from` shard of it into its `to`
// shard. Counts are per group rank, in elements.
struct Step {
  int axis = 0;
  Sbp from = Sbp::Broadcast();
  Sbp to = Sbp::Broadcast();
  StepKind kind = StepKind::kCopy;
  ReduceOp op = ReduceOp::kSum;
  Shape group;
  int64_t parts = 1;  // ranks in the axis group
  int64_t index = 0;  // this rank's coordinate on the axis
  Shape in_shape, out_shape;
  std::vector<int64_t> send_counts;  // reduce-scatter, all-gather; all-to-all: sent
  std::vector<int64_t> recv_counts;  // all-to-all: received
  // Byte offsets into the launch's scratch (-1: not needed): the step's
  // output when a later step reads it, the input packed into piece order,
  // the output received flat before unpacking.
  int64_t out_at = -1, pack_at = -1, flat_at = -1;
};

struct BoxingPlan {
  BoxingSpec spec;
  std::vector<int64_t> coordinates;
  Shape input_shape, output_shape;
  std::string description;
  std::vector<Step> steps;  // never empty: from == to is one copy step
  int64_t scratch_bytes = 0;  // every step's scratch, 64-byte aligned each
};

}  // namespace internal

namespace {

using internal::BoxingPlan;
using internal::Step;
using internal::StepKind;

Shape WithExtent(Shape shape, int axis, int64_t extent) {
  shape[axis] = extent;
  return shape;
}

std::vector<int64_t> AxisOffset(int rank, int axis, int64_t offset) {
  std::vector<int64_t> offsets(static_cast<size_t>(rank), 0);
  offsets[static_cast<size_t>(axis)] = offset;
  return offsets;
}

// The shard of `group` that rank `index` of `parts` holds under `sbp`.
Shape ShardShape(const Shape& group, const Sbp& sbp, int64_t parts, int64_t index) {
  if (!sbp.is_split()) return group;
  return WithExtent(group, sbp.axis(), BalancedSplit(group[sbp.axis()], parts, index).size);
}

// Elements of each of the `parts` balanced pieces of `shape` along `axis`.
std::vector<int64_t> PieceCounts(const Shape& shape, int axis, int64_t parts) {
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < parts; ++r) {
    counts.push_back(WithExtent(shape, axis, BalancedSplit(shape[axis], parts, r).size).NumElements());
  }
  return counts;
}

// Whether the pieces of `shape` along `axis` already lie one after another in
// row-major order (nothing outside the axis varies), so no packing is needed.
bool PiecesContiguous(const Shape& shape, int axis) {
  int64_t outer = 1;
  for (int a = 0; a < axis; ++a) outer *= shape[a];
  return outer <= 1;
}

// A view of `count` elements of the flat tensor `flat` at `offset`, shaped `extent`.
absl::StatusOr<Tensor> FlatView(const Tensor& flat, int64_t offset, const Shape& extent) {
  ASSIGN_OR_RETURN(Tensor rows, flat.SliceRows(offset, extent.NumElements()));
  return rows.Reshape(extent);
}

// `t` with its balanced pieces along `axis` made contiguous, in piece order,
// in `flat` (t's elements, 1-D).
absl::StatusOr<Tensor> Pack(const Tensor& t, int axis, int64_t parts, Tensor flat) {
  if (PiecesContiguous(t.shape(), axis)) return t;
  int64_t offset = 0;
  for (int64_t r = 0; r < parts; ++r) {
    const Range piece = BalancedSplit(t.shape()[axis], parts, r);
    const Shape extent = WithExtent(t.shape(), axis, piece.size);
    ASSIGN_OR_RETURN(Tensor view, FlatView(flat, offset, extent));
    RETURN_IF_ERROR(CopyBlock(t, AxisOffset(t.shape().rank(), axis, piece.offset), view,
                              std::vector<int64_t>(static_cast<size_t>(t.shape().rank()), 0), extent));
    offset += extent.NumElements();
  }
  return flat;
}

// The inverse of Pack: the pieces of `flat`, in order, into `out` along `axis`.
absl::Status Unpack(const Tensor& flat, const Tensor& out, int axis, int64_t parts) {
  int64_t offset = 0;
  for (int64_t r = 0; r < parts; ++r) {
    const Range piece = BalancedSplit(out.shape()[axis], parts, r);
    const Shape extent = WithExtent(out.shape(), axis, piece.size);
    ASSIGN_OR_RETURN(Tensor view, FlatView(flat, offset, extent));
    RETURN_IF_ERROR(CopyBlock(view, std::vector<int64_t>(static_cast<size_t>(out.shape().rank()), 0), out,
                              AxisOffset(out.shape().rank(), axis, piece.offset), extent));
    offset += extent.NumElements();
  }
  return absl::OkStatus();
}

absl::Status FillZeros(const Tensor& t) { return ZeroBytes(t.raw_data(), t.device(), t.NumBytes()); }

absl::Status Copy(const Tensor& in, Tensor& out) {
  if (in.NumElements() == 0 || in.raw_data() == out.raw_data()) return absl::OkStatus();
  return out.CopyFrom(in);
}

bool IsCollective(StepKind kind) {
  return kind == StepKind::kAllReduce || kind == StepKind::kReduceScatter || kind == StepKind::kAllGather ||
         kind == StepKind::kAllToAll;
}

const char* CollectiveName(StepKind kind) {
  switch (kind) {
    case StepKind::kAllReduce:
      return "all_reduce";
    case StepKind::kReduceScatter:
      return "reduce_scatter";
    case StepKind::kAllGather:
      return "all_gather";
    case StepKind::kAllToAll:
      return "all_to_all";
    default:
      return "";
  }
}

// "all-gather (unpack axis 1)". Packing is named by the split axis (≠ 0
// needs it in general), so the text is the same on every rank.
std::string StepWhat(const Step& s) {
  const std::string max = s.op == ReduceOp::kMax ? " max" : "";
  switch (s.kind) {
    case StepKind::kCopy:
      return "copy";
    case StepKind::kAllReduce:
      return "all-reduce" + max;
    case StepKind::kReduceScatter:
      return StrCat("reduce-scatter", max, s.to.axis() != 0 ? StrCat(" (pack axis ", s.to.axis(), ")") : "");
    case StepKind::kAllGather:
      return StrCat("all-gather", s.from.axis() != 0 ? StrCat(" (unpack axis ", s.from.axis(), ")") : "");
    case StepKind::kAllToAll: {
      std::vector<std::string> notes;
      if (s.to.axis() != 0) notes.push_back(StrCat("pack axis ", s.to.axis()));
      if (s.from.axis() != 0) notes.push_back(StrCat("unpack axis ", s.from.axis()));
      return notes.empty() ? "all-to-all" : StrCat("all-to-all (", Join(notes, ", "), ")");
    }
    case StepKind::kSlice:
      return "local slice";
    case StepKind::kKeepOnFirst:
      return "keep on rank 0, zeros elsewhere";
    case StepKind::kEmbedShard:
      return "local, zeros outside the shard";
  }
  return "?";
}

std::string StepDescription(const Step& s, bool one_axis) {
  if (s.kind == StepKind::kCopy) return "copy";
  return StrCat(one_axis ? "" : StrCat("axis ", s.axis, " "), s.from.ToString(), " -> ", s.to.ToString(), ": ",
                StepWhat(s));
}

int64_t ParallelId(const std::vector<int64_t>& hierarchy, const std::vector<int64_t>& coordinates) {
  int64_t id = 0;
  for (size_t a = 0; a < hierarchy.size(); ++a) id = id * hierarchy[a] + coordinates[a];
  return id;
}

// This rank's step for the transition of axis `a` from `state`.
absl::StatusOr<Step> MakeStep(const BoxingSpec& spec, const std::vector<int64_t>& coordinates, const NdSbp& state,
                              size_t a, const Sbp& y) {
  Step s;
  s.axis = static_cast<int>(a);
  s.from = state[a];
  s.to = y;
  s.parts = spec.hierarchy[a];
  s.index = coordinates[a];
  NdSbp broadcast = state;
  broadcast[a] = Sbp::Broadcast();
  ASSIGN_OR_RETURN(TensorSlice block,
                   LocalSlice(spec.logical.shape, broadcast, spec.hierarchy, ParallelId(spec.hierarchy, coordinates)));
  s.group = block.local;
  s.in_shape = ShardShape(s.group, s.from, s.parts, s.index);
  s.out_shape = ShardShape(s.group, s.to, s.parts, s.index);
  s.op = s.from.is_partial_max() ? ReduceOp::kMax : ReduceOp::kSum;
  if (s.from.is_partial()) {
    s.kind = y.is_broadcast() ? StepKind::kAllReduce : StepKind::kReduceScatter;
    if (y.is_split()) s.send_counts = PieceCounts(s.group, y.axis(), s.parts);
  } else if (s.from.is_split()) {
    if (y.is_broadcast()) {
      s.kind = StepKind::kAllGather;
      s.send_counts = PieceCounts(s.group, s.from.axis(), s.parts);
    } else if (y.is_split()) {
      s.kind = StepKind::kAllToAll;
      s.send_counts = PieceCounts(s.in_shape, y.axis(), s.parts);
      s.recv_counts = PieceCounts(s.out_shape, s.from.axis(), s.parts);
    } else {
      s.kind = StepKind::kEmbedShard;
    }
  } else {
    s.kind = y.is_split() ? StepKind::kSlice : StepKind::kKeepOnFirst;
  }
  return s;
}

// ---- Launch -----------------------------------------------------------------

// One launch in flight: shared by the callbacks of its steps.
struct Execution {
  std::shared_ptr<const BoxingPlan> plan;
  std::vector<Communicator*> comms;  // per axis
  std::vector<Communicator*> steps;  // per collective step; empty = by axis
  Tensor output;
  Tensor scratch;  // scratch_bytes or more; undefined: buffers allocated per launch
  DoneFn done;
  StepGate gate;
  // Step k's communicator; `index`: its place among the collective steps.
  Communicator* comm(size_t k, int index) const {
    return steps.empty() ? comms[static_cast<size_t>(plan->steps[k].axis)] : steps[static_cast<size_t>(index)];
  }
};

// A buffer of `shape` at byte `at` of the launch's scratch (or a fresh one
// when the launch brought none).
absl::StatusOr<Tensor> Buffer(const Execution& e, int64_t at, const Shape& shape) {
  const TensorMeta meta{e.plan->spec.logical.dtype, shape};
  if (!e.scratch.defined()) return Tensor::Empty(shape, meta.dtype, e.output.device());
  const auto base = static_cast<size_t>(static_cast<const char*>(e.scratch.raw_data()) -
                                        static_cast<const char*>(e.scratch.storage()->data()));
  return Tensor::InStorage(e.scratch.storage(), base + static_cast<size_t>(at), meta);
}

// The place of step k among the collective steps.
int CollectiveIndex(const BoxingPlan& plan, size_t k) {
  int index = 0;
  for (size_t i = 0; i < k; ++i) index += IsCollective(plan.steps[i].kind) ? 1 : 0;
  return index;
}

void Finish(const std::shared_ptr<Execution>& e, size_t k, absl::Status status) {
  const BoxingPlan& plan = *e->plan;
  if (!status.ok()) {
    const Step& s = plan.steps[k];
    status = absl::Status(status.code(),
                          StrCat("boxing ", plan.spec.ToString(), ": step ", k + 1, "/", plan.steps.size(), " (",
                                 StepDescription(s, plan.spec.hierarchy.size() == 1), "): ", status.message()));
  }
  DoneFn done = std::move(e->done);
  done(std::move(status));
}

absl::Status RunLocal(const Step& s, const Tensor& in, Tensor& out) {
  const int rank = in.shape().rank();
  switch (s.kind) {
    case StepKind::kCopy:
      return Copy(in, out);
    case StepKind::kSlice: {
      const Range piece = BalancedSplit(in.shape()[s.to.axis()], s.parts, s.index);
      return CopyBlock(in, AxisOffset(rank, s.to.axis(), piece.offset), out,
                       std::vector<int64_t>(static_cast<size_t>(rank), 0), out.shape());
    }
    case StepKind::kKeepOnFirst:
      if (s.index == 0) return Copy(in, out);
      return FillZeros(out);
    case StepKind::kEmbedShard: {
      RETURN_IF_ERROR(FillZeros(out));
      const Range piece = BalancedSplit(out.shape()[s.from.axis()], s.parts, s.index);
      return CopyBlock(in, std::vector<int64_t>(static_cast<size_t>(rank), 0), out,
                       AxisOffset(rank, s.from.axis(), piece.offset), in.shape());
    }
    default:
      return absl::InternalError("not a local step");
  }
}

void Run(std::shared_ptr<Execution> e, Tensor current, size_t k);

// Issues step k's collective; its completion continues with step k + 1.
void IssueCollective(const std::shared_ptr<Execution>& e, size_t k, const Tensor& current, Tensor out) {
  const Step& s = e->plan->steps[k];
  Communicator* comm = e->comm(k, CollectiveIndex(*e->plan, k));
  auto next = [e, out, k](absl::Status status) {
    if (!status.ok()) return Finish(e, k, std::move(status));
    Run(e, out, k + 1);
  };
  // The result lands in `out` directly when its pieces are contiguous, else in
  // a flat buffer unpacked along `axis` on completion.
  auto receive = [&](int axis) -> absl::StatusOr<std::pair<Tensor, DoneFn>> {
    if (PiecesContiguous(out.shape(), axis)) return std::pair<Tensor, DoneFn>(out, next);
    ASSIGN_OR_RETURN(Tensor flat, Buffer(*e, s.flat_at, Shape{out.NumElements()}));
    DoneFn unpack = [e, out, k, flat, axis, next](absl::Status status) {
      if (status.ok()) status = Unpack(flat, out, axis, e->plan->steps[k].parts);
      next(std::move(status));
    };
    return std::pair<Tensor, DoneFn>(flat, std::move(unpack));
  };
  switch (s.kind) {
    case StepKind::kAllReduce:
      comm->AllReduce(current, out, s.op, std::move(next));
      return;
    case StepKind::kReduceScatter: {
      auto packed = PiecesContiguous(current.shape(), s.to.axis())
                        ? absl::StatusOr<Tensor>(current)
                        : Buffer(*e, s.pack_at, Shape{current.NumElements()});
      if (packed.ok()) packed = Pack(current, s.to.axis(), s.parts, *packed);
      if (!packed.ok()) return Finish(e, k, packed.status());
      comm->ReduceScatter(*packed, out, s.send_counts, s.op, std::move(next));
      return;
    }
    case StepKind::kAllGather: {
      auto target = receive(s.from.axis());
      if (!target.ok()) return Finish(e, k, target.status());
      comm->AllGather(current, target->first, s.send_counts, std::move(target->second));
      return;
    }
    case StepKind::kAllToAll: {
      auto packed = PiecesContiguous(current.shape(), s.to.axis())
                        ? absl::StatusOr<Tensor>(current)
                        : Buffer(*e, s.pack_at, Shape{current.NumElements()});
      if (packed.ok()) packed = Pack(current, s.to.axis(), s.parts, *packed);
      if (!packed.ok()) return Finish(e, k, packed.status());
      auto target = receive(s.from.axis());
      if (!target.ok()) return Finish(e, k, target.status());
      comm->AllToAll(*packed, s.send_counts, target->first, s.recv_counts, std::move(target->second));
      return;
    }
    default:
      Finish(e, k, absl::InternalError("not a collective step"));
  }
}

// Runs steps k, k + 1, ... : local ones inline, up to the next collective.
void Run(std::shared_ptr<Execution> e, Tensor current, size_t k) {
  const BoxingPlan& plan = *e->plan;
  for (; k < plan.steps.size(); ++k) {
    const Step& s = plan.steps[k];
    Tensor out = e->output;
    if (k + 1 < plan.steps.size()) {
      auto scratch = Buffer(*e, s.out_at, s.out_shape);
      if (!scratch.ok()) return Finish(e, k, scratch.status());
      out = *std::move(scratch);
    }
    if (IsCollective(s.kind)) {
      const int index = CollectiveIndex(plan, k);
      if (index == 0 || !e->gate) return IssueCollective(e, k, current, std::move(out));
      const StepGate gate = e->gate;
      return gate(index, [e, k, current, out]() { IssueCollective(e, k, current, out); });
    }
    const absl::Status status = RunLocal(s, current, out);
    if (!status.ok()) return Finish(e, k, status);
    current = std::move(out);
  }
  Finish(e, plan.steps.size(), absl::OkStatus());
}

}  // namespace

std::string BoxingSpec::ToString() const {
  return StrCat(logical.ToString(), " ", NdSbpToString(from), " -> ", NdSbpToString(to), " on [", Join(hierarchy, ", "),
                "]");
}

absl::StatusOr<BoxingRoutine> BoxingRoutine::Create(const BoxingSpec& spec, std::vector<int64_t> rank_coordinates) {
  auto error = [&](const std::string& why) {
    return absl::InvalidArgumentError(StrCat("boxing ", spec.ToString(), ": ", why));
  };
  const size_t n = spec.hierarchy.size();
  const bool one_axis = n == 1;
  if (n == 0) return error("the hierarchy is empty");
  for (size_t a = 0; a < n; ++a) {
    if (spec.hierarchy[a] < 1) return error(StrCat("hierarchy axis ", a, " has ", spec.hierarchy[a], " devices"));
  }
  for (const auto* nd : {&spec.from, &spec.to}) {
    if (nd->size() != n) {
      return error(StrCat(nd == &spec.from ? "from" : "to", " ", NdSbpToString(*nd), " has ", nd->size(),
                          " axes but the hierarchy has ", n));
    }
    for (const Sbp& s : *nd) {
      if (s.is_split() && (s.axis() < 0 || s.axis() >= spec.logical.shape.rank())) {
        return error(
            StrCat(s.ToString(), " splits axis ", s.axis(), " of a rank-", spec.logical.shape.rank(), " tensor"));
      }
      if (s.is_partial() && spec.logical.dtype == DType::kBool) return error(StrCat("bool cannot be ", s.ToString()));
    }
    if (MixesPartials(*nd)) return error(StrCat(NdSbpToString(*nd), " mixes P and P(max)"));
  }
  for (int64_t d : spec.logical.shape.dims()) {
    if (d < 0) return error("negative extent in the logical shape");
  }
  for (size_t a = 0; a < n; ++a) {
    const std::string why = AxisConversionError(spec.from[a], spec.to[a]);
    if (!why.empty()) return error(one_axis ? why : StrCat("axis ", a, ": ", why));
  }
  bool inside = rank_coordinates.size() == n;
  for (size_t a = 0; inside && a < n; ++a) {
    inside = rank_coordinates[a] >= 0 && rank_coordinates[a] < spec.hierarchy[a];
  }
  if (!inside) {
    return error(StrCat("rank coordinates [", Join(rank_coordinates, ", "), "] are outside the hierarchy"));
  }

  auto plan = std::make_shared<BoxingPlan>();
  plan->spec = spec;
  plan->coordinates = rank_coordinates;
  const int64_t id = ParallelId(spec.hierarchy, rank_coordinates);
  ASSIGN_OR_RETURN(TensorSlice in, LocalSlice(spec.logical.shape, spec.from, spec.hierarchy, id));
  ASSIGN_OR_RETURN(TensorSlice out, LocalSlice(spec.logical.shape, spec.to, spec.hierarchy, id));
  plan->input_shape = in.local;
  plan->output_shape = out.local;

  std::string route;
  if (spec.from == spec.to) {
    Step copy;
    copy.in_shape = copy.out_shape = plan->input_shape;
    plan->steps.push_back(copy);
  } else {
    // The route the cost model prices (core/boxing_cost.h).
    const std::optional<BoxingRoute> chosen = ChooseBoxingRoute(spec.logical, spec.from, spec.to, spec.hierarchy);
    if (!chosen.has_value()) return error("no sequence of axis-local conversions reaches the target");
    const std::vector<NdSbp>& path = chosen->states;
    if (chosen->axis_by_axis) {
      route = " axis by axis";
    } else {
      std::vector<std::string> middle;
      for (size_t i = 1; i + 1 < path.size(); ++i) middle.push_back(NdSbpToString(path[i]));
      route = StrCat(" via ", Join(middle, ", "));
    }
    for (size_t i = 0; i + 1 < path.size(); ++i) {
      size_t a = 0;
      while (path[i][a] == path[i + 1][a]) ++a;
      ASSIGN_OR_RETURN(Step step, MakeStep(spec, rank_coordinates, path[i], a, path[i + 1][a]));
      plan->steps.push_back(std::move(step));
    }
  }
  TESSERA_CHECK(plan->steps.front().in_shape == plan->input_shape && plan->steps.back().out_shape == plan->output_shape,
                "boxing ", spec.ToString(), ": planned steps do not chain from the input to the output shape");

  // Scratch: each step's buffers a region of their own.
  const int64_t item = static_cast<int64_t>(DTypeSize(spec.logical.dtype));
  const auto take = [&](const Shape& shape) {
    const int64_t at = plan->scratch_bytes;
    plan->scratch_bytes += (shape.NumElements() * item + 63) / 64 * 64;
    return at;
  };
  for (size_t k = 0; k < plan->steps.size(); ++k) {
    Step& s = plan->steps[k];
    if (k + 1 < plan->steps.size()) s.out_at = take(s.out_shape);
    if ((s.kind == StepKind::kReduceScatter || s.kind == StepKind::kAllToAll) && !PiecesContiguous(s.in_shape, s.to.axis())) {
      s.pack_at = take(s.in_shape);
    }
    if ((s.kind == StepKind::kAllGather || s.kind == StepKind::kAllToAll) && !PiecesContiguous(s.out_shape, s.from.axis())) {
      s.flat_at = take(s.out_shape);
    }
  }

  if (one_axis) {
    plan->description =
        StrCat(spec.from[0].ToString(), " -> ", spec.to[0].ToString(), ": ", StepWhat(plan->steps.front()));
  } else {
    std::vector<std::string> clauses;
    for (const Step& s : plan->steps) clauses.push_back(StepDescription(s, /*one_axis=*/false));
    plan->description =
        StrCat(NdSbpToString(spec.from), " -> ", NdSbpToString(spec.to), route, ": ", Join(clauses, "; "));
  }
  return BoxingRoutine(std::move(plan));
}

const BoxingSpec& BoxingRoutine::spec() const { return plan_->spec; }
const std::vector<int64_t>& BoxingRoutine::rank_coordinates() const { return plan_->coordinates; }
const Shape& BoxingRoutine::input_shape() const { return plan_->input_shape; }
const Shape& BoxingRoutine::output_shape() const { return plan_->output_shape; }
std::string BoxingRoutine::Describe() const { return plan_->description; }

std::vector<std::string> BoxingRoutine::Collectives() const {
  std::vector<std::string> out;
  for (const Step& s : plan_->steps) {
    if (IsCollective(s.kind)) out.emplace_back(CollectiveName(s.kind));
  }
  return out;
}

std::vector<int> BoxingRoutine::CollectiveAxes() const {
  std::vector<int> out;
  for (const Step& s : plan_->steps) {
    if (IsCollective(s.kind)) out.push_back(s.axis);
  }
  return out;
}

int64_t BoxingRoutine::ScratchBytes() const { return plan_->scratch_bytes; }

void BoxingRoutine::Launch(const Tensor& input, Tensor output, const BoxingComms& comms, DoneFn done, StepGate gate,
                           Tensor scratch) const {
  const BoxingPlan& plan = *plan_;
  auto check = [&](const Tensor& t, const char* name, const Shape& shape) -> std::string {
    if (!t.defined()) return StrCat(name, " is undefined");
    if (t.device() != input.device()) {
      return StrCat(name, " is on ", t.device().ToString(), ", the input on ", input.device().ToString());
    }
    if (t.meta() != TensorMeta{plan.spec.logical.dtype, shape}) {
      return StrCat(name, " is ", t.meta().ToString(), " but this rank's shard is ",
                    TensorMeta{plan.spec.logical.dtype, shape}.ToString());
    }
    return "";
  };
  std::string why = check(input, "input", plan.input_shape);
  if (why.empty()) why = check(output, "output", plan.output_shape);
  if (why.empty() && scratch.defined() && scratch.device() != input.device()) {
    why = StrCat("scratch is on ", scratch.device().ToString(), ", the input on ", input.device().ToString());
  }
  if (why.empty() && scratch.defined() && static_cast<int64_t>(scratch.NumBytes()) < plan.scratch_bytes) {
    why = StrCat("scratch of ", scratch.NumBytes(), " bytes, ", plan.scratch_bytes, " needed");
  }
  int index = 0;
  if (!comms.steps.empty() && comms.steps.size() != Collectives().size()) {
    why = StrCat(comms.steps.size(), " step communicators for ", Collectives().size(), " collective steps");
  }
  for (const Step& s : plan.steps) {
    if (!why.empty() || !IsCollective(s.kind)) continue;
    const auto a = static_cast<size_t>(s.axis);
    const Communicator* comm = !comms.steps.empty() ? comms.steps[static_cast<size_t>(index)]
                                                    : a < comms.axis.size() ? comms.axis[a] : nullptr;
    ++index;
    if (comm == nullptr) {
      why = StrCat("no communicator for hierarchy axis ", a);
    } else if (comm->size() != plan.spec.hierarchy[a] || comm->rank() != plan.coordinates[a]) {
      why = StrCat("the communicator of hierarchy axis ", a, " is rank ", comm->rank(), " of ", comm->size(),
                   ", expected rank ", plan.coordinates[a], " of ", plan.spec.hierarchy[a]);
    }
  }
  if (!why.empty()) {
    done(absl::InvalidArgumentError(StrCat("boxing ", plan.spec.ToString(), ": ", why)));
    return;
  }
  auto e = std::make_shared<Execution>();
  e->plan = plan_;
  e->comms = comms.axis;
  e->steps = comms.steps;
  e->output = std::move(output);
  e->scratch = std::move(scratch);
  e->done = std::move(done);
  e->gate = std::move(gate);
  Run(std::move(e), input, 0);
}

}  // namespace tessera::comm
