#include "train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "actors/actor_id.h"
#include "actors/init_rules.h"
#include "actors/plan.h"
#include "core/checked.h"
#include "core/checksum.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "tessera.checkpoint";
constexpr int kVersion = 1;
// The rank files' metadata key holding each tensor's place in its logical tensor.
constexpr std::string_view kSlicesKey = "tessera.slices";
// ... and each tensor's checksum (core/checksum.h), which a reader checks
// before handing out a byte of the file (every file, where index.json
// names the algorithm; a file of an older index that carries them too).
constexpr std::string_view kChecksumsKey = "tessera.checksums";
constexpr std::string_view kIterPrefix = "iter_";
// Hugging Face: GPT2LMHeadModel's prefix of GPT2Model's names, and the file
// name of a model directory's weights.
constexpr std::string_view kHfPrefix = "transformer.";
constexpr std::string_view kHfFileName = "model.safetensors";
// An index.json is read whole: at most this many bytes (a tensor's entry
// per rank file is ~200 bytes).
constexpr std::uintmax_t kMaxIndexBytes = std::uintmax_t{1} << 30;

// One tensor a Parameter task keeps, as a checkpoint sees it.
struct KeptTensorInfo {
  std::string name;
  TensorSlice slice;
  TensorMeta local;
  bool write = false;
};
struct KeptTaskInfo {
  const proto::Task* task = nullptr;
  uint32_t rank = 0;
  std::vector<KeptTensorInfo> tensors;
};

// The Parameter tasks of `plan` that keep tensors, with each tensor's name,
// slice and local meta (the variable's from its register desc, the state's
// from the task; the slices from the init rules, in the same order).
absl::StatusOr<std::vector<KeptTaskInfo>> KeptTasks(const proto::Plan& plan) {
  std::map<int64_t, const proto::RegisterDesc*> descs;
  for (const auto& desc : plan.register_descs()) descs[desc.id()] = &desc;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> rank_of;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    rank_of[{plan.ranks(r).node(), plan.ranks(r).device_index()}] = static_cast<uint32_t>(r);
  }
  std::vector<KeptTaskInfo> out;
  for (const auto& task : plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_PARAMETER || task.kept_size() == 0) continue;
    const auto fail = [&](auto&&... parts) {
      return absl::InvalidArgumentError(StrCat("task '", task.name(), "': ", parts...));
    };
    KeptTaskInfo info;
    info.task = &task;
    const actors::ActorId id = actors::DecodeActorId(task.actor_id());
    if (plan.ranks_size() == 0) {
      info.rank = id.device_index;
    } else {
      auto it = rank_of.find({id.node, id.device_index});
      if (it == rank_of.end()) return fail("its device is no rank of the plan");
      info.rank = it->second;
    }
    std::vector<TensorMeta> metas;
    if (task.produced_register_desc_ids_size() != 1 || !descs.contains(task.produced_register_desc_ids(0)) ||
        descs.at(task.produced_register_desc_ids(0))->tensors_size() != 1) {
      return fail("a parameter produces one register desc of one tensor");
    }
    ASSIGN_OR_RETURN(TensorMeta variable,
                     actors::TensorMetaFromProto(descs.at(task.produced_register_desc_ids(0))->tensors(0)));
    metas.push_back(std::move(variable));
    for (const auto& state : task.state()) {
      ASSIGN_OR_RETURN(TensorMeta meta, actors::TensorMetaFromProto(state));
      metas.push_back(std::move(meta));
    }
    std::vector<const proto::TensorSlice*> slices;
    for (const auto& rule : task.init()) {
      for (const auto& slice : rule.slices()) slices.push_back(&slice);
    }
    if (static_cast<size_t>(task.kept_size()) != metas.size() || slices.size() != metas.size()) {
      return fail("keeps ", task.kept_size(), " tensors, holds ", metas.size(), ", its init rules write ",
                  slices.size());
    }
    for (size_t k = 0; k < metas.size(); ++k) {
      KeptTensorInfo t;
      t.name = task.kept(static_cast<int>(k)).name();
      t.write = task.kept(static_cast<int>(k)).write();
      t.local = metas[k];
      ASSIGN_OR_RETURN(t.slice, actors::TensorSliceFromProto(*slices[k], metas[k].shape));
      info.tensors.push_back(std::move(t));
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::string RankFileName(uint32_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05u.safetensors", rank);
  return name;
}

int64_t Volume(const std::vector<int64_t>& dims) {
  int64_t v = 1;
  for (int64_t d : dims) v *= d;
  return v;
}

// Copies the overlap of a source block (offset `src_offset`, extent
// `src_shape`, row-major at `src`) and a destination block into the
// destination; returns the elements copied.
int64_t CopyOverlap(const char* src, const std::vector<int64_t>& src_offset, const std::vector<int64_t>& src_shape,
                    char* dst, const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& dst_shape,
                    size_t element_bytes) {
  const size_t rank = dst_shape.size();
  if (rank == 0) {
    std::memcpy(dst, src, element_bytes);
    return 1;
  }
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t a = 0; a < rank; ++a) {
    lo[a] = std::max(src_offset[a], dst_offset[a]);
    hi[a] = std::min(src_offset[a] + src_shape[a], dst_offset[a] + dst_shape[a]);
    if (lo[a] >= hi[a]) return 0;
  }
  // Row-major strides (in elements) of both blocks.
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t a = rank - 1; a > 0; --a) {
    src_stride[a - 1] = src_stride[a] * src_shape[a];
    dst_stride[a - 1] = dst_stride[a] * dst_shape[a];
  }
  const int64_t run = hi[rank - 1] - lo[rank - 1];
  std::vector<int64_t> index(lo.begin(), lo.end());  // over all axes but the last
  int64_t copied = 0;
  while (true) {
    int64_t s = 0, d = 0;
    for (size_t a = 0; a < rank; ++a) {
      s += (index[a] - src_offset[a]) * src_stride[a];
      d += (index[a] - dst_offset[a]) * dst_stride[a];
    }
    std::memcpy(dst + static_cast<size_t>(d) * element_bytes, src + static_cast<size_t>(s) * element_bytes,
                static_cast<size_t>(run) * element_bytes);
    copied += run;
    size_t a = rank - 1;
    while (a > 0) {
      --a;
      if (++index[a] < hi[a]) break;
      index[a] = lo[a];
      if (a == 0) return copied;
    }
    if (rank == 1) return copied;
  }
}

bool Overlaps(const std::vector<int64_t>& ao, const Shape& as, const std::vector<int64_t>& bo, const Shape& bs) {
  for (size_t a = 0; a < ao.size(); ++a) {
    if (std::max(ao[a], bo[a]) >= std::min(ao[a] + as.dims()[a], bo[a] + bs.dims()[a])) return false;
  }
  return true;
}

// "iter_0000123" -> 123; nullopt for any other name.
std::optional<int64_t> IterationOfName(const std::string& name) {
  if (name.size() <= kIterPrefix.size() || name.compare(0, kIterPrefix.size(), kIterPrefix) != 0) return std::nullopt;
  int64_t value = 0;
  const char* first = name.data() + kIterPrefix.size();
  const char* last = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || ptr != last || value < 0) return std::nullopt;
  return value;
}

absl::StatusOr<std::vector<int64_t>> IntList(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) return absl::InvalidArgumentError(StrCat(what, " is not a list of integers"));
  std::vector<int64_t> out;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 62)) {
      return absl::InvalidArgumentError(StrCat(what, " is not a list of non-negative integers: ", j.dump()));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

fs::path CheckpointsDir(const fs::path& output_dir) { return output_dir / "checkpoints"; }

fs::path CheckpointPath(const fs::path& output_dir, int64_t iteration) {
  char name[40];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return CheckpointsDir(output_dir) / name;
}

absl::StatusOr<DirectoryClaim> ClaimCheckpointsDir(const fs::path& output_dir) {
  absl::StatusOr<DirectoryClaim> claimed = DirectoryClaim::AcquireShared(CheckpointsDir(output_dir));
  if (!claimed.ok()) {
    return absl::Status(claimed.status().code(), StrCat("train.output_dir: ", claimed.status().message()));
  }
  return claimed;
}

absl::Status CheckNoCheckpointWriters(const fs::path& output_dir) {
  if (DirectoryClaim::CheckUnclaimed(CheckpointsDir(output_dir)).ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      StrCat("train.output_dir: '", CheckpointsDir(output_dir).string(),
             "' is still written by a node of an earlier run (a worker that lost its master stops its job within "
             "seconds): try again once it has stopped"));
}

fs::path BestCheckpointPath(const fs::path& output_dir) { return CheckpointsDir(output_dir) / "best"; }

fs::path CheckpointTempPath(const fs::path& output_dir, int64_t iteration, const std::string& tag) {
  return CheckpointsDir(output_dir) /
         StrCat(".", CheckpointPath(output_dir, iteration).filename().string(), ".tmp-", tag);
}

namespace {
// "name@offset/local" of a kept task's variable (tensor 0).
std::string VariableKey(const KeptTaskInfo& info) {
  const KeptTensorInfo& t = info.tensors.at(0);
  std::string key = StrCat(t.name, "@");
  for (int64_t o : t.slice.offset) key += StrCat(o, ",");
  return key + t.slice.local.ToString() + "/" + t.slice.logical.ToString();
}
}  // namespace

void KeptStore::Bind(const proto::Plan& plan, actors::HostCallbacks& callbacks) {
  if (auto tasks = KeptTasks(plan); tasks.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const KeptTaskInfo& info : *tasks) variables_[info.task->callback()] = VariableKey(info);
  }
  for (const auto& task : plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_PARAMETER || task.kept_size() == 0 || task.callback().empty()) continue;
    const std::string callback = task.callback();
    // Called after the parameter's last update: the runtime writes its
    // tensors no more, so the store keeps the tensors themselves (a copy
    // would double the parameters and optimizer state at a segment's end).
    callbacks.finalizers[callback] = [this, callback](const std::vector<Tensor>& tensors) -> absl::Status {
      std::lock_guard<std::mutex> lock(mu_);
      values_[callback] = tensors;
      return absl::OkStatus();
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!values_.contains(callback)) continue;
    }
    callbacks.initializers[callback] = [this, callback](const std::vector<Tensor>& tensors) -> absl::Status {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<Tensor>& values = values_.at(callback);
      if (values.size() != tensors.size()) {
        return absl::InternalError(
            StrCat("kept values of '", callback, "': ", values.size(), " tensors, the task holds ", tensors.size()));
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        Tensor target = tensors[i];
        RETURN_IF_ERROR(target.CopyFrom(values[i]));
      }
      // The store holds the run's own tensors from now on (equal until its
      // first update; its finalizer hands them over again at its end): the
      // earlier run's go, so a segment never holds the parameters and
      // optimizer state twice (a second copy beside the plan's, +1.4 GiB
      // for GPT-2 small from the first checkpoint or evaluation on). A
      // checkpoint still being written from values() keeps its own
      // references.
      values = tensors;
      return absl::OkStatus();
    };
  }
}

absl::Status KeptStore::BindVariables(const proto::Plan& plan, actors::HostCallbacks& callbacks) const {
  ASSIGN_OR_RETURN(const std::vector<KeptTaskInfo> tasks, KeptTasks(plan));
  std::lock_guard<std::mutex> lock(mu_);
  for (const KeptTaskInfo& info : tasks) {
    const std::string callback = info.task->callback();
    auto it = variables_.find(callback);
    if (it == variables_.end() || it->second != VariableKey(info) || !values_.contains(callback)) {
      return absl::InternalError(StrCat("'", info.tensors.at(0).name, "' (task '", info.task->name(),
                                        "') is laid out unlike in the training plan"));
    }
    callbacks.initializers[callback] = [this, callback](const std::vector<Tensor>& tensors) -> absl::Status {
      std::lock_guard<std::mutex> lock(mu_);
      Tensor target = tensors.at(0);
      return target.CopyFrom(values_.at(callback).at(0));
    };
  }
  return absl::OkStatus();
}

bool KeptStore::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.empty();
}

KeptValues KeptStore::values() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_;
}

absl::Status WriteCheckpointShards(const fs::path& dir, const proto::Plan& plan, const KeptValues& values) {
  ASSIGN_OR_RETURN(const std::vector<KeptTaskInfo> tasks, KeptTasks(plan));
  struct RankFile {
    std::vector<std::pair<std::string, Tensor>> tensors;
    nlohmann::json slices = nlohmann::json::object();
    nlohmann::json checksums = nlohmann::json::object();
  };
  std::map<uint32_t, RankFile> files;
  for (const KeptTaskInfo& info : tasks) {
    auto it = values.find(info.task->callback());
    if (it == values.end()) {
      return absl::FailedPreconditionError(StrCat("checkpoint: no trained values of task '", info.task->name(), "'"));
    }
    if (it->second.size() != info.tensors.size()) {
      return absl::InternalError(StrCat("checkpoint: task '", info.task->name(), "' kept ", it->second.size(),
                                        " tensors, its plan names ", info.tensors.size()));
    }
    for (size_t k = 0; k < info.tensors.size(); ++k) {
      const KeptTensorInfo& t = info.tensors[k];
      if (!t.write) continue;
      RankFile& file = files[info.rank];
      if (file.slices.contains(t.name)) {
        return absl::InternalError(StrCat("checkpoint: rank ", info.rank, " holds two shards of '", t.name, "'"));
      }
      file.tensors.emplace_back(t.name, it->second[k]);
      file.slices[t.name] = {{"logical_shape", t.slice.logical.dims()}, {"offset", t.slice.offset}};
      const Tensor& value = it->second[k];
      file.checksums[t.name] =
          Checksum({static_cast<const char*>(value.raw_data()), static_cast<size_t>(value.NumBytes())});
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot create ", dir.string(), ": ", ec.message()));
  for (const auto& [rank, file] : files) {
    RETURN_IF_ERROR(WriteSafetensors(dir / RankFileName(rank), file.tensors,
                                     {{std::string(kSlicesKey), file.slices.dump()},
                                      {std::string(kChecksumsKey), file.checksums.dump()},
                                      {"format", "pt"}}));
  }
  return absl::OkStatus();
}

absl::Status CommitCheckpoint(const fs::path& temp_dir, const fs::path& final_dir, const CheckpointState& state) {
  struct TensorShards {
    DType dtype = DType::kF32;
    std::vector<int64_t> logical;
    nlohmann::json shards = nlohmann::json::array();
    std::vector<std::pair<std::vector<int64_t>, Shape>> boxes;
  };
  std::map<std::string, TensorShards> tensors;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(temp_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors")) names.push_back(name);
  }
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot list ", temp_dir.string(), ": ", ec.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(temp_dir / name));
    auto slices_text = file->metadata().find(kSlicesKey);
    if (slices_text == file->metadata().end()) {
      return absl::InvalidArgumentError(StrCat("checkpoint: ", (temp_dir / name).string(), " has no ", kSlicesKey));
    }
    const nlohmann::json slices = nlohmann::json::parse(slices_text->second, nullptr, false);
    if (!slices.is_object()) return absl::InvalidArgumentError(StrCat("checkpoint: ", name, ": bad ", kSlicesKey));
    auto checksums_text = file->metadata().find(kChecksumsKey);
    const nlohmann::json checksums = checksums_text == file->metadata().end()
                                         ? nlohmann::json()
                                         : nlohmann::json::parse(checksums_text->second, nullptr, false);
    for (const auto& [tensor_name, entry] : file->tensors()) {
      if (!slices.contains(tensor_name)) {
        return absl::InvalidArgumentError(StrCat("checkpoint: ", name, ": no slice for '", tensor_name, "'"));
      }
      if (!checksums.is_object() || !checksums.contains(tensor_name) || !checksums[tensor_name].is_string()) {
        return absl::InvalidArgumentError(StrCat("checkpoint: ", name, ": no checksum for '", tensor_name, "'"));
      }
      const nlohmann::json& slice = slices.at(tensor_name);
      ASSIGN_OR_RETURN(std::vector<int64_t> logical,
                       IntList(slice.value("logical_shape", nlohmann::json()), "logical_shape"));
      ASSIGN_OR_RETURN(std::vector<int64_t> offset, IntList(slice.value("offset", nlohmann::json()), "offset"));
      if (logical.size() != static_cast<size_t>(entry.shape.rank()) || offset.size() != logical.size()) {
        return absl::InvalidArgumentError(
            StrCat("checkpoint: ", name, ": '", tensor_name, "' has a slice of another rank"));
      }
      for (size_t a = 0; a < logical.size(); ++a) {
        if (offset[a] + entry.shape.dims()[a] > logical[a]) {
          return absl::InvalidArgumentError(
              StrCat("checkpoint: ", name, ": '", tensor_name, "' lies outside its tensor"));
        }
      }
      auto [it, added] = tensors.try_emplace(tensor_name);
      TensorShards& t = it->second;
      if (added) {
        t.dtype = entry.dtype;
        t.logical = logical;
      } else if (t.dtype != entry.dtype || t.logical != logical) {
        return absl::InvalidArgumentError(
            StrCat("checkpoint: '", tensor_name, "' has different shapes or dtypes in different rank files"));
      }
      for (const auto& [other_offset, other_shape] : t.boxes) {
        if (Overlaps(offset, entry.shape, other_offset, other_shape)) {
          return absl::InternalError(StrCat("checkpoint: two shards of '", tensor_name, "' overlap (", name, ")"));
        }
      }
      t.boxes.emplace_back(offset, entry.shape);
      t.shards.push_back({{"file", name},
                          {"offset", offset},
                          {"shape", entry.shape.dims()},
                          {"checksum", checksums[tensor_name].get<std::string>()}});
    }
  }
  nlohmann::json index = {
      {"format", kFormat},
      {"version", kVersion},
      {"iteration", state.iteration},
      {"train_state", {{"iteration", state.iteration}, {"consumed_samples", state.iteration * state.global_batch}}},
      {"config", state.config},
      {"checksums", kChecksumAlgorithm},
      {"tensors", nlohmann::json::object()}};
  if (!state.best.is_null()) index["train_state"]["best"] = state.best;
  if (state.evaluation_pending) index["train_state"]["evaluation_pending"] = true;
  for (auto& [name, t] : tensors) {
    int64_t covered = 0;
    for (const auto& box : t.boxes) covered += box.second.NumElements();
    if (covered != Volume(t.logical)) {
      return absl::InternalError(StrCat("checkpoint: the shards of '", name, "' cover ", covered, " of its ",
                                        Volume(t.logical), " elements (a rank file is missing)"));
    }
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDTypeName(t.dtype));
    index["tensors"][name] = {{"dtype", dtype}, {"shape", t.logical}, {"shards", std::move(t.shards)}};
  }
  RETURN_IF_ERROR(WriteFileDurably(temp_dir / "index.json", index.dump(1)));
  // Replace an older checkpoint of the same name (a rerun's iteration, the
  // best one): the two swapped in one step, so that a crash leaves one of
  // them in place, whole; then the old one, now at the temporary's name,
  // goes (or the next run's RemoveCheckpointTemps removes it).
  if (fs::exists(final_dir, ec)) {
    if (::renameat2(AT_FDCWD, temp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      RETURN_IF_ERROR(SyncPath(final_dir.parent_path()));
      fs::remove_all(temp_dir, ec);
      return absl::OkStatus();
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
      return absl::InternalError(StrCat("checkpoint: cannot put ", temp_dir.string(), " in the place of ",
                                        final_dir.string(), ": ", std::strerror(errno)));
    }
  }
  // A file system without the swap: the old one is moved aside first, so
  // that a crash in between leaves it whole, as .NAME.old-TEMP, which the
  // next run's RemoveCheckpointTemps puts back.
  fs::path aside;
  if (fs::exists(final_dir, ec)) {
    aside = final_dir.parent_path() / StrCat(".", final_dir.filename().string(), ".old-", temp_dir.filename().string());
    fs::rename(final_dir, aside, ec);
    if (ec)
      return absl::InternalError(StrCat("checkpoint: cannot move ", final_dir.string(), " aside: ", ec.message()));
  }
  fs::rename(temp_dir, final_dir, ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot rename ", temp_dir.string(), ": ", ec.message()));
  RETURN_IF_ERROR(SyncPath(final_dir.parent_path()));
  if (!aside.empty()) fs::remove_all(aside, ec);
  return absl::OkStatus();
}

namespace {
// A committed checkpoint's index.json, parsed (an object).
absl::StatusOr<nlohmann::json> ReadIndex(const fs::path& checkpoint) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(checkpoint / "index.json", kMaxIndexBytes));
  nlohmann::json index =
      text.find('\0') != std::string::npos ? nlohmann::json() : nlohmann::json::parse(text, nullptr, false);
  if (!index.is_object()) {
    return absl::DataLossError(StrCat("checkpoint ", checkpoint.string(), ": index.json is no JSON object"));
  }
  return index;
}
}  // namespace

absl::Status LinkCheckpointShards(const fs::path& checkpoint, const fs::path& temp_dir) {
  ASSIGN_OR_RETURN(const nlohmann::json index, ReadIndex(checkpoint));
  std::set<std::string> files;
  const auto tensors = index.find("tensors");
  if (tensors != index.end() && tensors->is_object()) {
    for (const auto& [name, tensor] : tensors->items()) {
      if (!tensor.is_object() || !tensor.contains("shards") || !tensor["shards"].is_array()) continue;
      for (const nlohmann::json& shard : tensor["shards"]) {
        if (shard.is_object() && shard.contains("file") && shard["file"].is_string()) {
          files.insert(shard["file"].get<std::string>());
        }
      }
    }
  }
  std::error_code ec;
  fs::create_directories(temp_dir, ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot create ", temp_dir.string(), ": ", ec.message()));
  for (const std::string& name : files) {
    // (Names as CommitCheckpoint writes them: a plain file of the directory.)
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return absl::DataLossError(
          StrCat("checkpoint ", checkpoint.string(), ": index.json names the file '", OneLine(name), "'"));
    }
    fs::create_hard_link(checkpoint / name, temp_dir / name, ec);
    if (!ec) continue;
    ec.clear();
    fs::copy_file(checkpoint / name, temp_dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(StrCat("checkpoint: cannot copy ", (checkpoint / name).string(), " into ",
                                        temp_dir.string(), ": ", ec.message()));
    }
    RETURN_IF_ERROR(SyncPath(temp_dir / name));
  }
  return SyncPath(temp_dir);
}

absl::Status ClearEvaluationPending(const fs::path& checkpoint) {
  ASSIGN_OR_RETURN(nlohmann::json index, ReadIndex(checkpoint));
  const auto state = index.find("train_state");
  if (state == index.end() || !state->is_object() || !state->contains("evaluation_pending")) return absl::OkStatus();
  state->erase("evaluation_pending");
  return WriteFileDurably(checkpoint / "index.json", index.dump(1));
}

absl::StatusOr<fs::path> ResolveCheckpoint(const fs::path& path) {
  if (path.empty()) return absl::InvalidArgumentError("the checkpoint's path is empty");
  std::error_code ec;
  if (fs::exists(path / "index.json", ec) || fs::is_regular_file(path, ec) ||
      fs::is_regular_file(path / kHfFileName, ec)) {
    return path;  // a checkpoint, or Hugging Face weights
  }
  // A directory that cannot be searched: said so (it was called "neither a
  // checkpoint nor an output directory").
  if ((void)fs::status(path / "index.json", ec);
      ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return absl::PermissionDeniedError(StrCat("cannot read ", path.string(), ": ", ec.message()));
  }
  if (!fs::exists(path, ec)) return absl::NotFoundError(StrCat(path.string(), ": no such file or directory"));
  if (!fs::is_directory(path, ec)) {
    return absl::InvalidArgumentError(StrCat(path.string(),
                                             " is not a checkpoint: give a checkpoint's directory, a training output "
                                             "directory or Hugging Face weights (a .safetensors file)"));
  }
  ASSIGN_OR_RETURN(const std::optional<fs::path> latest, LatestCheckpoint(path));
  if (!latest) {
    return absl::NotFoundError(StrCat(path.string(),
                                      " is neither a checkpoint (no index.json) nor an output directory with one "
                                      "(no checkpoints/iter_*)"));
  }
  return *latest;
}

absl::StatusOr<std::optional<fs::path>> LatestCheckpoint(const fs::path& output_dir) {
  const fs::path dir = CheckpointsDir(output_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return std::optional<fs::path>();
  std::optional<std::pair<int64_t, fs::path>> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::optional<int64_t> iteration = IterationOfName(entry.path().filename().string());
    if (iteration && (!best || *iteration > best->first)) best = {*iteration, entry.path()};
  }
  if (ec) return absl::InternalError(StrCat("cannot list ", dir.string(), ": ", ec.message()));
  if (!best) return std::optional<fs::path>();
  // A checkpoint appears whole (CommitCheckpoint renames it into place with
  // its index.json): a newest iter_* without one was damaged, and resuming
  // from an older one, or from scratch, would drop iterations unseen.
  // (One that cannot be read is not said to be incomplete: a resume
  // would be told to move a good checkpoint away.)
  const fs::file_status index = fs::status(best->second / "index.json", ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return absl::PermissionDeniedError(
        StrCat("cannot read ", (best->second / "index.json").string(), ": ", ec.message()));
  }
  if (!fs::is_directory(best->second, ec) || !fs::exists(index)) {
    return absl::DataLossError(StrCat(best->second.string(), " is the newest checkpoint but not a complete one (",
                                      fs::is_directory(best->second, ec) ? "no index.json" : "not a directory",
                                      "): move it away to start from the one before it"));
  }
  return std::optional<fs::path>(best->second);
}

namespace {

// Removes the entries of output_dir/checkpoints whose names `matches`.
absl::Status RemoveFromCheckpointsDir(const fs::path& output_dir,
                                      const std::function<bool(const std::string& name)>& matches) {
  const fs::path dir = CheckpointsDir(output_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (matches(entry.path().filename().string())) doomed.push_back(entry.path());
  }
  if (ec) return absl::InternalError(StrCat("cannot list ", dir.string(), ": ", ec.message()));
  for (const fs::path& path : doomed) {
    fs::remove_all(path, ec);
    if (ec) return absl::InternalError(StrCat("cannot remove ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RemoveCheckpointTemps(const fs::path& output_dir) {
  // A commit that replaced NAME and stopped between its two renames left
  // the old one as .NAME.old-TEMP and NAME missing: it goes back (it went,
  // and the best checkpoint with it); beside a NAME, it is a leftover.
  const fs::path dir = CheckpointsDir(output_dir);
  std::error_code ec;
  std::vector<fs::path> aside;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".") && name.find(".old-") != std::string::npos) aside.push_back(entry.path());
  }
  for (const fs::path& path : aside) {
    const std::string name = path.filename().string();
    const fs::path original = dir / name.substr(1, name.find(".old-") - 1);
    if (!fs::exists(original, ec) && !ec && original.filename() != "") {
      fs::rename(path, original, ec);
      if (ec) return absl::InternalError(StrCat("cannot put ", path.string(), " back: ", ec.message()));
      TLOG_WARN("checkpoints: {} put back from {} (a replacement of it was interrupted)", original.string(),
                path.filename().string());
    } else {
      fs::remove_all(path, ec);
      if (ec) return absl::InternalError(StrCat("cannot remove ", path.string(), ": ", ec.message()));
    }
  }
  return RemoveFromCheckpointsDir(output_dir, [](const std::string& name) {
    return name.starts_with(".iter_") && name.find(".tmp-") != std::string::npos;
  });
}

fs::path OverwrittenCheckpointsDir(const fs::path& output_dir) { return CheckpointsDir(output_dir) / ".overwritten"; }

absl::Status SetAsideCheckpoints(const fs::path& output_dir) {
  const fs::path dir = CheckpointsDir(output_dir), aside = OverwrittenCheckpointsDir(output_dir);
  const std::string best = BestCheckpointPath(output_dir).filename().string();
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  std::vector<fs::path> earlier;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (IterationOfName(name).has_value() || name == best) earlier.push_back(entry.path());
  }
  if (ec) return absl::InternalError(StrCat("cannot list ", dir.string(), ": ", ec.message()));
  if (earlier.empty()) return absl::OkStatus();
  // What an earlier overwrite that failed set aside is older still.
  fs::remove_all(aside, ec);
  if (ec) return absl::InternalError(StrCat("cannot remove ", aside.string(), ": ", ec.message()));
  fs::create_directory(aside, ec);
  if (ec) return absl::InternalError(StrCat("cannot create ", aside.string(), ": ", ec.message()));
  for (const fs::path& path : earlier) {
    fs::rename(path, aside / path.filename(), ec);
    if (ec) {
      return absl::InternalError(StrCat("cannot move ", path.string(), " into ", aside.string(), ": ", ec.message()));
    }
  }
  return SyncPath(dir);
}

absl::Status RemoveSetAsideCheckpoints(const fs::path& output_dir) {
  const fs::path aside = OverwrittenCheckpointsDir(output_dir);
  std::error_code ec;
  fs::remove_all(aside, ec);
  if (ec) return absl::InternalError(StrCat("cannot remove ", aside.string(), ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status PruneCheckpoints(const fs::path& output_dir, int64_t keep, const std::string& tag) {
  const fs::path dir = CheckpointsDir(output_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  std::vector<std::pair<int64_t, fs::path>> complete, incomplete;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (std::optional<int64_t> iteration = IterationOfName(name)) {
      // (One whose index.json cannot be read, a permission, is neither:
      // left as it is.)
      std::error_code status_error;
      const fs::file_status index = fs::status(entry.path() / "index.json", status_error);
      if (fs::exists(index)) {
        complete.emplace_back(*iteration, entry.path());
      } else if (!status_error || status_error == std::errc::no_such_file_or_directory) {
        incomplete.emplace_back(*iteration, entry.path());
      }
    } else if (name.starts_with(".iter_") && name.find(".tmp-") != std::string::npos &&
               !name.ends_with(".tmp-" + tag)) {
      stale.push_back(entry.path());
    }
  }
  std::sort(complete.begin(), complete.end());
  const int64_t drop = static_cast<int64_t>(complete.size()) - std::max<int64_t>(1, keep);
  std::vector<fs::path> pruned;
  for (int64_t i = 0; i < drop; ++i) pruned.push_back(complete[static_cast<size_t>(i)].second);
  // An iter_* without index.json older than the newest checkpoint: what a
  // pruning killed midway left before pruned checkpoints were first moved
  // aside (a commit renames a whole directory into place, so nothing else
  // makes one).
  for (const auto& [iteration, path] : incomplete) {
    if (!complete.empty() && iteration < complete.back().first) pruned.push_back(path);
  }
  // Each out of sight first, in one rename (to a temporary's name, which the
  // next run removes if this one dies while deleting it): a kill -9 during
  // the removal leaves no iter_* that is half a checkpoint.
  for (const fs::path& path : pruned) {
    const fs::path aside = dir / StrCat(".", path.filename().string(), ".tmp-pruned");
    fs::remove_all(aside, ec);
    fs::rename(path, aside, ec);
    if (ec) return absl::InternalError(StrCat("cannot move ", path.string(), " aside to remove it: ", ec.message()));
    stale.push_back(aside);
  }
  for (const fs::path& path : stale) {
    fs::remove_all(path, ec);
    if (ec) return absl::InternalError(StrCat("cannot remove ", path.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

namespace {

// `stored` (a Hugging Face file's shape) is `model` with trailing axes joined.
bool MergesTo(const Shape& model, const Shape& stored) {
  if (stored.rank() > model.rank() || model.NumElements() != stored.NumElements()) return false;
  if (stored.rank() == 0) return model.NumElements() == 1;
  for (int64_t a = 0; a + 1 < stored.rank(); ++a) {
    if (model[a] != stored[a]) return false;
  }
  return true;  // the last stored axis holds the rest (element counts agree)
}

bool ConvertsToF32(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

// `count` elements of `dtype` at `src` as f32.
std::vector<float> ToF32(const char* src, DType dtype, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF16: {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = HalfToFloat(bits);
        break;
      }
      case DType::kBF16: {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = BFloat16ToFloat(bits);
        break;
      }
      case DType::kF64: {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = static_cast<float>(v);
        break;
      }
      default:
        std::memcpy(&out[i], src + 4 * i, 4);
    }
  }
  return out;
}

// Part k of the converted Hugging Face tensor `t`, moved between Tessera's
// whole tensor (t.ModelShape(), row-major) and the part's own row-major
// elements (t.hf_shape), `element` bytes each: to the model from `src` (the
// part) into `dst` (the whole), or back.
void MovePart(const models::Model::HfTensor& t, int64_t k, size_t element, bool to_model, const char* src, char* dst) {
  const Shape model = t.ModelShape();
  const int64_t n = 1 + static_cast<int64_t>(t.more_parts.size());
  // The whole is (outer, n, inner) around the stacking axis; a part is one
  // (outer, inner) block of it, in Tessera's orientation.
  int64_t outer = 1, inner = 1;
  const int64_t axis = n > 1 ? t.stack_axis : -1;
  for (int64_t a = 0; a < model.rank(); ++a) {
    if (a < axis) outer *= model[a];
    if (a > axis) inner *= model[a];
  }
  // A transposed part: Tessera's (in, out) element e = (i, o) is Hugging
  // Face's (out, in) element (o, i).
  const int64_t hf_rows = t.transposed ? t.hf_shape[0] : 0, hf_cols = t.transposed ? t.hf_shape[1] : 0;
  for (int64_t e = 0; e < outer * inner; ++e) {
    const int64_t w = (e / inner * n + k) * inner + e % inner;
    const int64_t h = t.transposed ? (e % hf_rows) * hf_cols + e / hf_rows : e;
    if (to_model) {
      std::memcpy(dst + w * element, src + h * element, element);
    } else {
      std::memcpy(dst + h * element, src + w * element, element);
    }
  }
}

// LayerNorm's "gamma" / "beta" (old BERT files) as "weight" / "bias".
std::string CanonicalHfName(const std::string& name) {
  for (const auto& [old_suffix, suffix] : {std::pair{std::string_view("LayerNorm.gamma"), "LayerNorm.weight"},
                                           std::pair{std::string_view("LayerNorm.beta"), "LayerNorm.bias"}}) {
    if (name.ends_with(old_suffix)) return StrCat(name.substr(0, name.size() - old_suffix.size()), suffix);
  }
  return name;
}

// The tensors of a Hugging Face file by the names a layout asks for: the
// same name, one with a leading component more (GPT2LMHeadModel's
// "transformer.") or one less (BertModel's files lack BertForPreTraining's
// "bert."), old LayerNorm names read as the new.
class HfNames {
 public:
  explicit HfNames(const SafetensorsFile& file) {
    for (const auto& [key, entry] : file.tensors()) {
      const std::string name = CanonicalHfName(key);
      exact_.emplace(name, key);
      if (const size_t dot = name.find('.'); dot != std::string::npos) {
        auto [it, added] = less_.emplace(name.substr(dot + 1), key);
        if (!added && it->second != key) it->second.clear();  // ambiguous
      }
    }
  }
  // The file's key for `name`; nullopt when it has none.
  std::optional<std::string> Find(const std::string& name) const {
    if (auto it = exact_.find(name); it != exact_.end()) return it->second;
    if (auto it = less_.find(name); it != less_.end() && !it->second.empty()) return it->second;
    if (const size_t dot = name.find('.'); dot != std::string::npos) {
      if (auto it = exact_.find(name.substr(dot + 1)); it != exact_.end()) return it->second;
    }
    return std::nullopt;
  }

 private:
  std::map<std::string, std::string> exact_;  // canonical name -> key
  std::map<std::string, std::string> less_;   // canonical name less its first component -> key ("": ambiguous)
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CheckpointReader>> CheckpointReader::OpenHuggingFace(
    const fs::path& file, const std::vector<models::Model::HfTensor>& hf_layout) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(StrCat("Hugging Face weights ", file.string(), ": ", parts...));
  };
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> weights, SafetensorsFile::Open(file));
  // A rank file of a Tessera checkpoint holds shards and optimizer state
  // under Tessera's layout: read as Hugging Face's, it would load by
  // accident or fail on a shape.
  if (weights->metadata().contains(std::string(kSlicesKey))) {
    return absl::InvalidArgumentError(StrCat(file.string(),
                                             " is one rank's file of a Tessera checkpoint, not Hugging Face "
                                             "weights: give the checkpoint's directory (",
                                             file.parent_path().string(), ")"));
  }
  std::shared_ptr<CheckpointReader> reader(new CheckpointReader);
  reader->path_ = file;
  reader->dir_ = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  reader->huggingface_ = true;
  reader->config_ = nlohmann::json::object();
  const std::string file_name = file.filename().string();
  if (!hf_layout.empty()) {
    const HfNames names(*weights);
    std::set<std::string> used;
    for (const models::Model::HfTensor& t : hf_layout) {
      std::vector<std::string> parts = {t.hf_name};
      parts.insert(parts.end(), t.more_parts.begin(), t.more_parts.end());
      std::vector<const SafetensorsFile::Entry*> entries;
      for (std::string& part : parts) {
        const std::optional<std::string> key = names.Find(part);
        if (!key) return fail("no tensor '", part, "' (the model's ", t.name, ")");
        part = *key;
        used.insert(part);
        entries.push_back(weights->Find(part));
        if (!ConvertsToF32(entries.back()->dtype)) {
          return fail("'", part, "' is ", DTypeName(entries.back()->dtype), ", not a floating-point type");
        }
        if (t.converted() && entries.back()->shape != t.hf_shape) {
          return fail("'", part, "' is ", entries.back()->shape.ToString(), ", the model's ", t.name, " needs ",
                      t.hf_shape.ToString(), t.transposed ? " (its transpose)" : "");
        }
      }
      for (const std::string& tied : t.tied) {
        const std::optional<std::string> key = names.Find(tied);
        if (!key) continue;
        used.insert(*key);
        const SafetensorsFile::Entry* other = weights->Find(*key);
        if (other->dtype != entries[0]->dtype || other->shape != entries[0]->shape ||
            std::memcmp(other->data, entries[0]->data, other->bytes) != 0) {
          return fail("'", *key, "' is not '", parts[0], "' (Tessera's model ties them: one tensor, ", t.name, ")");
        }
      }
      Entry e;
      e.shards.push_back(Shard{.file = file_name, .source = parts[0], .offset = {}, .shape = entries[0]->shape});
      if (t.converted()) {
        e.meta = TensorMeta{DType::kF32, t.ModelShape()};
        e.converted = static_cast<int>(reader->converted_.size());
        models::Model::HfTensor resolved = t;
        resolved.hf_name = parts[0];
        resolved.more_parts.assign(parts.begin() + 1, parts.end());
        reader->converted_.push_back(std::move(resolved));
      } else {
        e.meta = TensorMeta{entries[0]->dtype, entries[0]->shape};
        e.shards[0].offset.assign(static_cast<size_t>(entries[0]->shape.rank()), 0);
      }
      reader->tensors_[t.name] = std::move(e);
    }
    // What the model leaves unread, but for buffers transformers saves
    // beside the weights (GPT-2's causal masks, BERT's position ids).
    for (const auto& [name, entry] : weights->tensors()) {
      if (used.contains(name) || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
          name.ends_with("position_ids")) {
        continue;
      }
      reader->unused_.push_back(name);
    }
    reader->files_.emplace(file_name, std::move(weights));
    return std::shared_ptr<const CheckpointReader>(std::move(reader));
  }
  for (const auto& [source, entry] : weights->tensors()) {
    std::string name = source;
    if (name.starts_with(kHfPrefix)) name.erase(0, kHfPrefix.size());
    if (reader->tensors_.contains(name)) {
      return fail("holds '", name, "' twice (with and without the \"", kHfPrefix, "\" prefix)");
    }
    Entry e;
    e.meta = TensorMeta{entry.dtype, entry.shape};
    e.shards.push_back(Shard{.file = file_name,
                             .source = source,
                             .offset = std::vector<int64_t>(static_cast<size_t>(entry.shape.rank()), 0),
                             .shape = entry.shape});
    reader->tensors_[name] = std::move(e);
  }
  // Tessera's head is wte: a file with its own lm_head must hold the same.
  if (const SafetensorsFile::Entry* head = weights->Find("lm_head.weight")) {
    const SafetensorsFile::Entry* wte = weights->Find("transformer.wte.weight");
    if (wte == nullptr) wte = weights->Find("wte.weight");
    if (wte == nullptr || wte->dtype != head->dtype || wte->shape != head->shape ||
        std::memcmp(wte->data, head->data, head->bytes) != 0) {
      return fail("lm_head.weight is not wte.weight (Tessera's GPT-2 ties its head to the token embedding)");
    }
  }
  reader->files_.emplace(file_name, std::move(weights));
  return std::shared_ptr<const CheckpointReader>(std::move(reader));
}

absl::StatusOr<std::shared_ptr<const CheckpointReader>> CheckpointReader::Open(
    const fs::path& dir, const std::vector<models::Model::HfTensor>& hf_layout) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    // A checkpoint's index given for the checkpoint: its directory is meant.
    if (dir.filename() == "index.json") {
      return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(),
                                               ": the index of a checkpoint; give its directory, ",
                                               dir.parent_path().string()));
    }
    return OpenHuggingFace(dir, hf_layout);
  }
  if (fs::is_directory(dir, ec) && !fs::exists(dir / "index.json", ec) && fs::is_regular_file(dir / kHfFileName, ec)) {
    return OpenHuggingFace(dir / kHfFileName, hf_layout);
  }
  const fs::path index_path = dir / "index.json";
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(), ": ", parts...));
  };
  const fs::file_status index_status = fs::status(index_path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return fail("cannot read index.json: ", ec.message());
  }
  if (fs::exists(index_status) && !fs::is_regular_file(index_status)) return fail("index.json is not a regular file");
  errno = 0;
  std::ifstream in(index_path, std::ios::binary);
  if (!in && fs::exists(index_status)) {
    return fail("cannot read index.json: ", errno != 0 ? std::strerror(errno) : "it does not open");
  }
  if (!in) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      if (fs::exists(dir, ec)) {
        return absl::InvalidArgumentError(StrCat("checkpoint ", EscapeControlChars(dir.string()),
                                                 ": neither a checkpoint directory nor a regular file of weights"));
      }
      return absl::NotFoundError(StrCat("checkpoint ", EscapeControlChars(dir.string()), ": no such directory"));
    }
    if (auto latest = LatestCheckpoint(dir); latest.ok() && latest->has_value()) {
      return absl::NotFoundError(StrCat("checkpoint ", dir.string(),
                                        ": no index.json: it is an output directory; give one of its checkpoints, "
                                        "e.g. its newest, ",
                                        (*latest)->string()));
    }
    return absl::NotFoundError(StrCat("checkpoint ", dir.string(), ": no index.json (not a complete checkpoint)"));
  }
  in.close();
  // (Read whole, at most kMaxIndexBytes: a 2 GB index took 4 GB of memory.)
  absl::StatusOr<std::string> text = ReadWholeFile(index_path, kMaxIndexBytes);
  if (!text.ok()) return fail("cannot read index.json: ", text.status().message());
  // (The parser ends its input at a NUL byte: whatever followed one, a
  // damaged tail, was taken for nothing.)
  if (text->find('\0') != std::string::npos) return fail("index.json holds a NUL byte (damaged)");
  const nlohmann::json index = nlohmann::json::parse(*text, nullptr, false);
  if (index.is_discarded()) {
    return fail("index.json is not valid JSON (", text->empty() ? "empty" : "cut short or damaged", ")");
  }
  if (!index.is_object()) return fail("index.json is not a JSON object");
  if (index.value("format", "") != kFormat || !index.contains("version") || index["version"] != kVersion) {
    return fail("index.json is not a ", kFormat, " version ", kVersion, " index");
  }
  if (!index.contains("iteration")) return fail("index.json has no iteration");
  const nlohmann::json& iteration = index["iteration"];
  const bool in_range = iteration.is_number_unsigned() ? iteration.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                                       : iteration.is_number_integer() && iteration.get<int64_t>() >= 0;
  if (!in_range) {
    return fail("index.json's iteration ", iteration.dump().substr(0, 40), " is not an integer in [0, 2^63)");
  }
  if (!index.contains("tensors") || !index["tensors"].is_object()) return fail("index.json has no tensors");
  std::shared_ptr<CheckpointReader> reader(new CheckpointReader);
  if (index.contains("checksums")) {
    if (index["checksums"] != kChecksumAlgorithm) {
      return fail("index.json's checksums ", index["checksums"].dump().substr(0, 40), " is not ", kChecksumAlgorithm);
    }
    reader->checksums_ = true;
  }
  reader->path_ = dir;
  reader->dir_ = dir;
  reader->iteration_ = index["iteration"].get<int64_t>();
  // A checkpoint's directory is named after its iteration: an index.json of
  // another checkpoint copied in would start the run at its iteration with
  // this one's weights.
  std::string dir_name = fs::path(dir).lexically_normal().filename().string();
  if (dir_name.empty()) dir_name = fs::path(dir).lexically_normal().parent_path().filename().string();
  if (const std::optional<int64_t> named = IterationOfName(dir_name); named && *named != reader->iteration_) {
    return fail("index.json is iteration ", reader->iteration_, "'s, the directory ", dir_name,
                "'s name another's (files of two checkpoints mixed?)");
  }
  const nlohmann::json state = index.value("train_state", nlohmann::json::object());
  if (!state.is_object() || !state.contains("consumed_samples")) {
    return fail("index.json has no train_state.consumed_samples");
  }
  if (!state["consumed_samples"].is_number_integer() || state["consumed_samples"].get<int64_t>() < 0) {
    return fail("index.json's train_state.consumed_samples ", state["consumed_samples"].dump().substr(0, 40),
                " is not a non-negative integer");
  }
  reader->consumed_samples_ = state["consumed_samples"].get<int64_t>();
  // (Every iteration takes the same global batch, of at least one sample.)
  if (reader->iteration_ > 0
          ? reader->consumed_samples_ % reader->iteration_ != 0 || reader->consumed_samples_ < reader->iteration_
          : reader->consumed_samples_ != 0) {
    return fail("index.json's train_state is inconsistent: ", reader->consumed_samples_, " samples in ",
                reader->iteration_, " iterations");
  }
  if (state.contains("iteration") && state["iteration"] != index["iteration"]) {
    return fail("index.json's train_state is inconsistent: iteration ", state["iteration"].dump().substr(0, 40),
                " beside iteration ", reader->iteration_);
  }
  reader->best_ = state.value("best", nlohmann::json());
  // (A resume with save_best compares its evaluations with it: one it
  // cannot read was taken for none, and the best checkpoint replaced.)
  if (const nlohmann::json& best = reader->best_; !best.is_null()) {
    if (!best.is_object() || !best.contains("metric") || !best["metric"].is_string() || !best.contains("mode") ||
        (best["mode"] != "min" && best["mode"] != "max") || !best.contains("value") || !best["value"].is_number()) {
      return fail("index.json's train_state.best ",
                  best.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80),
                  " is not {\"metric\": NAME, \"mode\": \"min\" or \"max\", \"value\": NUMBER}");
    }
  }
  if (state.contains("evaluation_pending") && !state["evaluation_pending"].is_boolean()) {
    return fail("index.json's train_state.evaluation_pending ", state["evaluation_pending"].dump().substr(0, 40),
                " is not true or false");
  }
  reader->evaluation_pending_ = state.contains("evaluation_pending") && state["evaluation_pending"] == true;
  reader->config_ = index.value("config", nlohmann::json::object());
  int64_t shards = 0, bound_shards = 0;  // (all of them, or none: an older index)
  std::optional<std::set<std::string>> files_present;  // the checkpoint's files, listed once
  for (const auto& [name, value] : index["tensors"].items()) {
    if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() || !value.contains("shards") ||
        !value["shards"].is_array()) {
      return fail("index.json: tensor '", name, "' needs dtype, shape and shards");
    }
    Entry entry;
    std::set<std::string> entry_files;
    auto dtype = SafetensorsDTypeFromName(value["dtype"].get<std::string>());
    if (!dtype.ok()) return fail("index.json: tensor '", name, "': ", dtype.status().message());
    entry.meta.dtype = *dtype;
    auto shape = IntList(value.value("shape", nlohmann::json()), "shape");
    if (!shape.ok()) return fail("index.json: tensor '", name, "': ", shape.status().message());
    entry.meta.shape = Shape(*shape);
    // (Every reader multiplies the extents: export, generate, a resume.)
    if (absl::StatusOr<int64_t> bytes = CheckedByteSize(entry.meta); !bytes.ok()) {
      return fail("index.json: tensor '", name, "': ", bytes.status().message());
    }
    for (const auto& shard : value["shards"]) {
      if (!shard.is_object() || !shard.contains("file") || !shard["file"].is_string()) {
        return fail("index.json: tensor '", name, "': a shard without a file");
      }
      Shard s;
      s.file = shard["file"].get<std::string>();
      s.source = name;
      // Only plain file names inside the checkpoint: an index must not reach
      // elsewhere on the disk.
      if (s.file.empty() || s.file.find('/') != std::string::npos || s.file == "." || s.file == "..") {
        return fail("index.json: tensor '", name, "': shard file '", s.file, "' is not a file name in the checkpoint");
      }
      auto offset = IntList(shard.value("offset", nlohmann::json()), "a shard's offset");
      auto extent = IntList(shard.value("shape", nlohmann::json()), "a shard's shape");
      // (What is wrong with the list named: [-1, 0] was told to list 2 sizes.)
      if (!offset.ok()) return fail("index.json: tensor '", name, "': ", offset.status().message());
      if (!extent.ok()) return fail("index.json: tensor '", name, "': ", extent.status().message());
      if (offset->size() != shape->size() || extent->size() != shape->size()) {
        return fail("index.json: tensor '", name, "': a shard's offset and shape must each list ", shape->size(),
                    " sizes (the tensor's rank)");
      }
      for (size_t a = 0; a < shape->size(); ++a) {
        if ((*offset)[a] > (*shape)[a] || (*extent)[a] > (*shape)[a] - (*offset)[a]) {
          return fail("index.json: tensor '", name, "': a shard lies outside the tensor");
        }
      }
      // A rank file holds one slice of a tensor (its slices are keyed by
      // tensor name), and the index names only files of the checkpoint:
      // so a tensor has at most as many shards as the checkpoint has rank
      // files (200,000 shards of one file took the overlap check below
      // minutes).
      if (!entry_files.insert(s.file).second) {
        return fail("index.json: tensor '", name, "': two shards in ", s.file);
      }
      if (!files_present.has_value()) {
        files_present.emplace();
        std::error_code listed;
        for (const auto& file : fs::directory_iterator(dir, listed)) {
          files_present->insert(file.path().filename().string());
        }
        if (listed) return fail("cannot list the checkpoint: ", listed.message());
      }
      if (!files_present->contains(s.file)) {
        return fail("index.json: tensor '", name, "': its shard file ", s.file,
                    " is not in the checkpoint (a rank file is missing)");
      }
      s.offset = *offset;
      s.shape = Shape(*extent);
      if (shard.contains("checksum")) {
        if (!shard["checksum"].is_string())
          return fail("index.json: tensor '", name, "': a shard's checksum is no string");
        // (Under an index of the algorithm's: an older one lists none.)
        if (reader->checksums_) {
          reader->committed_checksums_[s.file].emplace_back(s.source, shard["checksum"].get<std::string>());
        }
        ++bound_shards;
      }
      ++shards;
      for (const Shard& other : entry.shards) {
        if (Overlaps(s.offset, s.shape, other.offset, other.shape)) {
          return fail("index.json: tensor '", name, "': two of its shards overlap (", other.file, " and ", s.file, ")");
        }
      }
      reader->file_slices_[s.file].push_back({name, s.offset, *shape});
      entry.shards.push_back(std::move(s));
    }
    // The shards tile the tensor (none overlaps another, so their elements
    // add up to its own only if they leave no gap), as each commit checked:
    // a whole-tensor read (export, generate) would otherwise take one
    // shard's values twice and leave zeros.
    int64_t covered = 0;
    for (const Shard& shard : entry.shards) covered += shard.shape.NumElements();
    if (covered != entry.meta.shape.NumElements()) {
      return fail("index.json: tensor '", name, "': its shards cover ", covered, " of its ",
                  entry.meta.shape.NumElements(), " elements");
    }
    reader->tensors_[name] = std::move(entry);
  }
  if (bound_shards > 0 && bound_shards < shards) {
    return fail("index.json lists the checksums of ", bound_shards, " of its ", shards, " shards");
  }
  return std::shared_ptr<const CheckpointReader>(std::move(reader));
}

std::vector<std::string> CheckpointReader::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

absl::Status CheckCheckpointHoldsNothingMore(const proto::Plan& plan, const CheckpointReader& reader,
                                             bool weights_only) {
  if (reader.huggingface()) {
    if (reader.unused_tensors().empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(StrCat("Hugging Face weights ", reader.dir().string(), " hold ",
                                             reader.unused_tensors().size(), " tensors this model does not read ('",
                                             reader.unused_tensors()[0],
                                             "' ...): the model config is smaller than the weights' (e.g. fewer "
                                             "layers)"));
  }
  ASSIGN_OR_RETURN(const std::vector<KeptTaskInfo> tasks, KeptTasks(plan));
  std::set<std::string> kept, variables;
  for (const KeptTaskInfo& info : tasks) {
    for (size_t k = 0; k < info.tensors.size(); ++k) {
      kept.insert(info.tensors[k].name);
      if (k == 0) variables.insert(info.tensors[k].name);
    }
  }
  for (const std::string& name : reader.TensorNames()) {
    // Mixed precision's bookkeeping is no model state (a resume may turn
    // fp16 off, BindCheckpointInitializers starts it afresh when missing).
    if (kept.contains(name) || name.starts_with("amp.")) continue;
    // A momentum buffer of a kept variable, where this run keeps none (SGD
    // at momentum 0, or another optimizer): unused, as torch's load of an
    // SGD state leaves one (checkpoints of momentum 0 held them before it
    // kept none).
    if (name.ends_with(".momentum") && variables.contains(name.substr(0, name.size() - 9))) continue;
    if (weights_only) {
      const size_t dot = name.rfind('.');
      if (dot != std::string::npos && variables.contains(name.substr(0, dot))) continue;
    }
    return absl::InvalidArgumentError(
        StrCat("checkpoint ", reader.dir().string(), " holds '", name, "', which this model does not have (",
               weights_only ? "" : "or not as this run's optimizer state: ",
               "the model config differs from the checkpoint's, e.g. fewer layers; its config is in its index.json)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorMeta> CheckpointReader::Meta(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return absl::NotFoundError(StrCat("checkpoint ", path_.string(), " has no tensor '", name, "'"));
  return it->second.meta;
}

absl::Status CheckpointReader::CheckMeta(const std::string& name, const TensorMeta& model) const {
  ASSIGN_OR_RETURN(const TensorMeta meta, Meta(name));
  if (meta == model) return absl::OkStatus();
  if (huggingface_ && model.dtype == DType::kF32 && ConvertsToF32(meta.dtype) && MergesTo(model.shape, meta.shape)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(StrCat("checkpoint ", path_.string(), ": tensor '", name, "' is ",
                                           meta.ToString(), ", the model's is ", model.ToString()));
}

absl::StatusOr<const SafetensorsFile*> CheckpointReader::File(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(name);
    if (it != files_.end()) return it->second.get();
  }
  // Opened and checked outside the lock, so that the devices' threads check
  // different rank files at once; a file two threads open together is kept
  // once.
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir_ / name));
  // An index from before the checksums, with rank files that have them
  // (or an index whose field was lost): the files' own are still checked.
  if (checksums_ || file->metadata().contains(kChecksumsKey)) RETURN_IF_ERROR(VerifyChecksums(*file));
  RETURN_IF_ERROR(CheckFileMatchesIndex(name, *file));
  if (!huggingface_) RETURN_IF_ERROR(CheckFileSlices(name, *file));
  std::lock_guard<std::mutex> lock(mu_);
  return files_.try_emplace(name, std::move(file)).first->second.get();
}

absl::Status CheckpointReader::CheckFileMatchesIndex(const std::string& name, const SafetensorsFile& file) const {
  auto committed = committed_checksums_.find(name);
  if (committed == committed_checksums_.end()) return absl::OkStatus();
  auto text = file.metadata().find(kChecksumsKey);
  nlohmann::json checksums =
      text == file.metadata().end() ? nlohmann::json() : nlohmann::json::parse(text->second, nullptr, false);
  if (!checksums.is_object()) checksums = nlohmann::json::object();
  for (const auto& [tensor, checksum] : committed->second) {
    auto it = checksums.find(tensor);
    if (it == checksums.end() || *it != checksum) {
      return absl::DataLossError(StrCat("checkpoint ", path_.string(), ": ", name,
                                        " is not the rank file its index.json was written with ('", tensor,
                                        "' differs): files of two checkpoints mixed?"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckFileSlices(const std::string& name, const SafetensorsFile& file) const {
  auto listed = file_slices_.find(name);
  if (listed == file_slices_.end()) return absl::OkStatus();
  const auto fail = [&](auto&&... parts) {
    return absl::DataLossError(StrCat("checkpoint ", path_.string(), ": ", name, ": ", parts...));
  };
  auto text = file.metadata().find(kSlicesKey);
  if (text == file.metadata().end()) return fail("no ", kSlicesKey, " (the file is damaged)");
  const nlohmann::json slices = nlohmann::json::parse(text->second, nullptr, false);
  if (!slices.is_object()) return fail(kSlicesKey, " is not a JSON object (the file is damaged)");
  for (const FileSlice& expected : listed->second) {
    auto it = slices.find(expected.tensor);
    const bool same = it != slices.end() && it->is_object() &&
                      it->value("offset", nlohmann::json()) == expected.offset &&
                      it->value("logical_shape", nlohmann::json()) == expected.logical;
    if (!same) {
      return fail("its shard of '", expected.tensor, "' is not where index.json puts it (offset ",
                  nlohmann::json(expected.offset).dump(), " of ", nlohmann::json(expected.logical).dump(),
                  "; the file says ", it == slices.end() ? std::string("nothing") : it->dump().substr(0, 80),
                  "): index.json edited or damaged?");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::VerifyChecksums(const SafetensorsFile& file) const {
  const auto fail = [&](auto&&... parts) {
    return absl::DataLossError(StrCat("checkpoint ", path_.string(), ": ", file.path().filename().string(), ": ",
                                      parts..., " (the file is damaged)"));
  };
  auto text = file.metadata().find(kChecksumsKey);
  if (text == file.metadata().end()) return fail("no ", kChecksumsKey, " though index.json lists checksums");
  const nlohmann::json checksums = nlohmann::json::parse(text->second, nullptr, false);
  if (!checksums.is_object()) return fail(kChecksumsKey, " is not a JSON object");
  for (const auto& [name, entry] : file.tensors()) {
    auto it = checksums.find(name);
    if (it == checksums.end() || !it->is_string()) return fail("no checksum for '", name, "'");
    if (it->get<std::string>() != Checksum({entry.data, entry.bytes})) {
      return fail("the data of '", name, "' does not match its checksum");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Read(const std::string& name, const TensorSlice& slice, const Tensor& out) const {
  RETURN_IF_ERROR(CheckMeta(name, TensorMeta{out.dtype(), slice.logical}));
  if (out.shape() != slice.local) {
    return absl::InternalError(StrCat("checkpoint: '", name, "': the target is ", out.shape().ToString(),
                                      ", its slice ", slice.local.ToString()));
  }
  const Entry& stored = tensors_.at(name);
  const size_t element = DTypeSize(out.dtype());
  int64_t copied = 0;
  for (const Shard& shard : stored.shards) {
    // A rank file none of whose shards this slice needs is neither mapped
    // nor checked here (a tensor-parallel rank reads its own half).
    if (!huggingface_ && !Overlaps(shard.offset, shard.shape, slice.offset, slice.local)) continue;
    ASSIGN_OR_RETURN(const SafetensorsFile* file, File(shard.file));
    const SafetensorsFile::Entry* entry = file->Find(shard.source);
    if (entry == nullptr || entry->dtype != stored.meta.dtype || entry->shape != shard.shape) {
      return absl::InvalidArgumentError(StrCat("checkpoint ", path_.string(), ": ", shard.file,
                                               " does not hold the shard of '", name, "' that index.json lists"));
    }
    if (!huggingface_) {
      copied += CopyOverlap(entry->data, shard.offset, shard.shape.dims(), static_cast<char*>(out.raw_data()),
                            slice.offset, slice.local.dims(), element);
      continue;
    }
    if (stored.converted >= 0) {
      std::vector<float> whole;
      RETURN_IF_ERROR(ReadConverted(converted_[static_cast<size_t>(stored.converted)], shard.file, whole));
      copied += CopyOverlap(reinterpret_cast<const char*>(whole.data()),
                            std::vector<int64_t>(static_cast<size_t>(slice.logical.rank()), 0), slice.logical.dims(),
                            static_cast<char*>(out.raw_data()), slice.offset, slice.local.dims(), element);
      continue;
    }
    // Hugging Face weights: one whole tensor, in the model's shape (the same
    // row-major bytes), converted to the model's dtype.
    std::vector<float> converted;
    const char* data = entry->data;
    if (entry->dtype != out.dtype()) {
      converted = ToF32(entry->data, entry->dtype, static_cast<size_t>(entry->shape.NumElements()));
      data = reinterpret_cast<const char*>(converted.data());
    }
    copied += CopyOverlap(data, std::vector<int64_t>(static_cast<size_t>(slice.logical.rank()), 0),
                          slice.logical.dims(), static_cast<char*>(out.raw_data()), slice.offset, slice.local.dims(),
                          element);
  }
  if (copied != out.NumElements()) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", path_.string(), ": the shards of '", name, "' cover ",
                                             copied, " of the ", out.NumElements(), " elements asked for"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadConverted(const models::Model::HfTensor& t, const std::string& file,
                                             std::vector<float>& out) const {
  ASSIGN_OR_RETURN(const SafetensorsFile* weights, File(file));
  out.assign(static_cast<size_t>(t.ModelShape().NumElements()), 0.0f);
  std::vector<std::string> parts = {t.hf_name};
  parts.insert(parts.end(), t.more_parts.begin(), t.more_parts.end());
  for (size_t k = 0; k < parts.size(); ++k) {
    const SafetensorsFile::Entry* entry = weights->Find(parts[k]);
    if (entry == nullptr || entry->shape != t.hf_shape) {
      return absl::InternalError(StrCat("Hugging Face weights ", path_.string(), ": '", parts[k], "' changed"));
    }
    const std::vector<float> part = ToF32(entry->data, entry->dtype, static_cast<size_t>(entry->shape.NumElements()));
    MovePart(t, static_cast<int64_t>(k), sizeof(float), /*to_model=*/true, reinterpret_cast<const char*>(part.data()),
             reinterpret_cast<char*>(out.data()));
  }
  return absl::OkStatus();
}

absl::Status BindCheckpointInitializers(const proto::Plan& plan, std::shared_ptr<const CheckpointReader> reader,
                                        bool weights_only, const ops::OpRegistry& registry,
                                        actors::HostCallbacks& callbacks) {
  ASSIGN_OR_RETURN(std::vector<KeptTaskInfo> tasks, KeptTasks(plan));
  const std::vector<std::string> names = reader->TensorNames();
  const bool holds_momentum =
      std::any_of(names.begin(), names.end(), [](const std::string& name) { return name.ends_with(".momentum"); });
  for (KeptTaskInfo& info : tasks) {
    // Mixed precision's bookkeeping (the fp16 loss scale and its counts) is
    // no model state: loading weights, or a checkpoint of a run without it,
    // starts it afresh from its init rules (as torch's GradScaler without its
    // state dict).
    if (!info.tensors.empty() && info.tensors[0].name.starts_with("amp.") &&
        (weights_only || absl::IsNotFound(reader->Meta(info.tensors[0].name).status()))) {
      continue;
    }
    // The momentum buffers of a checkpoint that holds none (SGD at
    // momentum 0 keeps none) start at zero from their init rule, as
    // torch.optim.SGD starts a missing one (its first step makes it the
    // gradient). One missing from a checkpoint that holds others is an
    // error, as any missing tensor.
    std::vector<bool> fresh(info.tensors.size(), false);
    bool any_fresh = false;
    for (size_t k = 1; k < info.tensors.size() && !weights_only && !holds_momentum; ++k) {
      fresh[k] =
          info.tensors[k].name.ends_with(".momentum") && absl::IsNotFound(reader->Meta(info.tensors[k].name).status());
      any_fresh |= fresh[k];
    }
    // Checked here, before anything runs: every tensor exists with the
    // model's shape and dtype.
    for (size_t k = 0; k < info.tensors.size(); ++k) {
      if (weights_only && k > 0) break;
      if (fresh[k]) continue;
      const KeptTensorInfo& t = info.tensors[k];
      RETURN_IF_ERROR(reader->CheckMeta(t.name, TensorMeta{t.local.dtype, t.slice.logical}));
    }
    const proto::Task task = *info.task;
    callbacks.initializers[task.callback()] = [reader, info = std::move(info), task, weights_only, any_fresh,
                                               fresh = std::move(fresh),
                                               &registry](const std::vector<Tensor>& tensors) -> absl::Status {
      if (weights_only || any_fresh) RETURN_IF_ERROR(actors::RunInitRules(task, registry, tensors));
      for (size_t k = 0; k < tensors.size() && k < info.tensors.size(); ++k) {
        if (weights_only && k > 0) break;
        if (fresh[k]) continue;
        // (Its message names the file and the tensor; a rank file is
        // checked whole by the first actor that opens it, whichever.)
        RETURN_IF_ERROR(SelfDescribed(reader->Read(info.tensors[k].name, info.tensors[k].slice, tensors[k])));
      }
      return absl::OkStatus();
    };
  }
  return absl::OkStatus();
}

absl::Status ExportSafetensors(const CheckpointReader& reader, const std::vector<models::Model::HfTensor>& tensors,
                               const fs::path& path) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(tensors.size());
  for (const models::Model::HfTensor& t : tensors) {
    ASSIGN_OR_RETURN(const TensorMeta meta, reader.Meta(t.name));
    if (t.converted()) {
      if (meta.shape != t.ModelShape()) {
        return absl::FailedPreconditionError(StrCat("export: '", t.name, "' is ", meta.shape.ToString(),
                                                    " in the checkpoint, but the model of its index.json's config "
                                                    "makes it ",
                                                    t.ModelShape().ToString()));
      }
      ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty(meta.shape, meta.dtype));
      RETURN_IF_ERROR(reader.Read(t.name, TensorSlice::Whole(meta.shape), whole));
      std::vector<std::string> parts = {t.hf_name};
      parts.insert(parts.end(), t.more_parts.begin(), t.more_parts.end());
      for (size_t k = 0; k < parts.size(); ++k) {
        ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(t.hf_shape, meta.dtype));
        MovePart(t, static_cast<int64_t>(k), DTypeSize(meta.dtype), /*to_model=*/false,
                 static_cast<const char*>(whole.raw_data()), static_cast<char*>(part.raw_data()));
        out.emplace_back(parts[k], std::move(part));
      }
      continue;
    }
    // Hugging Face's dimensions are runs of the checkpoint's merged (the
    // fused attention's (C, 3, C) is (C, 3C) there), 1s aside: another
    // shape of the same size (an index.json whose config was edited) was
    // reshaped silently.
    const auto merges_into = [](const Shape& ours, const Shape& theirs) {
      std::vector<int64_t> from, to;
      for (const int64_t d : ours.dims()) {
        if (d != 1) from.push_back(d);
      }
      for (const int64_t d : theirs.dims()) {
        if (d != 1) to.push_back(d);
      }
      size_t i = 0;
      for (const int64_t want : to) {
        int64_t product = 1;
        while (i < from.size() && product < want && want % (product * from[i]) == 0) product *= from[i++];
        if (product != want) return false;
      }
      return i == from.size();
    };
    if (!merges_into(meta.shape, t.hf_shape)) {
      return absl::FailedPreconditionError(StrCat("export: '", t.name, "' is ", meta.shape.ToString(),
                                                  " in the checkpoint, but the model of its index.json's config makes "
                                                  "it ",
                                                  t.hf_shape.ToString()));
    }
    ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty(meta.shape, meta.dtype));
    RETURN_IF_ERROR(reader.Read(t.name, TensorSlice::Whole(meta.shape), whole));
    ASSIGN_OR_RETURN(Tensor shaped, whole.Reshape(t.hf_shape));
    out.emplace_back(t.hf_name, std::move(shaped));
  }
  return WriteSafetensors(path, out, {{"format", "pt"}});
}

}  // namespace tessera
