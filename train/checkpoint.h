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
// Each rank file records every tensor's checksum (core/checksum.h) in its
// metadata, and index.json names the algorithm; a reader checks a file's
// checksums when it first opens it, so a flipped bit on disk is an error
// naming the file and the tensor, never silently different weights.
// Checkpoints written before the checksums (no "checksums" in index.json)
// load unchecked.
//
// Loading reshards: a Parameter task asks for its slice of each tensor and
// gets it assembled from whichever shards overlap it, whatever layout (data,
// tensor or pipeline parallel, world size) wrote them.
//
// Hugging Face weights load the same way (train.load_weight, `tessera
// generate --config`): a single safetensors file as Hugging Face writes it
// (GPT-2's model.safetensors), read as a checkpoint of iteration 0 whose
// tensors keep their file names with a leading "transformer." dropped
// (GPT2LMHeadModel's prefix; Tessera's GPT-2 uses GPT2Model's names). Its
// tensors fill model tensors of the same element count whose shape merges to
// the file's by joining trailing axes: Hugging Face's GPT-2 stores every
// projection as a Conv1D weight (in, out), Tessera's layout too, and only
// c_attn differs, (C, 3C) for Tessera's (C, 3, C) (same bytes). f16, bf16 and
// f64 weights are converted to the model's f32. A file with "lm_head.weight"
// must hold wte.weight's values there (Tessera ties the head to wte).
// ExportSafetensors (below) writes the model back in that layout.

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
#include "core/file_util.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "ops/registry.h"
#include "train/safetensors.h"

namespace tessera {

// output_dir/checkpoints, and the checkpoint of `iteration` in it.
std::filesystem::path CheckpointsDir(const std::filesystem::path& output_dir);
std::filesystem::path CheckpointPath(const std::filesystem::path& output_dir, int64_t iteration);
// The claim each node of a job holds on output_dir/checkpoints while the
// job runs (shared: the job's nodes hold it together), made when missing
// and removed again if left empty. A worker that lost its master is still
// writing there until it notices: a new run on the same output_dir checks
// CheckNoCheckpointWriters first, so neither removes the other's temporary
// checkpoints nor prunes what the other resumes from.
absl::StatusOr<DirectoryClaim> ClaimCheckpointsDir(const std::filesystem::path& output_dir);
// FailedPrecondition when a node of another run holds output_dir/checkpoints.
absl::Status CheckNoCheckpointWriters(const std::filesystem::path& output_dir);
// output_dir/checkpoints/best: the best evaluation's weights
// (train.checkpointer.save_best); never pruned, not a resume's.
std::filesystem::path BestCheckpointPath(const std::filesystem::path& output_dir);
// Where a checkpoint is written before its commit; `tag` tells runs apart.
std::filesystem::path CheckpointTempPath(const std::filesystem::path& output_dir, int64_t iteration,
                                         const std::string& tag);

// The values a plan's Parameter tasks hold, by task callback: the variable's
// tensor, then each state tensor (HostCallbacks::InitFn's order).
using KeptValues = std::map<std::string, std::vector<Tensor>>;

// Keeps the trained values of a plan's Parameter tasks between runs of it
// (the segments of one job): Bind registers finalizers that take the run's
// tensors at its end, and initializers that copy them into the next run's
// at its start and then hold that run's instead (so the earlier copy goes:
// no run holds the parameters and their state twice; after a run that
// failed, the store holds what it had trained when it failed). Thread-safe
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
  // The best checkpoint's evaluation, {"metric", "mode", "value"}, written
  // as train_state.best; null for other checkpoints.
  nlohmann::json best;
  // The evaluation due at `iteration` was stopped (a Ctrl-C during it): a
  // resume runs it first (train_state.evaluation_pending).
  bool evaluation_pending = false;
};

// Reads every rank file's header in `temp_dir`, checks that the shards of
// each tensor tile it exactly, writes index.json and renames `temp_dir` to
// `final_dir` (replacing an older checkpoint of the same iteration), durably.
[[nodiscard]] absl::Status CommitCheckpoint(const std::filesystem::path& temp_dir,
                                            const std::filesystem::path& final_dir, const CheckpointState& state);

// Links the rank files of the committed checkpoint `checkpoint` (those its
// index.json names) into `temp_dir` (created), copying durably where the
// file system has no hard links, for CommitCheckpoint to commit them under
// another name with another state: the best checkpoint of an evaluation
// that a resume redid on a checkpoint's weights. The files are never
// written in place, so the two checkpoints may share them.
[[nodiscard]] absl::Status LinkCheckpointShards(const std::filesystem::path& checkpoint,
                                                const std::filesystem::path& temp_dir);

// Rewrites the committed checkpoint's index.json without
// train_state.evaluation_pending, durably (a resume has run that
// evaluation: another resume runs it no more).
[[nodiscard]] absl::Status ClearEvaluationPending(const std::filesystem::path& checkpoint);

// The checkpoint of the highest iteration in output_dir/checkpoints, nullopt
// when there is none; an error when that newest iter_* is not a complete
// checkpoint (a directory with index.json), which only damage leaves.
[[nodiscard]] absl::StatusOr<std::optional<std::filesystem::path>> LatestCheckpoint(
    const std::filesystem::path& output_dir);

// `path` itself when it is a checkpoint (index.json) or Hugging Face weights,
// else the latest checkpoint of the output directory `path`; NotFound
// naming the path when it is neither.
[[nodiscard]] absl::StatusOr<std::filesystem::path> ResolveCheckpoint(const std::filesystem::path& path);

// Removes every checkpoint's temporary directory (".iter_N.tmp-<tag>") in
// output_dir/checkpoints: what runs that died while writing left; and puts
// back a checkpoint a replacement interrupted between its two renames left
// aside (".NAME.old-<temporary>", NAME missing; file systems without
// renameat2's swap). Called by
// a job's committing node before its first iteration, when no writer of
// this job has started (every later write follows iterations that node
// takes part in), and two live jobs never share an output_dir (the master
// refuses it), so none of them is being written.
[[nodiscard]] absl::Status RemoveCheckpointTemps(const std::filesystem::path& output_dir);

// train.overwrite_output_dir: as the run starts, the earlier run's
// checkpoints (iter_N and best) move into output_dir/checkpoints/.overwritten/
// (replacing what an overwrite that failed left there), out of sight of
// --resume, generate, export and the pruning, so a run that fails before its
// first checkpoint leaves no mix of the two runs (the earlier checkpoints
// beside the new run's config.json and metrics.jsonl, a --resume continuing
// the one with the other's); RemoveSetAsideCheckpoints removes them once the
// run has committed its first.
std::filesystem::path OverwrittenCheckpointsDir(const std::filesystem::path& output_dir);
[[nodiscard]] absl::Status SetAsideCheckpoints(const std::filesystem::path& output_dir);
[[nodiscard]] absl::Status RemoveSetAsideCheckpoints(const std::filesystem::path& output_dir);

// Keeps the `keep` checkpoints of the highest iterations and removes older
// ones (each renamed to a temporary's name first: a kill -9 midway leaves no
// iter_* that is half a checkpoint), iter_* without index.json older than
// the newest checkpoint, and temporary directories of other runs
// (tag != `tag`).
[[nodiscard]] absl::Status PruneCheckpoints(const std::filesystem::path& output_dir, int64_t keep,
                                            const std::string& tag);

// A committed checkpoint, opened for reading: index.json parsed and checked;
// rank files opened (and checked) when first read. Thread-safe.
class CheckpointReader {
 public:
  // `path`: a checkpoint directory (index.json), or Hugging Face weights (a
  // .safetensors file, or a directory holding model.safetensors and no
  // index.json). Hugging Face weights are read through `hf_layout`, the
  // model's Model::HuggingFaceTensors(), when given: each variable from its
  // Hugging Face tensors (converted ones transposed and stacked; a name
  // found with one leading component more or less than asked, e.g.
  // GPT2LMHeadModel's "transformer.", and old files' LayerNorm "gamma" /
  // "beta" for "weight" / "bias"); a missing tensor, a converted one of
  // another shape, or a tied one that differs is an error naming it here.
  // Without a layout, by their own names less "transformer.".
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const CheckpointReader>> Open(
      const std::filesystem::path& path, const std::vector<models::Model::HfTensor>& hf_layout = {});

  // What was opened (the directory, or the Hugging Face file).
  const std::filesystem::path& dir() const { return path_; }
  // Hugging Face weights rather than a Tessera checkpoint.
  bool huggingface() const { return huggingface_; }
  int64_t iteration() const { return iteration_; }
  // Samples trained (index.json's train_state; iteration × global batch).
  int64_t consumed_samples() const { return consumed_samples_; }
  const nlohmann::json& config() const { return config_; }
  // index.json's train_state.best (CheckpointState::best); null when absent.
  const nlohmann::json& best() const { return best_; }
  // index.json's train_state.evaluation_pending (CheckpointState).
  bool evaluation_pending() const { return evaluation_pending_; }
  bool Has(const std::string& name) const { return tensors_.contains(name); }
  // Every tensor's name, sorted.
  std::vector<std::string> TensorNames() const;
  // Hugging Face weights read through a layout: the file's tensors the
  // layout does not read (transformers' buffers aside), in file order.
  const std::vector<std::string>& unused_tensors() const { return unused_; }
  // The logical shape and dtype of a tensor as stored; NotFound naming the
  // checkpoint.
  [[nodiscard]] absl::StatusOr<TensorMeta> Meta(const std::string& name) const;
  // OK when tensor `name` can fill a model tensor of `model` (logical shape
  // and dtype): the same meta, or for Hugging Face weights a convertible
  // dtype and a shape that merges to the stored one. NotFound when it is
  // missing, InvalidArgument naming the tensor and both metas otherwise.
  [[nodiscard]] absl::Status CheckMeta(const std::string& name, const TensorMeta& model) const;
  // Fills `out` (the local tensor at `slice` of `name`) from every shard
  // that overlaps it. The logical shape and dtype must pass CheckMeta.
  [[nodiscard]] absl::Status Read(const std::string& name, const TensorSlice& slice, const Tensor& out) const;

 private:
  struct Shard {
    std::string file;
    std::string source;  // the tensor's name in the file
    std::vector<int64_t> offset;
    Shape shape;
  };
  struct Entry {
    TensorMeta meta;
    std::vector<Shard> shards;
    int converted = -1;  // Hugging Face weights: index in converted_ of a converted tensor
  };
  CheckpointReader() = default;
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const CheckpointReader>> OpenHuggingFace(
      const std::filesystem::path& file, const std::vector<models::Model::HfTensor>& hf_layout);
  // Fills `out` with the converted tensor `t` (its parts' names the file's),
  // whole, in the model's shape, as f32.
  [[nodiscard]] absl::Status ReadConverted(const models::Model::HfTensor& t, const std::string& file,
                                           std::vector<float>& out) const;
  // A rank file, opened (and checked, its checksums too where index.json
  // has them) when first asked for.
  absl::StatusOr<const SafetensorsFile*> File(const std::string& name) const;
  // DataLoss naming the file and the tensor whose bytes do not match the
  // checksum the file's metadata records for them.
  [[nodiscard]] absl::Status VerifyChecksums(const SafetensorsFile& file) const;
  // DataLoss when rank file `name` is not the one index.json lists (its
  // checksums differ from the index's).
  [[nodiscard]] absl::Status CheckFileMatchesIndex(const std::string& name, const SafetensorsFile& file) const;
  // Per rank file, its tensors' checksums as it was committed with (none in
  // indexes from before): a rank file of another checkpoint put in its
  // place is refused, though it checks out by itself.
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> committed_checksums_;
  // Per rank file, where index.json puts each of its shards: the file's own
  // record of them (its tessera.slices metadata) must agree, so an index
  // whose offsets were swapped or moved is refused, not read as other
  // weights.
  struct FileSlice {
    std::string tensor;
    std::vector<int64_t> offset;
    std::vector<int64_t> logical;
  };
  std::map<std::string, std::vector<FileSlice>> file_slices_;
  // DataLoss naming the file and the first shard whose place differs.
  [[nodiscard]] absl::Status CheckFileSlices(const std::string& name, const SafetensorsFile& file) const;

  std::filesystem::path path_;
  std::filesystem::path dir_;  // where shard files are
  bool huggingface_ = false;
  bool checksums_ = false;  // index.json names the rank files' checksums
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  nlohmann::json config_;
  nlohmann::json best_;
  bool evaluation_pending_ = false;
  std::map<std::string, Entry> tensors_;
  std::vector<models::Model::HfTensor> converted_;
  std::vector<std::string> unused_;
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

// OK when every tensor of a Tessera checkpoint `reader` is one `plan` (a
// whole job's plan, every node's part) keeps, mixed precision's bookkeeping
// (amp.*) aside; with `weights_only`, the optimizer state of a variable it
// keeps too (another optimizer's may differ); for Hugging Face weights, when the
// model reads every tensor of the file (unused_tensors()). Else
// InvalidArgument naming the first tensor left over: a model config
// smaller than the checkpoint's (fewer layers) would load silently, the
// rest dropped.
[[nodiscard]] absl::Status CheckCheckpointHoldsNothingMore(const proto::Plan& plan, const CheckpointReader& reader,
                                                           bool weights_only);

// Writes the model variables of a checkpoint (`tensors`: each whole, under
// its Hugging Face name and shape) to one safetensors file at `path`,
// durably, with the metadata {"format": "pt"} Hugging Face's loader asks for.
[[nodiscard]] absl::Status ExportSafetensors(const CheckpointReader& reader,
                                             const std::vector<models::Model::HfTensor>& tensors,
                                             const std::filesystem::path& path);

}  // namespace tessera
