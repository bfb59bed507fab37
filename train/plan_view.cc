#include "train/plan_view.h"

#include <algorithm>
#include <climits>
#include <map>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "core/status.h"
#include "core/storage.h"
#include "core/text.h"
#include "train/trainer.h"

namespace tessera {
namespace {

// "COMPUTE" from ACTOR_KIND_COMPUTE.
std::string KindName(proto::ActorKind kind) {
  std::string_view name = proto::ActorKind_Name(kind);
  ConsumePrefix(&name, "ACTOR_KIND_");
  return std::string(name);
}

std::string TensorsText(const proto::RegisterDesc& desc) {
  std::vector<std::string> parts;
  for (const auto& t : desc.tensors()) {
    std::string_view dtype = proto::DType_Name(t.dtype());
    ConsumePrefix(&dtype, "DTYPE_");
    parts.push_back(StrCat(t.name().empty() ? "?" : t.name(), ":", dtype, "(", Join(t.shape(), ","), ")"));
  }
  return Join(parts, " ");
}

// When the coordinator launches a collective or transfer (actors/launch_order.h).
nlohmann::json LaunchJson(const proto::LaunchOrder& launch) {
  return {{"epoch", launch.epoch()},
          {"backward", launch.backward()},
          {"stage", launch.stage()},
          {"num_stages", launch.num_stages()}};
}

}  // namespace

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string Mib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / kMiB); }

// The column names and one row per device of the plan's memory estimate.
std::string MemoryRows(const proto::Plan& plan) {
  std::string out =
      fmt::format("  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10}\n", "device", "total",
                  "params", "optimizer", "arena", "gradients", "activations", "scratch", "unplanned", "feeds");
  for (const auto& m : plan.memory_estimate()) {
    out += fmt::format("  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10}\n",
                       StrCat("node ", m.node(), " ", m.device()), Mib(m.bytes()), Mib(m.parameters()),
                       Mib(m.optimizer_state()), Mib(m.arena()), Mib(m.gradients()), Mib(m.activations()),
                       Mib(m.boxing_scratch()), Mib(m.unplanned()), Mib(m.feed_buffers()));
  }
  return out;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return a < 0 || b < 0 || __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

// What a node holds at the peaks of a run: its host the CPU devices' plans
// and every device's feed buffers (a GPU's are pinned host memory), its
// fullest GPU the rest of that GPU's plan; during an evaluation, the
// evaluation plan beside the trained parameters and optimizer state kept
// for the next segment (on the device that trained them).
struct NodeMemory {
  int64_t training = 0;
  int64_t kept = 0;
  int64_t evaluation = 0;
  int64_t gpu_training = 0;    // the most on one GPU
  int64_t gpu_evaluation = 0;  // the most on one GPU during an evaluation
  bool gpus = false;
};

std::map<uint32_t, NodeMemory> HostMemoryPerNode(const JobPlans& plans) {
  std::map<uint32_t, NodeMemory> nodes;
  const auto on_host = [](const proto::DeviceMemory& m) { return m.device().starts_with("cpu"); };
  const auto device_part = [](const proto::DeviceMemory& m) {
    return std::max<int64_t>(0, m.bytes() - m.feed_buffers());
  };
  std::map<std::pair<uint32_t, std::string>, int64_t> kept_on_gpu;
  for (const auto& m : plans.training.memory_estimate()) {
    NodeMemory& node = nodes[m.node()];
    node.gpus = node.gpus || !on_host(m);
    if (plans.evaluation_only) continue;
    const int64_t kept = SaturatingAdd(m.parameters(), m.optimizer_state());
    if (on_host(m)) {
      node.training = SaturatingAdd(node.training, m.bytes());
      node.kept = SaturatingAdd(node.kept, kept);
    } else {
      node.training = SaturatingAdd(node.training, m.feed_buffers());
      node.gpu_training = std::max(node.gpu_training, device_part(m));
      kept_on_gpu[{m.node(), m.device()}] = kept;
    }
  }
  if (plans.evaluation) {
    for (const auto& m : plans.evaluation->memory_estimate()) {
      NodeMemory& node = nodes[m.node()];
      if (on_host(m)) {
        node.evaluation = SaturatingAdd(node.evaluation, m.bytes());
      } else {
        node.evaluation = SaturatingAdd(node.evaluation, m.feed_buffers());
        const auto kept = kept_on_gpu.find({m.node(), m.device()});
        node.gpu_evaluation =
            std::max(node.gpu_evaluation, SaturatingAdd(device_part(m), kept == kept_on_gpu.end() ? 0 : kept->second));
      }
    }
  }
  return nodes;
}

// Per node, the host's memory at the training's and an evaluation's peaks
// (and its fullest GPU's); with one node (`tessera train` on this
// machine), the host's against what this machine can give now, with a
// warning when that is too little.
std::string HostMemoryText(const JobPlans& plans) {
  const std::map<uint32_t, NodeMemory> nodes = HostMemoryPerNode(plans);
  std::string out;
  int64_t peak = 0;
  for (const auto& [index, node] : nodes) {
    const auto peaks = [&](int64_t training, int64_t kept, int64_t evaluation) {
      std::vector<std::string> parts;
      if (!plans.evaluation_only) parts.push_back(StrCat("training ", Mib(training), " MiB"));
      if (plans.evaluation) {
        parts.push_back(
            plans.evaluation_only
                ? StrCat("the evaluation ", Mib(evaluation), " MiB")
                : StrCat("during an evaluation ", Mib(SaturatingAdd(kept, evaluation)), " MiB",
                         kept > 0 ? StrCat(" (the evaluation plan's ", Mib(evaluation),
                                           " beside the trained parameters and optimizer state, ", Mib(kept), ")")
                                  : std::string()));
      }
      return Join(parts, "; ");
    };
    out += StrCat("host memory of node ", index, ": ", peaks(node.training, node.kept, node.evaluation), "\n");
    if (node.gpus) {
      out += StrCat("GPU memory of node ", index,
                    ", its fullest device: ", peaks(node.gpu_training, 0, node.gpu_evaluation),
                    " (a GPU with less fails its allocation when the plan loads, naming it)\n");
    }
    peak = std::max({peak, node.training, SaturatingAdd(node.kept, node.evaluation)});
  }
  if (nodes.size() != 1) {
    if (!nodes.empty()) out += "(each worker checks its own host's memory when it loads its part)\n";
    return out;
  }
  const HostMemoryLimit limit = HostMemoryLimitNow();
  const auto available = static_cast<int64_t>(std::min<size_t>(limit.bytes, INT64_MAX));
  // (ulimit -v counts address space: a run's threads reserve stacks and
  // allocator arenas that `tessera plan` does not, so its figure here was
  // taken for room the run then did not have.)
  const bool address_space = limit.source == "what ulimit -v leaves";
  out += StrCat("this machine can give ", Mib(available), " MiB now (", limit.source,
                address_space ? " to this process; `tessera train` maps more address space than `tessera plan`, its "
                                "threads' stacks and allocator arenas: leave ulimit -v room beyond the job"
                              : "",
                ")\n");
  if (peak > available) {
    // (A plan past the planner's reach shares no bytes: more micro-batches
    // there is what made it large.)
    out += StrCat("warning: the job needs ", Mib(peak), " MiB, more than this machine can give now: `tessera train` ",
                  "here would fail for memory (",
                  plans.training.memory_note().empty()
                      ? "a smaller train.train_micro_batch_size with more train.num_accumulation_steps, "
                        "train.activation_checkpoint.enabled or train.amp need less"
                      : StrCat("its arena shares fewer bytes than it could: ", plans.training.memory_note(),
                               "; fewer train.num_accumulation_steps, layers or devices per node keep it "
                               "within the planner's reach"),
                  ")\n");
  }
  return out;
}

nlohmann::json MemoryJson(const proto::Plan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : plan.memory_estimate()) {
    out.push_back({{"node", m.node()},
                   {"device", m.device()},
                   {"bytes", m.bytes()},
                   {"parameters", m.parameters()},
                   {"optimizer_state", m.optimizer_state()},
                   {"gradients", m.gradients()},
                   {"activations", m.activations()},
                   {"arena", m.arena()},
                   {"boxing_scratch", m.boxing_scratch()},
                   {"unplanned", m.unplanned()},
                   {"feed_buffers", m.feed_buffers()}});
  }
  return out;
}

}  // namespace

nlohmann::json PlanToJson(const proto::Plan& plan) {
  nlohmann::json out;
  out["iterations"] = plan.iterations();
  out["devices"] = plan.mesh();
  out["actors"] = nlohmann::json::array();
  for (const auto& task : plan.tasks()) {
    const actors::ActorId id = actors::DecodeActorId(task.actor_id());
    out["actors"].push_back({{"id", task.actor_id()},
                             {"name", task.name()},
                             {"kind", KindName(task.kind())},
                             {"op", task.op()},
                             {"node", id.node},
                             {"device", id.device().ToString()},
                             {"stream", id.stream},
                             {"task", id.task},
                             {"callback", task.callback()},
                             {"pieces_per_iteration", actors::PiecesPerIteration(task)},
                             {"boxing", task.kind() == proto::ACTOR_KIND_COLLECTIVE
                                            ? nlohmann::json{{"from", task.boxing().from()},
                                                             {"to", task.boxing().to()},
                                                             {"conversion", task.boxing().description()},
                                                             {"group", task.boxing().group()},
                                                             {"order", task.boxing().order()},
                                                             {"launch", LaunchJson(task.boxing().launch())}}
                                            : nlohmann::json(nullptr)},
                             {"transfer", task.kind() == proto::ACTOR_KIND_SEND || task.kind() == proto::ACTOR_KIND_RECV
                                              ? nlohmann::json{{"peer", task.transfer().peer()},
                                                               {"peer_stage", task.transfer().peer_stage()},
                                                               {"group", task.transfer().group()},
                                                               {"order", task.transfer().order()},
                                                               {"launch", LaunchJson(task.transfer().launch())}}
                                              : nlohmann::json(nullptr)},
                             {"repeat_num", task.repeat_num()},
                             {"state_tensors", task.state_size()}});
  }
  out["registers"] = nlohmann::json::array();
  for (const auto& desc : plan.register_descs()) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : desc.tensors()) tensors.push_back({{"name", t.name()}, {"dtype", proto::DType_Name(t.dtype())}, {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())}});
    out["registers"].push_back({{"id", desc.id()},
                                {"producer", desc.producer()},
                                {"consumers", std::vector<uint64_t>(desc.consumers().begin(), desc.consumers().end())},
                                {"quota", desc.register_num()},
                                {"bytes_per_register", desc.bytes_per_register()},
                                {"arena_offset", desc.has_arena_offset() ? nlohmann::json(desc.arena_offset()) : nlohmann::json(nullptr)},
                                {"window", desc.window()},
                                {"tensors", tensors}});
  }
  out["memory"] = MemoryJson(plan);
  return out;
}

std::string MemoryText(const proto::Plan& plan) {
  return StrCat(
      "memory per device (MiB): total = parameters + optimizer state + arena + unplanned + feed buffers; the arena\n"
      "holds the gradients, activations and collectives' scratch, sharing bytes between uses that never overlap,\n"
      "so these three columns (what each would take unshared) may sum to more than the arena (gradients: what the\n"
      "updates read, under ZeRO their shards; buffers summing micro-batches count as activations)\n",
      MemoryRows(plan));
}

std::string PlanToText(const proto::Plan& plan) {
  std::map<uint64_t, std::string> names;
  for (const auto& task : plan.tasks()) names[task.actor_id()] = task.name();
  std::string out = StrCat("plan: ", plan.tasks_size(), " actors, ", plan.register_descs_size(), " register descs, ",
                           plan.iterations(), " iterations\n",
                           plan.mesh().empty() ? std::string() : StrCat("devices: ", plan.mesh(), "\n"), "\nactors:\n");
  for (const auto& task : plan.tasks()) {
    const actors::ActorId id = actors::DecodeActorId(task.actor_id());
    std::string extra;
    if (task.state_size() > 0) extra += StrCat(" state=", task.state_size());
    if (task.repeat_num() > 0) extra += StrCat(" repeat_num=", task.repeat_num());
    if (actors::PiecesPerIteration(task) > 1) extra += StrCat(" per_iteration=", actors::PiecesPerIteration(task));
    if (task.scratch_bytes() > 0) {
      extra += StrCat(" scratch=", task.scratch_bytes(),
                      task.has_scratch_offset() ? StrCat("@", task.scratch_offset()) : std::string());
    }
    if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) {
      extra += StrCat(" boxing=\"", task.boxing().from(), " -> ", task.boxing().to(), ": ", task.boxing().description(),
                      "\" order=", task.boxing().order(), " launch=", task.boxing().launch().backward() ? "backward" : "forward",
                      "/epoch", task.boxing().launch().epoch());
    }
    if (task.kind() == proto::ACTOR_KIND_SEND || task.kind() == proto::ACTOR_KIND_RECV) {
      extra += StrCat(" peer=cpu:", task.transfer().peer(), " order=", task.transfer().order());
    }
    out += fmt::format("  {:<9} {:<40} op={:<30} node={} device={} stream={} task={}{}\n", KindName(task.kind()), task.name(),
                       task.op().empty() ? "-" : task.op(), id.node, id.device().ToString(), id.stream, id.task, extra);
  }
  out += "\nregisters:\n";
  for (const auto& desc : plan.register_descs()) {
    std::vector<std::string> consumers;
    for (uint64_t c : desc.consumers()) consumers.push_back(names[c]);
    out += fmt::format("  desc {:<3} quota={} bytes={:<8} arena={:<10} {}  {} -> [{}]\n", desc.id(), desc.register_num(),
                       desc.bytes_per_register(), desc.has_arena_offset() ? std::to_string(desc.arena_offset()) : "-",
                       desc.window() > 0 ? StrCat("micro-batch window ", desc.window()) : TensorsText(desc),
                       names[desc.producer()], Join(consumers, ", "));
  }
  out += '\n';
  out += MemoryText(plan);
  return out;
}

std::string PlanToDot(const proto::Plan& plan) {
  std::string out = "digraph plan {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  for (const auto& task : plan.tasks()) {
    const actors::ActorId id = actors::DecodeActorId(task.actor_id());
    const int64_t pieces = actors::PiecesPerIteration(task);
    out += fmt::format("  a{} [label=\"{}\\n{} {}{}\\n{} stream {}\"];\n", task.actor_id(), task.name(), KindName(task.kind()),
                       task.op(), pieces > 1 ? StrCat(" x", pieces, "/iter") : std::string(), id.device().ToString(), id.stream);
  }
  for (const auto& desc : plan.register_descs()) {
    for (uint64_t c : desc.consumers()) {
      out += desc.window() > 0
                 ? fmt::format("  a{} -> a{} [label=\"desc {} window {}\", style=dashed];\n", desc.producer(), c,
                               desc.id(), desc.window())
                 : fmt::format("  a{} -> a{} [label=\"desc {} x{} {}B\"];\n", desc.producer(), c, desc.id(),
                               desc.register_num(), desc.bytes_per_register());
    }
  }
  return out + "}\n";
}

namespace {

// What `tessera plan` adds to the training plan's memory: the
// evaluation's table and the host's memory.
std::string JobMemoryExtras(const JobPlans& plans) {
  std::string out;
  if (plans.evaluation) {
    out += StrCat(plans.evaluation_only
                      ? "evaluation (train.eval_only): its own plan, the one the run loads (the training plan above "
                        "runs no iteration)"
                      : "evaluation (train.evaluation): its own plan, loaded between training segments while the "
                        "trained values are kept for the next segment",
                  "\n", MemoryRows(*plans.evaluation));
  }
  out += HostMemoryText(plans);
  for (const std::string& warning : plans.warnings) out += StrCat("warning: ", warning, "\n");
  return out;
}

}  // namespace

absl::StatusOr<std::string> DescribeTrainingPlan(const nlohmann::json& config, std::string_view format) {
  ASSIGN_OR_RETURN(const JobPlans plans, TrainingPlans(config));
  const proto::Plan& plan = plans.training;
  if (format == "json") {
    nlohmann::json out = PlanToJson(plan);
    out["evaluation_memory"] = plans.evaluation ? MemoryJson(*plans.evaluation) : nlohmann::json(nullptr);
    nlohmann::json host = nlohmann::json::array();
    for (const auto& [node, memory] : HostMemoryPerNode(plans)) {
      host.push_back({{"node", node},
                      {"training_bytes", memory.training},
                      {"kept_bytes", memory.kept},
                      {"evaluation_plan_bytes", memory.evaluation},
                      {"evaluation_peak_bytes", SaturatingAdd(memory.kept, memory.evaluation)},
                      {"gpu_training_bytes", memory.gpu_training},
                      {"gpu_evaluation_peak_bytes", memory.gpu_evaluation}});
    }
    out["host_memory"] = std::move(host);
    out["warnings"] = plans.warnings;
    return out.dump(2) + "\n";
  }
  if (format == "dot") return PlanToDot(plan);
  if (format == "text") return PlanToText(plan) + JobMemoryExtras(plans);
  if (format == "memory") {
    return StrCat(plan.mesh().empty() ? std::string() : StrCat("devices: ", plan.mesh(), "\n"), MemoryText(plan),
                  JobMemoryExtras(plans));
  }
  return absl::InvalidArgumentError(StrCat("unknown plan format '", format, "' (text, memory, dot or json)"));
}

}  // namespace tessera
