#pragma once
// Checkpoints (DESIGN §11): sharded safetensors, one file per global rank,
// plus a JSON index of global shapes, dtypes and shard slices.
//
//   <output_dir>/checkpoints/iter_0000100/index.json
//                                        /rank_00000.safetensors ...
//
// What is saved: every tensor a Parameter task keeps (proto::KeptTensor: the
// variables and their optimizer state, by their graph names, e.g.
// "h.0.mlp.c_fc.weight" and "h.0.mlp.c_fc.weight.adam_m"), each slice once
// (data-parallel replicas skip it), and the training state: the iteration
// reached (iterations trained = the next one to run). The data position, the
// learning-rate step and every random stream (dropout, data order) are
// functions of the iteration (DESIGN §4), so the iteration is all a resume
// needs to continue bit-exactly.
//
// Writing is crash-safe: each node writes its ranks' files durably into a
// temporary directory beside the final one (".iter_0000100.tmp-<tag>"); one
// committer then reads the files' headers, checks that the shards tile every
// tensor exactly, writes index.json and renames the directory. A directory
// named iter_* is therefore always complete, and a kill -9 at any moment
// leaves the previous checkpoint as it was.
//
// Loading reshards: a Parameter task asks for its slice of each tensor and
// gets it assembled from whichever shards overlap it, whatever layout (data,
// tensor or pipeline parallel, world size) wrote them.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "actors/actor.h"
#include "comm/proto/plan.pb.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"
#include "ops/registry.h"
#include "train/safetensors.h"

namespace tessera {

// output_dir/checkpoints, and the checkpoint of `iteration` in it.
std::filesystem::path CheckpointsDir(const std::filesystem::path& output_dir);
std::filesystem::path CheckpointPath(const std::filesystem::path& output_dir, int64_t iteration);
// Where a checkpoint is written before its commit; `tag` tells runs apart.
std::filesystem::path CheckpointTempPath(const std::filesystem::path& output_dir, int64_t iteration,
                                         const std::string& tag);

// The values a plan's Parameter tasks hold, by task callback: the variable's
// tensor, then each state tensor (HostCallbacks::InitFn's order).
using KeptValues = std::map<std::string, std::vector<Tensor>>;

// Keeps the trained values of a plan's Parameter tasks between runs of it
// (the segments of one job): Bind registers finalizers that copy the values
// out at the end of a run, and initializers that copy them back in at the
// start of the next for every task it holds values of. Thread-safe
// (finalizers run on actor threads).
class KeptStore {
 public:
  void Bind(const proto::Plan& plan, actors::HostCallbacks& callbacks);
  // For another plan over the same variables (evaluation): initializers
  // that copy only the variables in. Each of `plan`'s kept tasks must match
  // a task the store was bound to by callback, variable name and slice (an
  // error names the first that does not).
  [[nodiscard]] absl::Status BindVariables(const proto::Plan& plan, actors::HostCallbacks& callbacks) const;
  bool empty() const;
  // A copy of the map (the tensors share storage with the store's).
  KeptValues values() const;

 private:
  mutable std::mutex mu_;
  KeptValues values_ ABSL_GUARDED_BY(mu_);
  // callback -> the variable's "name@slice" in the plans bound.
  std::map<std::string, std::string> variables_ ABSL_GUARDED_BY(mu_);
};

// Writes this plan's shards (the kept tensors whose `write` is set) from
// `values` into `dir` (created if missing), one file per global rank that
// holds any, each durably. Missing values (a task that never ran) are an
// error naming the task.
[[nodiscard]] absl::Status WriteCheckpointShards(const std::filesystem::path& dir, const proto::Plan& plan,
                                                 const KeptValues& values);

// What index.json records beside the tensors.
struct CheckpointState {
  int64_t iteration = 0;     // iterations trained: the next one to run
  int64_t global_batch = 0;  // samples per iteration (consumed_samples = iteration × global_batch)
  nlohmann::json config;     // the run's resolved config
};

// Reads every rank file's header in `temp_dir`, checks that the shards of
// each tensor tile it exactly, writes index.json and renames `temp_dir` to
// `final_dir` (replacing an older checkpoint of the same iteration), durably.
[[nodiscard]] absl::Status CommitCheckpoint(const std::filesystem::path& temp_dir,
                                            const std::filesystem::path& final_dir, const CheckpointState& state);

// The complete checkpoint of the highest iteration in output_dir/checkpoints,
// nullopt when there is none.
[[nodiscard]] absl::StatusOr<std::optional<std::filesystem::path>> LatestCheckpoint(
    const std::filesystem::path& output_dir);

// Keeps the `keep` checkpoints of the highest iterations and removes older
// ones and temporary directories of other runs (tag != `tag`).
[[nodiscard]] absl::Status PruneCheckpoints(const std::filesystem::path& output_dir, int64_t keep,
                                            const std::string& tag);

// A committed checkpoint, opened for reading: index.json parsed and checked;
// rank files opened (and checked) when first read. Thread-safe.
class CheckpointReader {
 public:
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const CheckpointReader>> Open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  int64_t iteration() const { return iteration_; }
  const nlohmann::json& config() const { return config_; }
  bool Has(const std::string& name) const { return tensors_.contains(name); }
  // The logical shape and dtype of a tensor; NotFound naming the checkpoint.
  [[nodiscard]] absl::StatusOr<TensorMeta> Meta(const std::string& name) const;
  // Fills `out` (the local tensor at `slice` of `name`) from every shard
  // that overlaps it. The logical shape and dtype must match the
  // checkpoint's (an error names the tensor and both shapes).
  [[nodiscard]] absl::Status Read(const std::string& name, const TensorSlice& slice, const Tensor& out) const;

 private:
  struct Shard {
    std::string file;
    std::vector<int64_t> offset;
    Shape shape;
  };
  struct Entry {
    TensorMeta meta;
    std::vector<Shard> shards;
  };
  CheckpointReader() = default;
  absl::StatusOr<const SafetensorsFile*> File(const std::string& name) const;

  std::filesystem::path dir_;
  int64_t iteration_ = 0;
  nlohmann::json config_;
  std::map<std::string, Entry> tensors_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_ ABSL_GUARDED_BY(mu_);
};

// Registers an initializer for every Parameter task of `plan` that keeps
// tensors: it fills them from `reader`, resharded to the task's slices. With
// `weights_only` the optimizer states come from the plan's init rules and
// only the variables load. A tensor the checkpoint lacks, or holds with
// another shape or dtype, fails the run naming it.
[[nodiscard]] absl::Status BindCheckpointInitializers(const proto::Plan& plan,
                                                      std::shared_ptr<const CheckpointReader> reader, bool weights_only,
                                                      const ops::OpRegistry& registry,
                                                      actors::HostCallbacks& callbacks);

}  // namespace tessera
