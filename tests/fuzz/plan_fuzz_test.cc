// The plan codec fuzzer (issue 9): workers will read plans from the network,
// so no bytes may crash, hang or exhaust a process that loads them.
//
// Real plans (scheduler::LowerToPlan through Engine::Plan, for an MLP under
// one device, data / tensor / pipeline parallelism and gradient
// accumulation) are serialised and mutated, byte-wise (bit flips, inserted,
// deleted, duplicated and spliced ranges, truncation) and structurally
// through protobuf reflection (random field values with 0, -1, boundary
// and huge integers, removed / duplicated / swapped repeated elements,
// swapped and dangling ids, unknown ops, enums and SBP strings). Every case
// goes through ParsePlan -> ValidatePlan -> Runtime::LoadSerialized (never
// Run) and must end in OK or an error status, within kCaseLimitSeconds.
//
// Deterministic: case i draws from (seed, i). TESSERA_FUZZ_SEED overrides
// the seed, TESSERA_FUZZ_CASES the number of cases; the counts (cases, OK,
// errors by class) are printed.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/status.h"
#include "core/text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/stubs/logging.h"
#include "graph/builder.h"
#include "ops/registry.h"
#include "train/engine.h"

namespace tessera {
namespace {

constexpr uint64_t kDefaultSeed = 20260609;
constexpr int64_t kDefaultCases = 10000;
constexpr double kCaseLimitSeconds = 5;
// A case still running after this long is a hang: the watchdog aborts the
// process naming it (ctest's TIMEOUT would not say which case).
constexpr double kHangSeconds = 120;
// Loading may allocate registers; a mutated plan asking more is refused.
constexpr int64_t kMemoryLimit = int64_t{64} << 20;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return std::strtoll(text, nullptr, 10);
}

// ---- The real plans.

// x (batch, 6) -> [linear -> gelu -> dropout] x layers -> mean of squares;
// layer l on pipeline layer l. With `hinted`, column- then row-parallel
// weights (tensor parallelism).
absl::StatusOr<graph::Graph> BuildModel(int64_t batch, int64_t layers, bool hinted) {
  graph::GraphBuilder b;
  graph::Sym h = b.Input("x", {DType::kF32, Shape{batch, 6}});
  int64_t width = 6;
  for (int64_t layer = 0; layer < layers; ++layer) {
    auto scope = b.Scope(StrCat("l", layer), layer);
    const int64_t out = layer % 2 == 0 ? 8 : 6;
    graph::VariableOptions options;
    if (hinted) options.sbp = NdSbp{Sbp::Broadcast(), layer % 2 == 0 ? Sbp::Split(1) : Sbp::Split(0)};
    graph::Sym w = b.Variable("w", Shape{width, out}, graph::InitRule::Normal(0, 0.3, 5, layer), options);
    graph::Sym bias = b.Variable("b", Shape{out}, graph::InitRule::Zeros());
    h = graph::Gelu(graph::BiasAdd(graph::Matmul(h, w), bias), "tanh");
    h = b.Apply("dropout", {h}, {{"rate", 0.1}, {"seed", int64_t{7}}, {"tensor_id", 100 + layer}});
    width = out;
  }
  {
    auto scope = b.Scope("loss", layers - 1);
    b.MarkLoss(graph::ReduceMean(h * h));
  }
  return b.Finish();
}

// The parallel layouts train with plain SGD: AdamW and clipping (the
// first layout's) add many tasks but no new kind of them, and the cases'
// time goes with the plan's size.
struct Layout {
  std::string name;
  int64_t data = 1, tensor = 1, pipeline = 1, micro_batches = 1;
  graph::OptimizerKind optimizer = graph::OptimizerKind::kSgd;
  bool clip = false;
};

absl::StatusOr<proto::Plan> PlanFor(const Layout& layout) {
  const int64_t layers = 2;
  ASSIGN_OR_RETURN(graph::Graph graph, BuildModel(8 / layout.micro_batches, layers, layout.tensor > 1));
  CompileOptions options;
  options.optimizer.kind = layout.optimizer;
  options.optimizer.momentum = 0.9;
  if (layout.clip) options.optimizer.clip_grad_max_norm = 1.0;
  options.num_micro_batches = layout.micro_batches;
  options.lower.parallel.data = layout.data;
  options.lower.parallel.tensor = layout.tensor;
  options.lower.parallel.pipeline = layout.pipeline;
  options.lower.parallel.world_size = layout.data * layout.tensor * layout.pipeline;
  options.lower.parallel.pipeline_num_layers = layers;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Compile(std::move(graph), options));
  return engine->Plan(3);
}

// No-op host functions for every callback the plans name, so loading gets
// as far as it can (the callbacks of a plan that loads are called at most
// for initialisation; nothing runs).
void AddCallbacks(const proto::Plan& plan, actors::HostCallbacks& callbacks) {
  for (const auto& task : plan.tasks()) {
    if (task.callback().empty()) continue;
    switch (task.kind()) {
      case proto::ACTOR_KIND_SOURCE:
        callbacks.sources[task.callback()] = [](int64_t, const std::vector<Tensor>&) { return absl::OkStatus(); };
        break;
      case proto::ACTOR_KIND_SINK:
        callbacks.sinks[task.callback()] = [](int64_t, const std::vector<Tensor>&) { return absl::OkStatus(); };
        break;
      case proto::ACTOR_KIND_PARAMETER:
        callbacks.initializers[task.callback()] = [](const std::vector<Tensor>&) { return absl::OkStatus(); };
        break;
      default:
        break;
    }
  }
}

// ---- Mutations.

class Mutator {
 public:
  Mutator(const std::vector<proto::Plan>& bases, const std::vector<std::string>& base_bytes)
      : bases_(bases), base_bytes_(base_bytes) {
    for (const auto& name : ops::BuiltinOps().Names()) op_names_.push_back(name);
    for (const proto::Plan& plan : bases) {
      for (const auto& task : plan.tasks()) actor_ids_.push_back(task.actor_id());
    }
  }

  // A mutated form of base plan `index`, drawn from `seed` alone; `what`
  // says which mutations.
  std::string Mutate(uint64_t seed, size_t index, std::string* what) {
    rng_.seed(seed);
    const int rounds = 1 + static_cast<int>(Below(3));
    std::string bytes = base_bytes_[index];
    std::optional<proto::Plan> plan;  // copied only for structural mutations
    bool structured = Below(3) != 0;
    for (int r = 0; r < rounds; ++r) {
      if (structured) {
        if (!plan) plan = bases_[index];
        *what += StrCat(what->empty() ? "" : ", ", MutateStructure(*plan));
        if (r + 1 == rounds || Below(3) == 0) {
          bytes = actors::SerializePlan(*plan);
          structured = Below(4) == 0;  // then maybe bytes on top
        }
      } else {
        *what += StrCat(what->empty() ? "" : ", ", MutateBytes(bytes));
      }
    }
    return bytes;
  }

 private:
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  int64_t InterestingInt() {
    static constexpr int64_t kValues[] = {0,
                                          -1,
                                          1,
                                          2,
                                          3,
                                          7,
                                          255,
                                          256,
                                          4095,
                                          4096,
                                          65535,
                                          65536,
                                          (int64_t{1} << 24) - 1,
                                          int64_t{1} << 24,
                                          std::numeric_limits<int32_t>::max(),
                                          std::numeric_limits<int32_t>::min(),
                                          int64_t{1} << 31,
                                          int64_t{1} << 32,
                                          int64_t{1} << 50,
                                          (int64_t{1} << 50) + 1,
                                          int64_t{1} << 62,
                                          std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max() / 2 + 1};
    if (Below(4) == 0) return static_cast<int64_t>(Below(17)) - 4;
    return kValues[Below(std::size(kValues))];
  }

  std::string InterestingString() {
    switch (Below(8)) {
      case 0:
        return "";
      case 1:
        return op_names_[Below(op_names_.size())];
      case 2:
        return "(S(0), P)";
      case 3:
        return StrCat("S(", InterestingInt(), ")");
      case 4:
        return "no_such_op";
      case 5:
        return std::string(1 + Below(300), static_cast<char>('a' + Below(26)));
      case 6:
        return StrCat(InterestingInt());
      default: {  // bytes, often not UTF-8: the parser refuses those
        std::string s;
        for (uint64_t i = 0, n = Below(12); i < n; ++i) s.push_back(static_cast<char>(rng_()));
        return s;
      }
    }
  }

  // Sets a singular field of `message` to a drawn value.
  void SetScalar(google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field) {
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* r = message.GetReflection();
    switch (field->cpp_type()) {
      case FD::CPPTYPE_INT32:
        r->SetInt32(&message, field, static_cast<int32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_INT64:
        r->SetInt64(&message, field, InterestingInt());
        break;
      case FD::CPPTYPE_UINT32:
        r->SetUInt32(&message, field, static_cast<uint32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_UINT64:
        r->SetUInt64(&message, field, DrawUInt64());
        break;
      case FD::CPPTYPE_DOUBLE:
        r->SetDouble(&message, field, DrawDouble());
        break;
      case FD::CPPTYPE_FLOAT:
        r->SetFloat(&message, field, static_cast<float>(DrawDouble()));
        break;
      case FD::CPPTYPE_BOOL:
        r->SetBool(&message, field, !r->GetBool(message, field));
        break;
      case FD::CPPTYPE_ENUM:
        r->SetEnumValue(&message, field, static_cast<int>(Below(14)) - 2);
        break;
      case FD::CPPTYPE_STRING:
        r->SetString(&message, field, InterestingString());
        break;
      case FD::CPPTYPE_MESSAGE:
        r->ClearField(&message, field);
        break;
    }
  }
  void SetRepeatedScalar(google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field, int i) {
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* r = message.GetReflection();
    switch (field->cpp_type()) {
      case FD::CPPTYPE_INT32:
        r->SetRepeatedInt32(&message, field, i, static_cast<int32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_INT64:
        r->SetRepeatedInt64(&message, field, i, InterestingInt());
        break;
      case FD::CPPTYPE_UINT32:
        r->SetRepeatedUInt32(&message, field, i, static_cast<uint32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_UINT64:
        r->SetRepeatedUInt64(&message, field, i, DrawUInt64());
        break;
      case FD::CPPTYPE_DOUBLE:
        r->SetRepeatedDouble(&message, field, i, DrawDouble());
        break;
      case FD::CPPTYPE_FLOAT:
        r->SetRepeatedFloat(&message, field, i, static_cast<float>(DrawDouble()));
        break;
      case FD::CPPTYPE_BOOL:
        r->SetRepeatedBool(&message, field, i, Below(2) == 0);
        break;
      case FD::CPPTYPE_ENUM:
        r->SetRepeatedEnumValue(&message, field, i, static_cast<int>(Below(14)) - 2);
        break;
      case FD::CPPTYPE_STRING:
        r->SetRepeatedString(&message, field, i, InterestingString());
        break;
      case FD::CPPTYPE_MESSAGE:
        break;
    }
  }
  void AddRepeatedScalar(google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field) {
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* r = message.GetReflection();
    switch (field->cpp_type()) {
      case FD::CPPTYPE_INT32:
        r->AddInt32(&message, field, static_cast<int32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_INT64:
        r->AddInt64(&message, field, InterestingInt());
        break;
      case FD::CPPTYPE_UINT32:
        r->AddUInt32(&message, field, static_cast<uint32_t>(InterestingInt()));
        break;
      case FD::CPPTYPE_UINT64:
        r->AddUInt64(&message, field, DrawUInt64());
        break;
      case FD::CPPTYPE_DOUBLE:
        r->AddDouble(&message, field, DrawDouble());
        break;
      case FD::CPPTYPE_FLOAT:
        r->AddFloat(&message, field, static_cast<float>(DrawDouble()));
        break;
      case FD::CPPTYPE_BOOL:
        r->AddBool(&message, field, Below(2) == 0);
        break;
      case FD::CPPTYPE_ENUM:
        r->AddEnumValue(&message, field, static_cast<int>(Below(14)) - 2);
        break;
      case FD::CPPTYPE_STRING:
        r->AddString(&message, field, InterestingString());
        break;
      case FD::CPPTYPE_MESSAGE:
        r->AddMessage(&message, field);
        break;
    }
  }

  // Actor ids: mostly another task's (a swapped or dangling reference),
  // sometimes arbitrary bits.
  uint64_t DrawUInt64() {
    if (Below(3) != 0) return actor_ids_[Below(actor_ids_.size())];
    return Below(2) == 0 ? static_cast<uint64_t>(InterestingInt()) : rng_();
  }
  double DrawDouble() {
    static constexpr double kValues[] = {0.0, -1.0, 1.0, 1e300, -1e300, 0.5, 1e-300};
    switch (Below(4)) {
      case 0:
        return std::numeric_limits<double>::quiet_NaN();
      case 1:
        return std::numeric_limits<double>::infinity() * (Below(2) == 0 ? 1 : -1);
      default:
        return kValues[Below(std::size(kValues))];
    }
  }

  // One structural mutation somewhere in the plan; returns its description.
  std::string MutateStructure(proto::Plan& plan) {
    if (Below(8) == 0) return SwapIds(plan);
    google::protobuf::Message* message = &plan;
    std::string path = "plan";
    // Walk down into a random sub-message, stopping at random.
    for (int depth = 0; depth < 6 && Below(4) != 0; ++depth) {
      const google::protobuf::Reflection* r = message->GetReflection();
      std::vector<const google::protobuf::FieldDescriptor*> children;
      const google::protobuf::Descriptor* d = message->GetDescriptor();
      for (int f = 0; f < d->field_count(); ++f) {
        const auto* field = d->field(f);
        // Maps (task attributes) have their own mutation: reflection would
        // walk them in hash order, which differs between runs.
        if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE || field->is_map()) continue;
        if (field->is_repeated() ? r->FieldSize(*message, field) > 0 : r->HasField(*message, field)) {
          children.push_back(field);
        }
      }
      if (children.empty()) break;
      const auto* field = children[Below(children.size())];
      if (field->is_repeated()) {
        const int i = static_cast<int>(Below(static_cast<uint64_t>(r->FieldSize(*message, field))));
        message = r->MutableRepeatedMessage(message, field, i);
        path += StrCat(".", field->name(), "[", i, "]");
      } else {
        message = r->MutableMessage(message, field);
        path += StrCat(".", field->name());
      }
    }
    const google::protobuf::Descriptor* d = message->GetDescriptor();
    if (d->field_count() == 0) return path;
    const auto* field = d->field(static_cast<int>(Below(static_cast<uint64_t>(d->field_count()))));
    if (field->is_map()) {
      // The plan's maps are all attribute maps (a task's, an init rule's).
      if (auto* task = dynamic_cast<proto::Task*>(message)) return StrCat(path, ".", MutateAttrs(*task->mutable_attrs()));
      if (auto* rule = dynamic_cast<proto::InitRule*>(message)) return StrCat(path, ".", MutateAttrs(*rule->mutable_attrs()));
      return path;
    }
    const google::protobuf::Reflection* r = message->GetReflection();
    path += StrCat(".", field->name());
    if (!field->is_repeated()) {
      SetScalar(*message, field);
      return StrCat(path, " set");
    }
    const int size = r->FieldSize(*message, field);
    switch (size == 0 ? 4 : Below(6)) {
      case 0:  // remove one (swap it to the end first)
        r->SwapElements(message, field, static_cast<int>(Below(static_cast<uint64_t>(size))), size - 1);
        r->RemoveLast(message, field);
        return StrCat(path, " removed");
      case 1: {  // duplicate one
        const int i = static_cast<int>(Below(static_cast<uint64_t>(size)));
        if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
          std::unique_ptr<google::protobuf::Message> copy(r->GetRepeatedMessage(*message, field, i).New());
          copy->CopyFrom(r->GetRepeatedMessage(*message, field, i));
          r->AddAllocatedMessage(message, field, copy.release());
        } else {
          AddRepeatedScalar(*message, field);
          CopyRepeatedScalar(*message, field, i, size);
        }
        return StrCat(path, " duplicated");
      }
      case 2:
        r->SwapElements(message, field, static_cast<int>(Below(static_cast<uint64_t>(size))),
                        static_cast<int>(Below(static_cast<uint64_t>(size))));
        return StrCat(path, " swapped");
      case 3:
        if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
          r->ClearField(message, field);
          return StrCat(path, " cleared");
        }
        SetRepeatedScalar(*message, field, static_cast<int>(Below(static_cast<uint64_t>(size))));
        return StrCat(path, " element set");
      case 4:
        AddRepeatedScalar(*message, field);
        return StrCat(path, " added");
      default:
        r->ClearField(message, field);
        return StrCat(path, " cleared");
    }
  }
  void CopyRepeatedScalar(google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field, int from,
                          int to) {
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection* r = message.GetReflection();
    switch (field->cpp_type()) {
      case FD::CPPTYPE_INT32:
        r->SetRepeatedInt32(&message, field, to, r->GetRepeatedInt32(message, field, from));
        break;
      case FD::CPPTYPE_INT64:
        r->SetRepeatedInt64(&message, field, to, r->GetRepeatedInt64(message, field, from));
        break;
      case FD::CPPTYPE_UINT32:
        r->SetRepeatedUInt32(&message, field, to, r->GetRepeatedUInt32(message, field, from));
        break;
      case FD::CPPTYPE_UINT64:
        r->SetRepeatedUInt64(&message, field, to, r->GetRepeatedUInt64(message, field, from));
        break;
      default:
        break;  // the drawn value stays
    }
  }
  // Removes, adds or changes an attribute, picked in key order.
  std::string MutateAttrs(google::protobuf::Map<std::string, proto::AttrValue>& attrs) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : attrs) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    const std::string key = keys.empty() || Below(4) == 0 ? InterestingString() : keys[Below(keys.size())];
    if (!keys.empty() && Below(4) == 0) {
      attrs.erase(key);
      return StrCat("attrs['", key, "'] removed");
    }
    proto::AttrValue& value = attrs[key];
    switch (Below(7)) {
      case 0:
        value.set_i(InterestingInt());
        break;
      case 1:
        value.set_f(DrawDouble());
        break;
      case 2:
        value.set_b(Below(2) == 0);
        break;
      case 3:
        value.set_s(InterestingString());
        break;
      case 4:
        value.set_dtype(static_cast<proto::DType>(static_cast<int>(Below(10)) - 2));
        break;
      case 5: {
        proto::Ints* ints = value.mutable_ints();
        for (uint64_t i = 0, n = Below(6); i < n; ++i) ints->add_values(InterestingInt());
        break;
      }
      default:
        value.Clear();
        break;  // no value set
    }
    return StrCat("attrs['", key, "'] set");
  }

  // Exchanges the ids of two tasks or two descs, or points a reference at
  // another desc.
  std::string SwapIds(proto::Plan& plan) {
    if (plan.tasks_size() < 2 || plan.register_descs_size() < 2) return "nothing to swap";
    const auto pick = [this](int n) { return static_cast<int>(Below(static_cast<uint64_t>(n))); };
    switch (Below(3)) {
      case 0: {
        proto::Task& a = *plan.mutable_tasks(pick(plan.tasks_size()));
        proto::Task& b = *plan.mutable_tasks(pick(plan.tasks_size()));
        const uint64_t id = a.actor_id();
        a.set_actor_id(b.actor_id());
        b.set_actor_id(id);
        return "task ids swapped";
      }
      case 1: {
        proto::RegisterDesc& a = *plan.mutable_register_descs(pick(plan.register_descs_size()));
        proto::RegisterDesc& b = *plan.mutable_register_descs(pick(plan.register_descs_size()));
        const int64_t id = a.id();
        a.set_id(b.id());
        b.set_id(id);
        return "desc ids swapped";
      }
      default: {
        proto::Task& task = *plan.mutable_tasks(pick(plan.tasks_size()));
        if (task.inputs_size() == 0) return "no ref to repoint";
        task.mutable_inputs(pick(task.inputs_size()))
            ->set_register_desc_id(plan.register_descs(pick(plan.register_descs_size())).id());
        return "ref repointed";
      }
    }
  }

  std::string MutateBytes(std::string& bytes) {
    const auto at = [&](size_t extra = 0) { return static_cast<size_t>(Below(bytes.size() + extra)); };
    switch (bytes.empty() ? 2 : Below(8)) {
      case 0: {
        for (uint64_t i = 0, n = 1 + Below(8); i < n; ++i) bytes[at()] ^= static_cast<char>(1u << Below(8));
        return "bits flipped";
      }
      case 1:
        bytes[at()] = static_cast<char>(Below(2) == 0 ? 0xff : rng_());
        return "byte set";
      case 2: {
        std::string insert;
        for (uint64_t i = 0, n = 1 + Below(16); i < n; ++i) insert.push_back(static_cast<char>(rng_()));
        bytes.insert(at(1), insert);
        return "bytes inserted";
      }
      case 3: {
        const size_t from = at();
        bytes.erase(from, 1 + Below(std::min<uint64_t>(64, bytes.size() - from)));
        return "bytes deleted";
      }
      case 4:
        bytes.resize(at());
        return "truncated";
      case 5: {
        const size_t from = at();
        const std::string chunk = bytes.substr(from, 1 + Below(64));
        bytes.insert(at(1), chunk);
        return "range duplicated";
      }
      case 6: {  // a varint of 10 bytes, all continuation bits: huge lengths and values
        bytes.insert(at(1), std::string(9, static_cast<char>(0xff)) + std::string(1, '\x01'));
        return "huge varint";
      }
      default: {  // a piece of another plan
        const std::string& other = base_bytes_[Below(base_bytes_.size())];
        const size_t from = static_cast<size_t>(Below(other.size()));
        bytes.replace(at(), 1 + Below(32), other.substr(from, 1 + Below(256)));
        return "spliced";
      }
    }
  }

  std::mt19937_64 rng_;
  const std::vector<proto::Plan>& bases_;
  const std::vector<std::string>& base_bytes_;
  std::vector<std::string> op_names_;
  std::vector<uint64_t> actor_ids_;
};

// "validate INVALID_ARGUMENT: task '…' (…) consumes desc # which" -> the
// stage, the code and the first words, with digits, quoted names and
// parenthesised parts folded.
std::string ErrorClass(std::string_view stage, const absl::Status& status) {
  std::string words;
  int count = 0, depth = 0;
  bool quoted = false;
  for (char c : status.message()) {
    if (c == '\'' && depth == 0) {
      quoted = !quoted;
      if (!quoted) words += "'…'";
      continue;
    }
    if (quoted) continue;
    if (c == '(' || c == ')') {
      depth += c == '(' ? 1 : -1;
      if (depth == 0 && c == ')') words += "(…)";
      continue;
    }
    if (depth > 0) continue;
    if (c == ' ' && ++count == 6) break;
    if (c >= '0' && c <= '9') {
      if (words.empty() || words.back() != '#') words += '#';
      continue;
    }
    words += c;
  }
  return StrCat(stage, " ", absl::StatusCodeToString(status.code()), ": ", words);
}

// Aborts the process when a case runs longer than kHangSeconds.
class Watchdog {
 public:
  Watchdog()
      : thread_([this] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!stop_) {
            cv_.wait_for(lock, std::chrono::seconds(1));
            if (case_ >= 0 &&
                std::chrono::steady_clock::now() - started_ > std::chrono::duration<double>(kHangSeconds)) {
              std::fprintf(stderr, "plan fuzz: case %lld has run for more than %.0f s (%s): hang\n",
                           static_cast<long long>(case_), kHangSeconds, what_.c_str());
              std::abort();
            }
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Begin(int64_t index, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    case_ = index;
    what_ = what;
    started_ = std::chrono::steady_clock::now();
  }
  void End() {
    std::lock_guard<std::mutex> lock(mu_);
    case_ = -1;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t case_ = -1;
  std::string what_;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

TEST(PlanFuzz, EveryMutatedPlanLoadsOrFailsWithAnError) {
  // Invalid UTF-8 in a string field is a parse error; protobuf also logs
  // each one, which would drown the counts.
  google::protobuf::LogSilencer silence;
  const auto seed = static_cast<uint64_t>(EnvInt("TESSERA_FUZZ_SEED", static_cast<int64_t>(kDefaultSeed)));
  const int64_t cases = EnvInt("TESSERA_FUZZ_CASES", kDefaultCases);
  std::printf("plan fuzz: seed %llu (TESSERA_FUZZ_SEED), %lld cases (TESSERA_FUZZ_CASES)\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(cases));

  const std::vector<Layout> layouts = {
      {.name = "one device", .optimizer = graph::OptimizerKind::kAdamW, .clip = true},
      {.name = "data 2, 2 micro-batches", .data = 2, .micro_batches = 2},
      {.name = "tensor 2", .tensor = 2},
      {.name = "pipeline 2, 2 micro-batches", .pipeline = 2, .micro_batches = 2},
      {.name = "data 2 x tensor 2", .data = 2, .tensor = 2},
  };
  std::vector<proto::Plan> bases;
  std::vector<std::string> base_bytes;
  actors::HostCallbacks callbacks;
  for (const Layout& layout : layouts) {
    auto plan = PlanFor(layout);
    ASSERT_TRUE(plan.ok()) << layout.name << ": " << plan.status();
    AddCallbacks(*plan, callbacks);
    bases.push_back(*plan);
    base_bytes.push_back(actors::SerializePlan(*plan));
    std::printf("plan fuzz: base plan '%s': %d tasks, %d register descs, %zu bytes\n", layout.name.c_str(),
                plan->tasks_size(), plan->register_descs_size(), base_bytes.back().size());
  }
  actors::RuntimeOptions options;
  options.callbacks = callbacks;
  options.memory_limit_bytes = kMemoryLimit;
  // The unmutated plans load: the fuzzer starts from plans that pass every stage.
  for (size_t i = 0; i < bases.size(); ++i) {
    ASSERT_TRUE(actors::ValidatePlan(bases[i], ops::BuiltinOps()).ok()) << layouts[i].name;
    auto runtime = actors::Runtime::LoadSerialized(base_bytes[i], options);
    ASSERT_TRUE(runtime.ok()) << layouts[i].name << ": " << runtime.status();
  }

  std::map<std::string, int64_t> classes;
  int64_t ok = 0, validated = 0;
  double slowest = 0;
  int64_t slowest_case = -1;
  std::vector<std::string> too_slow;
  Mutator mutator(bases, base_bytes);
  Watchdog watchdog;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < cases; ++i) {
    // Case i depends on (seed, i) only: rerun one with the same seed.
    const size_t base = static_cast<size_t>(i) % bases.size();
    std::string what;
    const std::string bytes = mutator.Mutate(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i), base, &what);
    what = StrCat(layouts[base].name, ": ", what);
    watchdog.Begin(i, what);
    const auto case_start = std::chrono::steady_clock::now();
    std::string outcome;
    auto parsed = actors::ParsePlan(bytes);
    if (!parsed.ok()) {
      outcome = ErrorClass("parse", parsed.status());
    } else {
      const absl::Status valid = actors::ValidatePlan(*parsed, ops::BuiltinOps());
      validated += valid.ok();
      if (!valid.ok()) outcome = ErrorClass("validate", valid);
      // Loading validates the same way, so it refuses what ValidatePlan
      // refuses: checked on every 8th such case (it parses and validates again).
      if (valid.ok() || i % 8 == 0) {
        auto runtime = actors::Runtime::LoadSerialized(bytes, options);
        if (!valid.ok()) {
          EXPECT_EQ(runtime.status(), valid) << "case " << i << " (" << what << ")";
        } else if (!runtime.ok()) {
          outcome = ErrorClass("load", runtime.status());
        } else {
          ++ok;
        }
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - case_start).count();
    watchdog.End();
    if (!outcome.empty()) ++classes[outcome];
    if (seconds > slowest) {
      slowest = seconds;
      slowest_case = i;
    }
    if (seconds > kCaseLimitSeconds) too_slow.push_back(StrCat("case ", i, " (", what, "): ", seconds, " s"));
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("plan fuzz: %lld cases in %.1f s (slowest: case %lld, %.3f s): %lld OK, %lld valid, %lld errors\n",
              static_cast<long long>(cases), total, static_cast<long long>(slowest_case), slowest,
              static_cast<long long>(ok), static_cast<long long>(validated), static_cast<long long>(cases - ok));
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [name, count] : classes) sorted.emplace_back(count, name);
  std::sort(sorted.rbegin(), sorted.rend());
  for (const auto& [count, name] : sorted) std::printf("  %6lld  %s\n", static_cast<long long>(count), name.c_str());
  EXPECT_TRUE(too_slow.empty()) << too_slow.size() << " cases over " << kCaseLimitSeconds
                                << " s, first: " << too_slow[0];
  // The mutations reach every stage: some plans still load, and errors come
  // from both parsing and validation.
  EXPECT_GT(ok, 0);
  bool parse = false, validate = false;
  for (const auto& [name, count] : classes) {
    parse |= name.starts_with("parse");
    validate |= name.starts_with("validate");
  }
  EXPECT_TRUE(parse && validate);
}

}  // namespace
}  // namespace tessera
