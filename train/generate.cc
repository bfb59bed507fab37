#include "train/generate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "comm/collective/shm_communicator.h"
#include "core/file_util.h"
#include "core/philox.h"
#include "core/sbp.h"
#include "core/status.h"
#include "core/text.h"
#include "ops/cpu/matmul.h"
#include "ops/eager.h"
#include "ops/kernel_context.h"
#include "ops/op_schema.h"
#include "ops/registry.h"
#include "train/checkpoint.h"
#include "train/job_config.h"

// Shape letters, as in generate.h: V vocabulary, C hidden, H heads,
// D = C / H, F MLP width, P max positions, M tokens of one forward, L = the
// cache's length after it (keys attended).

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The last counter word of the sampling draws (a stream of their own).
constexpr uint32_t kSamplingStream = 0x53414d50;  // "SAMP"

// Work (multiply-adds) below which a piece is not worth a pool thread's
// wake-up (a few µs). A decoding step's weight products are matrix-vector
// ones, bound by streaming the weights: 2^15 MACs read 128 KB of f32, ~15 µs
// at the ~8 GB/s one core reaches here (ops/cpu/matmul.cc's 2^20 is sized for
// compute-bound GEMMs, and would leave every product of a step on one
// thread). A head's attention reads its cached k and v once per step.
constexpr int64_t kMinAttentionMacsPerChunk = int64_t{1} << 16;
constexpr int64_t kMinGemvMacsPerChunk = int64_t{1} << 15;
// Output columns of a matrix-vector piece are a multiple of this (whole
// AVX-512 vectors of y).
constexpr int64_t kGemvColumnAlign = 16;

// Candidates ranked by top-k / top-p before a draw grow by this factor until
// they hold the nucleus (most nuclei of a trained model are a few dozen
// tokens: a full sort of V would cost more than the forward).
constexpr int64_t kFirstNucleusRanks = 64;
constexpr int64_t kNucleusGrowth = 4;

// One registered op bound once to its canonical attributes, run on
// caller-owned tensors: the kernel training runs, without RunOp's per-call
// attribute checks, shape inference and output allocation. The shapes are
// this file's to get right. Immutable after Make.
class BoundOp {
 public:
  static absl::StatusOr<BoundOp> Make(std::string_view name, const ops::AttrMap& attrs = {}) {
    ASSIGN_OR_RETURN(const ops::OpSchema* schema, ops::BuiltinOps().Get(name));
    ASSIGN_OR_RETURN(ops::AttrMap canonical, schema->CanonicalizeAttrs(attrs));
    return BoundOp(schema, std::move(canonical));
  }

  absl::Status Run(std::vector<Tensor> inputs, std::vector<Tensor> outputs, ThreadPool* pool) const {
    ops::KernelContext ctx;
    ctx.inputs = std::move(inputs);
    ctx.outputs = std::move(outputs);
    ctx.attrs = &attrs_;
    ctx.pool = pool;
    return ops::RunKernel(*schema_, ctx);
  }

 private:
  BoundOp(const ops::OpSchema* schema, ops::AttrMap attrs) : schema_(schema), attrs_(std::move(attrs)) {}
  const ops::OpSchema* schema_;
  ops::AttrMap attrs_;
};

// `shape` over the floats of the 1-D `buffer` from element `offset` on: the
// work buffers are flat and sized for the largest forward, and each forward
// views them at its own M and L.
Tensor View(const Tensor& buffer, int64_t offset, const Shape& shape) {
  absl::StatusOr<Tensor> rows = buffer.SliceRows(offset, shape.NumElements());
  TESSERA_CHECK(rows.ok(), rows.status().message());
  absl::StatusOr<Tensor> view = rows->Reshape(shape);
  TESSERA_CHECK(view.ok(), view.status().message());
  return *std::move(view);
}

absl::StatusOr<Tensor> FlatBuffer(int64_t floats) { return Tensor::Zeros(Shape{floats}, DType::kF32); }

// The kernels of the forward, bound once.
struct Kernels {
  BoundOp layer_norm;      // (x, gamma, beta) -> (y, mean, rstd), eps = model.layernorm_epsilon
  BoundOp matmul_nt;       // (M, K) @ (N, K)ᵀ: every weight is stored (out, in)
  BoundOp bias_add;        // in place
  BoundOp bias_gelu;       // in place, tanh GELU (GPT-2's gelu_new, as nn::MLP)
  BoundOp causal_softmax;  // softmax(scores / sqrt(D)), keys after the query dropped
  BoundOp add;             // the residual stream, in place

  static absl::StatusOr<Kernels> Make(double eps, int64_t head_dim) {
    ASSIGN_OR_RETURN(BoundOp layer_norm, BoundOp::Make("layer_norm", {{"eps", eps}}));
    ASSIGN_OR_RETURN(BoundOp matmul_nt, BoundOp::Make("matmul", {{"transpose_b", true}}));
    ASSIGN_OR_RETURN(BoundOp bias_add, BoundOp::Make("bias_add"));
    ASSIGN_OR_RETURN(BoundOp bias_gelu, BoundOp::Make("bias_gelu", {{"approximate", std::string("tanh")}}));
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));  // as nn::MultiheadAttention
    ASSIGN_OR_RETURN(BoundOp causal_softmax, BoundOp::Make("fused_scale_causal_softmax", {{"scale", scale}}));
    ASSIGN_OR_RETURN(BoundOp add, BoundOp::Make("add"));
    return Kernels{std::move(layer_norm), std::move(matmul_nt),      std::move(bias_add),
                   std::move(bias_gelu),  std::move(causal_softmax), std::move(add)};
  }
};

// One block's parameters (Hugging Face's names in the checkpoint) and its
// KV cache. The projection weights are kept transposed, (out, in), like
// wte for the tied head: a decoding step's matrix-vector product is then cut
// over the pool by output columns, each piece a contiguous block of rows of
// the weight (the checkpoint's (in, out) would give strided column blocks,
// which the GEMM driver does not take).
// Under tensor parallelism a rank holds its slice, as training lays the
// parameters out over tp (nn/transformer.h): Hl of the H heads (balanced:
// T need not divide H), so Cl = Hl·D columns of each of q, k, v and rows of
// attn.c_proj, and Fl of the MLP's F (balanced); the shapes below are a
// rank's (T = 1: Hl = H, Cl = C, Fl = F).
struct Layer {
  Tensor ln_1_weight, ln_1_bias;  // (C)
  Tensor c_attn_weight_t;         // (3Cl, C): the checkpoint's (C, 3, C) = HF's (C, 3C), sliced, transposed
  Tensor c_attn_bias;             // (3Cl): the checkpoint's (3, C), sliced
  Tensor attn_proj_weight_t;      // (C, Cl)
  Tensor attn_proj_bias;          // (C)
  Tensor ln_2_weight, ln_2_bias;  // (C)
  Tensor fc_weight_t;             // (Fl, C)
  Tensor fc_bias;                 // (Fl)
  Tensor mlp_proj_weight_t;       // (C, Fl)
  Tensor mlp_proj_bias;           // (C)
  Tensor k_cache, v_cache;        // (Hl, P, D); rows [0, length) valid
};

// How a rank reads its slices: rank `rank` of `ranks` (tensor parallelism;
// 1: whole tensors).
struct RankSlicer {
  int64_t rank = 0;
  int64_t ranks = 1;
  // > 1: `axis` is cut between blocks of `unit` elements (an attention
  // head's D columns), the blocks balanced over the ranks; 1: as training's
  // S(axis) over tp.
  int64_t unit = 1;
  // The rank's block of `shape` split on `axis`; axis < 0: the whole tensor.
  absl::StatusOr<TensorSlice> Slice(const Shape& shape, int axis) const {
    if (axis < 0 || ranks == 1) return TensorSlice::Whole(shape);
    if (unit == 1) return LocalSlice(shape, NdSbp{Sbp::Split(axis)}, {ranks}, rank);
    TensorSlice slice = TensorSlice::Whole(shape);
    const Range blocks = BalancedSplit(shape[axis] / unit, ranks, rank);
    slice.offset[static_cast<size_t>(axis)] = blocks.offset * unit;
    slice.local[axis] = blocks.size * unit;
    return slice;
  }
};

// Reads rank's block (split on `axis`, < 0: whole) of tensor `name` from the
// checkpoint, which must hold it as f32 of `shape`; `view` (same element
// count as the block; empty: the block's shape) is the shape the forward uses.
absl::StatusOr<Tensor> LoadTensor(const CheckpointReader& reader, const RankSlicer& slicer, const std::string& name,
                                  const Shape& shape, int axis = -1, Shape view = Shape()) {
  const std::string where = StrCat("checkpoint ", reader.dir().string(), ": ");
  if (!reader.Has(name)) {
    return absl::InvalidArgumentError(StrCat(where, "no tensor '", name, "': not a GPT-2 checkpoint"));
  }
  const absl::Status fits = reader.CheckMeta(name, TensorMeta{DType::kF32, shape});
  if (!fits.ok()) return absl::InvalidArgumentError(StrCat(fits.message(), " (the run's model config, model.*)"));
  ASSIGN_OR_RETURN(const TensorSlice slice, slicer.Slice(shape, axis));
  ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(slice.local, DType::kF32));
  RETURN_IF_ERROR(reader.Read(name, slice, tensor));
  return view.rank() == 0 ? tensor : tensor.Reshape(view);
}

// A Conv1D weight stored (in, out) in the checkpoint (as `shape`), the
// rank's block (split on `axis`) viewed (in, out_local) and returned
// (out_local, in) through the transpose op.
absl::StatusOr<Tensor> LoadTransposed(const CheckpointReader& reader, const RankSlicer& slicer, const std::string& name,
                                      const Shape& shape, int axis) {
  ASSIGN_OR_RETURN(Tensor weight, LoadTensor(reader, slicer, name, shape, axis));
  // [in, out...] as [in, out]; a rank holding none of a split axis (more
  // ranks than heads) has in or out 0.
  const int64_t in = weight.shape()[0];
  int64_t out = 1;
  for (int d = 1; d < weight.shape().rank(); ++d) out *= weight.shape()[d];
  ASSIGN_OR_RETURN(weight, weight.Reshape(Shape{in, out}));
  ASSIGN_OR_RETURN(std::vector<Tensor> transposed,
                   ops::RunOp("transpose", {weight}, {{"perm", std::vector<int64_t>{1, 0}}}));
  return transposed[0];
}

// The run's models.GPT2 config, from the checkpoint's resolved config or
// (`given`) the caller's run config.
absl::StatusOr<models::Gpt2Config> ReadGpt2Config(const CheckpointReader& reader, const nlohmann::json& config,
                                                  bool given) {
  const std::string where =
      given ? std::string("the given run config (--config): ") : StrCat("checkpoint ", reader.dir().string(), ": ");
  if (!config.is_object() || !config.contains("model") || !config["model"].is_object()) {
    return absl::InvalidArgumentError(StrCat(where, given ? "it" : "its config", " has no model section"));
  }
  const nlohmann::json& model = config["model"];
  const std::string target =
      model.contains("_target_") && model["_target_"].is_string() ? model["_target_"].get<std::string>() : "";
  if (target != "models.GPT2") {
    return absl::InvalidArgumentError(StrCat(where, given ? "its model is '" : "the run trained '",
                                             target.empty() ? "no model._target_" : target, "', not models.GPT2"));
  }
  absl::StatusOr<models::Gpt2Config> gpt2 = models::ReadModelKeys(models::Gpt2::Keys(), model);
  if (!gpt2.ok()) return absl::InvalidArgumentError(StrCat(where, gpt2.status().message()));
  const absl::Status valid = models::Gpt2::Validate(*gpt2);
  if (!valid.ok()) return absl::InvalidArgumentError(StrCat(where, valid.message()));
  // A run config given for a Tessera checkpoint must describe its model:
  // the shapes (a model of fewer layers would read the first ones and
  // generate other text silently; other sizes are the config's fault, not
  // the checkpoint's) and the keys that shape no tensor but change what
  // the weights compute.
  const nlohmann::json& saved = reader.config();
  if (given && !reader.huggingface() && saved.is_object() && saved.contains("model") && saved["model"].is_object()) {
    const nlohmann::json& trained = saved["model"];
    const std::pair<const char*, nlohmann::json> keys[] = {
        {"_target_", target},
        {"num_layers", gpt2->num_layers},
        {"hidden_size", gpt2->hidden_size},
        {"ffn_hidden_size", gpt2->ffn_hidden_size.value_or(4 * gpt2->hidden_size)},
        {"vocab_size", gpt2->vocab_size},
        {"max_seq_length", gpt2->max_seq_length},
        {"num_attention_heads", gpt2->num_attention_heads},
        {"layernorm_epsilon", gpt2->layernorm_epsilon}};
    for (const auto& [key, is] : keys) {
      if (trained.contains(key) && !trained[key].is_null() && trained[key] != is) {
        return absl::InvalidArgumentError(StrCat(where, "model.", key, " is ", is.dump(), ", but checkpoint ",
                                                 reader.dir().string(), " was trained with ", trained[key].dump()));
      }
    }
  }
  return *gpt2;
}

absl::Status CheckIds(std::span<const int64_t> ids, int64_t vocab, int64_t positions, std::string_view what) {
  if (ids.empty()) {
    return absl::InvalidArgumentError(StrCat("the ", what, " is empty: generation needs at least one token"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          StrCat(what, " token ", i, " is id ", ids[i], ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(ids.size()) > positions) {
    return absl::OutOfRangeError(StrCat("the ", what, " has ", ids.size(), " tokens, more than the model's ", positions,
                                        " positions (model.max_seq_length)"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const GenerateOptions& o, int64_t vocab) {
  const auto fail = [](auto&&... parts) { return absl::InvalidArgumentError(StrCat(parts...)); };
  if (o.max_new_tokens < 0) return fail("max_new_tokens must be >= 0, got ", o.max_new_tokens);
  if (!(o.temperature >= 0) || std::isinf(o.temperature)) {
    return fail("temperature must be a finite number >= 0 (0 = greedy), got ", o.temperature);
  }
  if (o.top_k < 0) return fail("top_k must be >= 0 (0 = off), got ", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) return fail("top_p must be in (0, 1] (1 = off), got ", o.top_p);
  if (o.vocab_limit && (*o.vocab_limit < 1 || *o.vocab_limit > vocab)) {
    return fail("vocab_limit must be in [1, ", vocab, "], got ", *o.vocab_limit);
  }
  if (o.stop_token && (*o.stop_token < 0 || *o.stop_token >= vocab)) {
    return fail("stop_token ", *o.stop_token, " is outside the vocabulary [0, ", vocab, ")");
  }
  return absl::OkStatus();
}

// A uniform double in [0, 1) (53 random bits), a pure function of (seed, step).
double UniformDraw(uint64_t seed, int64_t step) {
  const auto u = static_cast<uint64_t>(step);
  const std::array<uint32_t, 4> r =
      Philox4x32(MakePhiloxKey(seed), static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), 0, kSamplingStream);
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) | (r[1] >> 11);
  return static_cast<double>(bits) * 0x1p-53;
}

struct Candidate {
  float logit;
  int64_t id;
};

// The ranking of top-k and top-p: higher logit first, then lower id, so
// equal logits rank the same on every run.
bool RanksBefore(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The next token from `logits` (n = the ids allowed), as generate.h says.
// `ranked` is scratch of at least n entries, kept by the caller so a step
// allocates nothing.
absl::StatusOr<int64_t> ChooseToken(const float* logits, int64_t n, const GenerateOptions& o, int64_t step,
                                    std::vector<Candidate>& ranked) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) {
      return absl::FailedPreconditionError(
          StrCat("the model's logits are NaN at new token ", step, " (a diverged checkpoint?)"));
    }
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lowest id
  }
  if (o.temperature == 0) return best;

  const double inv_temperature = 1.0 / o.temperature;
  const double max_logit = logits[best];
  // (The likeliest logit weighs 1 whatever the temperature: a subnormal
  // one has an infinite reciprocal, and 0 * inf made its weight NaN, so
  // top-k drew its last-ranked token.)
  const auto weight = [&](float logit) {
    const double below = static_cast<double>(logit) - max_logit;
    return below == 0 ? 1.0 : std::exp(below * inv_temperature);
  };
  const double u = UniformDraw(o.seed, step);
  if (o.top_k == 0 && o.top_p >= 1) {  // the whole softmax, walked in id order
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += weight(logits[i]);
    const double target = u * total;
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += weight(logits[i]);
      if (acc > target) return i;
    }
    return best;  // rounding left the target past the last sum
  }

  for (int64_t i = 0; i < n; ++i) ranked[static_cast<size_t>(i)] = {logits[i], i};
  const auto begin = ranked.begin();
  int64_t kept = n, sorted = 0;
  if (o.top_k > 0 && o.top_k < n) {
    std::partial_sort(begin, begin + o.top_k, begin + n, RanksBefore);
    kept = sorted = o.top_k;
  }
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) total += weight(ranked[static_cast<size_t>(i)].logit);
  if (o.top_p < 1) {
    // The shortest ranked prefix holding top_p of the kept mass (Hugging
    // Face removes the tokens whose ascending cumulative probability is
    // <= 1 - top_p: the same set). Rank more candidates only while the
    // ranked ones hold less.
    const double nucleus = o.top_p * total;
    for (int64_t ranks = std::min(kept, kFirstNucleusRanks);; ranks = std::min(kept, ranks * kNucleusGrowth)) {
      if (ranks > sorted) {
        std::partial_sort(begin + sorted, begin + ranks, begin + kept, RanksBefore);
        sorted = ranks;
      }
      double acc = 0;
      int64_t i = 0;
      while (i < ranks && acc < nucleus) acc += weight(ranked[static_cast<size_t>(i++)].logit);
      if (acc >= nucleus || ranks == kept) {
        kept = std::max<int64_t>(i, 1);
        total = acc;
        break;
      }
    }
  }
  const double target = u * total;
  double acc = 0;
  for (int64_t i = 0; i < kept; ++i) {
    acc += weight(ranked[static_cast<size_t>(i)].logit);
    if (acc > target) return ranked[static_cast<size_t>(i)].id;
  }
  return ranked[static_cast<size_t>(kept - 1)].id;
}

// Runs fn(i) for i in [0, n) on the pool, `grain` indices per chunk at
// least; the first error wins.
absl::Status ParallelForStatus(ThreadPool* pool, int64_t n, int64_t grain,
                               const std::function<absl::Status(int64_t)>& fn) {
  std::mutex error_mu;
  absl::Status error;
  ParallelFor(pool, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      absl::Status status = fn(i);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (error.ok()) error = std::move(status);
        return;
      }
    }
  });
  return error;
}

}  // namespace

std::string_view StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxNewTokens:
      return "max_new_tokens";
    case StopReason::kStopToken:
      return "stop_token";
    case StopReason::kContextFull:
      return "context_full";
  }
  return "?";
}

// One tensor-parallel rank of the model (the whole model when T = 1): its
// slices of the weights (Layer), its heads' KV caches and its work
// buffers, all allocated by Open. Its Forward runs on one thread and meets
// the other ranks in `comm` after each row-parallel product.
struct Shard {
  int64_t rank = 0;
  int64_t Hl = 0, Cl = 0, Fl = 0;  // heads, their columns, MLP columns of this rank
  int64_t v_begin = 0, v_end = 0;  // the vocabulary rows of wte (and logits) it holds
  ThreadPool* pool = nullptr;
  std::shared_ptr<comm::Communicator> comm;  // null when T = 1

  Tensor wte;  // (Vl, C): rows [v_begin, v_end), also the LM head's
  std::vector<Layer> layers;

  // Work buffers, flat, sized for `chunk` tokens.
  Tensor x;              // (chunk, C) the residual stream
  Tensor normed;         // (chunk, C) a layer norm's output
  Tensor mean, rstd;     // (chunk) its statistics (unused: no backward)
  Tensor qkv;            // (chunk, 3, Hl, D)
  Tensor q;              // (Hl, chunk, D)
  Tensor scores, probs;  // (Hl, chunk, P), packed as (Hl, M, L) per forward
  Tensor context_heads;  // (Hl, chunk, D)
  Tensor context;        // (chunk, Cl)
  Tensor projected;      // (chunk, C) an output projection (a partial sum over ranks)
  Tensor hidden;         // (chunk, Fl) the MLP's inner activations
};

struct Generator::State {
  fs::path dir;
  int64_t iteration = 0;
  nlohmann::json run_config;
  models::Gpt2Config config;
  int64_t V = 0, C = 0, H = 0, D = 0, F = 0, P = 0;
  int64_t chunk = 0;  // the most tokens one forward takes

  // Replicated: the same on every rank, read-only.
  Tensor wpe;                     // (P, C)
  Tensor ln_f_weight, ln_f_bias;  // (C)
  std::optional<Kernels> kernels;
  std::vector<Shard> shards;  // one per tensor-parallel rank

  Tensor logits;                  // (V) flat: each rank writes its rows' logits
  std::vector<Candidate> ranked;  // (V) sampling scratch

  int64_t length = 0;  // positions in the caches

  // Every rank's forward, rank 0 on the calling thread and the others on
  // threads of their own (they meet in their all-reduces).
  absl::Status Forward(std::span<const int64_t> tokens, bool want_logits);
  absl::Status ShardForward(Shard& shard, std::span<const int64_t> tokens, bool want_logits);
  // y (M, N) = x (M, K) @ weight_tᵀ, weight_t (N, K).
  absl::Status Linear(const Shard& shard, const Tensor& x, const Tensor& weight_t, const Tensor& y);
  absl::Status Attention(Shard& shard, const Layer& layer, int64_t M, int64_t L);
  // The sum over ranks of `partial` (in place); nothing when T = 1.
  absl::Status AllReduce(const Shard& shard, const Tensor& partial);
  // Feeds `ids` from an empty cache, `per_forward` at a time; the logits of
  // the last one are left in `logits`.
  absl::Status Prefill(std::span<const int64_t> ids, int64_t per_forward);
};

absl::Status Generator::State::AllReduce(const Shard& shard, const Tensor& partial) {
  if (shard.comm == nullptr) return absl::OkStatus();
  std::promise<absl::Status> reduced;
  shard.comm->AllReduce(partial, partial, comm::ReduceOp::kSum, [&reduced](absl::Status s) { reduced.set_value(s); });
  return reduced.get_future().get();
}

// Attention of the M new queries (in q) over the L cached keys: context
// (M, Cl) = concat over the rank's heads of softmax(q_h K_hᵀ / sqrt(D),
// causal) V_h. Heads are independent: each pool chunk runs whole heads,
// GEMM, softmax and GEMM, on its own thread (one wake-up per layer rather
// than three).
absl::Status Generator::State::Attention(Shard& shard, const Layer& layer, int64_t M, int64_t L) {
  const int64_t Hl = shard.Hl;
  const float* q_data = shard.q.data<float>();            // (Hl, M, D)
  const float* k_data = layer.k_cache.data<float>();      // (Hl, P, D)
  const float* v_data = layer.v_cache.data<float>();      // (Hl, P, D)
  float* scores_data = shard.scores.data<float>();        // (Hl, M, L)
  float* probs_data = shard.probs.data<float>();          // (Hl, M, L)
  float* heads_data = shard.context_heads.data<float>();  // (Hl, M, D)
  const ops::KernelContext serial;                        // no pool: a head runs on one thread
  const int64_t head_macs = 2 * M * L * D;
  const int64_t grain = (kMinAttentionMacsPerChunk + head_macs - 1) / head_macs;  // heads per chunk
  RETURN_IF_ERROR(ParallelForStatus(shard.pool, Hl, grain, [&](int64_t h) {
    // scores_h (M, L) = q_h (M, D) @ K_h[0, L)ᵀ, unscaled as in training
    RETURN_IF_ERROR(ops::cpu::RunGemm(serial, {.transpose_b = true,
                                               .m = M,
                                               .n = L,
                                               .k = D,
                                               .a = q_data + h * M * D,
                                               .b = k_data + h * P * D,
                                               .y = scores_data + h * M * L}));
    // Query m sits at position L - M + m: the kernel's causal mask (key s
    // dropped when s > m + L - M) is the cache's.
    RETURN_IF_ERROR(kernels->causal_softmax.Run({View(shard.scores, h * M * L, Shape{M, L})},
                                                {View(shard.probs, h * M * L, Shape{M, L})}, nullptr));
    // context_h (M, D) = probs_h (M, L) @ V_h[0, L)
    return ops::cpu::RunGemm(
        serial,
        {.m = M, .n = D, .k = L, .a = probs_data + h * M * L, .b = v_data + h * P * D, .y = heads_data + h * M * D});
  }));
  float* out = shard.context.data<float>();  // (M, Cl) = (M, Hl, D)
  for (int64_t h = 0; h < Hl; ++h) {
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(out + (m * Hl + h) * D, heads_data + (h * M + m) * D, D * sizeof(float));
    }
  }
  return absl::OkStatus();
}

// Several rows (a prompt chunk) are a GEMM, which the matmul kernel cuts
// over the pool itself. One row is a matrix-vector product that the kernel
// leaves on one thread (its pieces are sized for compute-bound GEMMs), while
// it is bound by reading the weight: here it is cut by output columns, one
// single-threaded GEMM per piece, so each thread streams its own rows of
// the weight.
absl::Status Generator::State::Linear(const Shard& shard, const Tensor& x, const Tensor& weight_t, const Tensor& y) {
  ThreadPool* pool = shard.pool;
  const int64_t M = x.shape()[0], K = x.shape()[1], N = weight_t.shape()[0];
  const int64_t threads = pool == nullptr ? 1 : pool->num_threads();
  const int64_t pieces = std::min(threads, std::max<int64_t>(1, N * K / kMinGemvMacsPerChunk));
  if (M > 1 || pieces == 1) return kernels->matmul_nt.Run({x, weight_t}, {y}, pool);
  const float* x_data = x.data<float>();         // (1, K)
  const float* w_data = weight_t.data<float>();  // (N, K)
  float* y_data = y.data<float>();               // (1, N)
  const ops::KernelContext serial;
  const auto first_column = [&](int64_t piece) {
    return piece == pieces ? N : piece * N / pieces / kGemvColumnAlign * kGemvColumnAlign;
  };
  return ParallelForStatus(pool, pieces, 1, [&](int64_t piece) {
    const int64_t begin = first_column(piece), end = first_column(piece + 1);
    return ops::cpu::RunGemm(serial, {.transpose_b = true,
                                      .m = 1,
                                      .n = end - begin,
                                      .k = K,
                                      .a = x_data,
                                      .b = w_data + begin * K,
                                      .y = y_data + begin});
  });
}

absl::Status Generator::State::Forward(std::span<const int64_t> tokens, bool want_logits) {
  const auto M = static_cast<int64_t>(tokens.size());
  TESSERA_CHECK(M >= 1 && M <= chunk && length + M <= P, "forward of ", M, " tokens at ", length);
  std::vector<absl::Status> status(shards.size());
  std::vector<std::thread> others;
  others.reserve(shards.size());
  for (size_t r = 1; r < shards.size(); ++r) {
    try {
      others.emplace_back([&, r] { status[r] = ShardForward(shards[r], tokens, want_logits); });
    } catch (const std::system_error& e) {
      // (No thread for rank r: the started ranks would wait for it in their
      // first collective. Aborting the group ends them.)
      status[r] = absl::ResourceExhaustedError(
          StrCat("cannot start a thread for tensor-parallel rank ", r, " of ", shards.size(), ": ", e.what()));
      for (Shard& shard : shards) {
        if (shard.comm != nullptr) shard.comm->Abort(status[r]);
      }
      for (std::thread& t : others) t.join();
      return status[r];
    }
  }
  status[0] = ShardForward(shards[0], tokens, want_logits);
  for (std::thread& t : others) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  length += M;
  return absl::OkStatus();
}

// The GPT-2 forward of `tokens` at positions [length, length + M) on one
// rank: the training graph's ops (nn/transformer.cc) without dropout, keys
// and values of earlier positions read from the caches. Under tensor
// parallelism the rank computes its heads and MLP columns, and the partial
// sums of the row-parallel products (and of the vocabulary-parallel
// embedding) are all-reduced, as training's P -> B, before the biases are
// added. A failure aborts the ranks' group, so no rank waits on it.
absl::Status Generator::State::ShardForward(Shard& shard, std::span<const int64_t> tokens, bool want_logits) {
  absl::Status status = [&]() -> absl::Status {
    const auto M = static_cast<int64_t>(tokens.size());
    const int64_t n = length, L = n + M, Hl = shard.Hl, Cl = shard.Cl, Fl = shard.Fl;
    const Kernels& k = *kernels;
    ThreadPool* pool = shard.pool;

    // x = wte[token] + wpe[position]: the rank holding the token's row
    // contributes it (the vocabulary-parallel embedding), then wpe.
    float* x_data = shard.x.data<float>();  // (M, C)
    const float* wte_data = shard.wte.data<float>();
    for (int64_t m = 0; m < M; ++m) {
      const int64_t token = tokens[static_cast<size_t>(m)];
      if (token >= shard.v_begin && token < shard.v_end) {
        std::memcpy(x_data + m * C, wte_data + (token - shard.v_begin) * C, C * sizeof(float));
      } else {
        std::fill_n(x_data + m * C, C, 0.0f);
      }
    }
    const Tensor x_m = View(shard.x, 0, Shape{M, C});
    RETURN_IF_ERROR(AllReduce(shard, x_m));
    const float* wpe_data = wpe.data<float>();
    for (int64_t m = 0; m < M; ++m) {
      const float* position_row = wpe_data + (n + m) * C;
      for (int64_t c = 0; c < C; ++c) x_data[m * C + c] += position_row[c];
    }

    const Tensor normed_m = View(shard.normed, 0, Shape{M, C});
    const Tensor mean_m = View(shard.mean, 0, Shape{M}), rstd_m = View(shard.rstd, 0, Shape{M});
    const Tensor qkv_m = View(shard.qkv, 0, Shape{M, 3 * Cl});
    const Tensor context_m = View(shard.context, 0, Shape{M, Cl});
    const Tensor projected_m = View(shard.projected, 0, Shape{M, C});
    const Tensor hidden_m = View(shard.hidden, 0, Shape{M, Fl});
    for (const Layer& layer : shard.layers) {
      // h = x + c_proj(attention(c_attn(ln_1(x))))
      RETURN_IF_ERROR(k.layer_norm.Run({x_m, layer.ln_1_weight, layer.ln_1_bias}, {normed_m, mean_m, rstd_m}, pool));
      RETURN_IF_ERROR(Linear(shard, normed_m, layer.c_attn_weight_t, qkv_m));
      RETURN_IF_ERROR(k.bias_add.Run({qkv_m, layer.c_attn_bias}, {qkv_m}, pool));
      // q to heads (Hl, M, D); k and v appended to the caches at rows [n, L).
      const float* qkv_data = shard.qkv.data<float>();  // (M, 3, Hl, D)
      float* q_data = shard.q.data<float>();            // (Hl, M, D)
      float* k_data = layer.k_cache.data<float>();      // (Hl, P, D)
      float* v_data = layer.v_cache.data<float>();      // (Hl, P, D)
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t h = 0; h < Hl; ++h) {
          const size_t bytes = static_cast<size_t>(D) * sizeof(float);
          std::memcpy(q_data + (h * M + m) * D, qkv_data + ((m * 3 + 0) * Hl + h) * D, bytes);
          std::memcpy(k_data + (h * P + n + m) * D, qkv_data + ((m * 3 + 1) * Hl + h) * D, bytes);
          std::memcpy(v_data + (h * P + n + m) * D, qkv_data + ((m * 3 + 2) * Hl + h) * D, bytes);
        }
      }
      RETURN_IF_ERROR(Attention(shard, layer, M, L));
      RETURN_IF_ERROR(Linear(shard, context_m, layer.attn_proj_weight_t, projected_m));
      RETURN_IF_ERROR(AllReduce(shard, projected_m));
      RETURN_IF_ERROR(k.bias_add.Run({projected_m, layer.attn_proj_bias}, {projected_m}, pool));
      RETURN_IF_ERROR(k.add.Run({x_m, projected_m}, {x_m}, pool));
      // y = h + c_proj(gelu(c_fc(ln_2(h))))
      RETURN_IF_ERROR(k.layer_norm.Run({x_m, layer.ln_2_weight, layer.ln_2_bias}, {normed_m, mean_m, rstd_m}, pool));
      RETURN_IF_ERROR(Linear(shard, normed_m, layer.fc_weight_t, hidden_m));
      RETURN_IF_ERROR(k.bias_gelu.Run({hidden_m, layer.fc_bias}, {hidden_m}, pool));
      RETURN_IF_ERROR(Linear(shard, hidden_m, layer.mlp_proj_weight_t, projected_m));
      RETURN_IF_ERROR(AllReduce(shard, projected_m));
      RETURN_IF_ERROR(k.bias_add.Run({projected_m, layer.mlp_proj_bias}, {projected_m}, pool));
      RETURN_IF_ERROR(k.add.Run({x_m, projected_m}, {x_m}, pool));
    }
    if (!want_logits) return absl::OkStatus();
    // logits[v_begin, v_end) = ln_f(x[M - 1]) @ wte[v_begin, v_end)ᵀ: only
    // the last position is read.
    const Tensor last = View(shard.x, (M - 1) * C, Shape{1, C});
    const Tensor normed_1 = View(shard.normed, 0, Shape{1, C});
    RETURN_IF_ERROR(k.layer_norm.Run({last, ln_f_weight, ln_f_bias},
                                     {normed_1, View(shard.mean, 0, Shape{1}), View(shard.rstd, 0, Shape{1})}, pool));
    return Linear(shard, normed_1, shard.wte, View(logits, shard.v_begin, Shape{1, shard.v_end - shard.v_begin}));
  }();
  if (!status.ok() && shard.comm != nullptr) shard.comm->Abort(status);
  return status;
}

absl::Status Generator::State::Prefill(std::span<const int64_t> ids, int64_t per_forward) {
  length = 0;  // the caches' old rows are overwritten before they are read
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t step = std::min(per_forward, chunk);
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t end = std::min(n, begin + step);
    RETURN_IF_ERROR(Forward(ids.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)), end == n));
  }
  return absl::OkStatus();
}

Generator::Generator(std::unique_ptr<State> state) : state_(std::move(state)) {}
Generator::~Generator() = default;

absl::StatusOr<std::unique_ptr<Generator>> Generator::Open(const fs::path& path, GeneratorOptions options) {
  if (options.prefill_chunk < 1) {
    return absl::InvalidArgumentError(StrCat("prefill_chunk must be >= 1, got ", options.prefill_chunk));
  }
  if (options.tensor_parallel_size < 1) {
    return absl::InvalidArgumentError(StrCat("tensor_parallel_size must be >= 1, got ", options.tensor_parallel_size));
  }
  ASSIGN_OR_RETURN(const fs::path dir, ResolveCheckpoint(path));
  ASSIGN_OR_RETURN(const std::shared_ptr<const CheckpointReader> reader, CheckpointReader::Open(dir));
  if (reader->huggingface() && !options.run_config) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(),
                                             ": Hugging Face weights carry no Tessera config: give the run's config "
                                             "(--config)"));
  }
  const nlohmann::json run_config = options.run_config ? *options.run_config : reader->config();
  ASSIGN_OR_RETURN(const models::Gpt2Config config,
                   ReadGpt2Config(*reader, run_config, options.run_config.has_value()));
  {
    // Weights of more layers than the config's would be read in part, and
    // generate other text silently; of fewer, miss a layer (Hugging Face
    // weights and a config given, or a checkpoint whose index.json's config
    // was edited).
    int64_t layers = 0;
    for (std::string_view name : reader->TensorNames()) {
      if (name.starts_with("transformer.")) name.remove_prefix(std::string_view("transformer.").size());
      if (!name.starts_with("h.")) continue;
      const std::string_view number = name.substr(2, name.find('.', 2) - 2);  // (substr past the end throws)
      int64_t layer = 0;
      if (absl::SimpleAtoi(absl::string_view(number.data(), number.size()), &layer)) {
        layers = std::max(layers, layer + 1);
      }
    }
    // (And of fewer: "no tensor 'h.2.ln_1.weight'" named no layer count.)
    if (layers != config.num_layers && layers > 0) {
      return absl::InvalidArgumentError(StrCat("model.num_layers is ", config.num_layers, ", but the weights ",
                                               dir.string(), " hold ", layers, " layers (h.0 to h.", layers - 1,
                                               "): give the config they were trained with"));
    }
  }

  auto s = std::make_unique<State>();
  s->dir = dir;
  s->iteration = reader->iteration();
  s->run_config = run_config;
  s->config = config;
  const int64_t V = s->V = config.vocab_size, C = s->C = config.hidden_size;
  const int64_t H = s->H = config.num_attention_heads, D = s->D = C / H;
  const int64_t F = s->F = config.ffn(), P = s->P = config.max_seq_length;
  const int64_t chunk = s->chunk = std::min(options.prefill_chunk, P);
  const int64_t T = options.tensor_parallel_size;
  // Ranks beyond the heads (or the MLP width) hold none of them and add
  // nothing; every rank holds part of the vocabulary.
  if (V < T) {
    return absl::InvalidArgumentError(
        StrCat("tensor_parallel_size ", T, " is more than the model's vocabulary of ", V, " tokens"));
  }

  const RankSlicer whole;
  ASSIGN_OR_RETURN(s->wpe, LoadTensor(*reader, whole, "wpe.weight", Shape{P, C}));
  ASSIGN_OR_RETURN(s->ln_f_weight, LoadTensor(*reader, whole, "ln_f.weight", Shape{C}));
  ASSIGN_OR_RETURN(s->ln_f_bias, LoadTensor(*reader, whole, "ln_f.bias", Shape{C}));
  ASSIGN_OR_RETURN(Kernels kernels, Kernels::Make(config.layernorm_epsilon, D));
  s->kernels.emplace(std::move(kernels));
  // The ranks' group: shared memory, ranks combined in order (bit-identical
  // on every rank).
  comm::ShmHub hub;
  for (int64_t r = 0; r < T; ++r) {
    const RankSlicer slicer{.rank = r, .ranks = T};
    const RankSlicer heads{.rank = r, .ranks = T, .unit = D};
    Shard shard;
    shard.rank = r;
    shard.Hl = BalancedSplit(H, T, r).size;
    shard.Cl = shard.Hl * D;
    // With several ranks each runs on its own thread, its kernels on it alone.
    shard.pool = T == 1 ? options.pool : nullptr;
    if (T > 1) {
      ASSIGN_OR_RETURN(shard.comm, hub.Join("generate-tp", static_cast<int>(T), static_cast<int>(r)));
    }
    ASSIGN_OR_RETURN(const TensorSlice vocab, slicer.Slice(Shape{V, C}, 0));
    shard.v_begin = vocab.offset[0];
    shard.v_end = vocab.offset[0] + vocab.local[0];
    ASSIGN_OR_RETURN(shard.wte, LoadTensor(*reader, slicer, "wte.weight", Shape{V, C}, 0));
    for (int64_t i = 0; i < config.num_layers; ++i) {
      const std::string h = StrCat("h.", i, ".");
      Layer l;
      ASSIGN_OR_RETURN(l.ln_1_weight, LoadTensor(*reader, whole, h + "ln_1.weight", Shape{C}));
      ASSIGN_OR_RETURN(l.ln_1_bias, LoadTensor(*reader, whole, h + "ln_1.bias", Shape{C}));
      ASSIGN_OR_RETURN(l.c_attn_weight_t, LoadTransposed(*reader, heads, h + "attn.c_attn.weight", Shape{C, 3, C}, 2));
      ASSIGN_OR_RETURN(l.c_attn_bias,
                       LoadTensor(*reader, heads, h + "attn.c_attn.bias", Shape{3, C}, 1, Shape{3 * shard.Cl}));
      ASSIGN_OR_RETURN(l.attn_proj_weight_t, LoadTransposed(*reader, heads, h + "attn.c_proj.weight", Shape{C, C}, 0));
      ASSIGN_OR_RETURN(l.attn_proj_bias, LoadTensor(*reader, whole, h + "attn.c_proj.bias", Shape{C}));
      ASSIGN_OR_RETURN(l.ln_2_weight, LoadTensor(*reader, whole, h + "ln_2.weight", Shape{C}));
      ASSIGN_OR_RETURN(l.ln_2_bias, LoadTensor(*reader, whole, h + "ln_2.bias", Shape{C}));
      ASSIGN_OR_RETURN(l.fc_weight_t, LoadTransposed(*reader, slicer, h + "mlp.c_fc.weight", Shape{C, F}, 1));
      ASSIGN_OR_RETURN(l.fc_bias, LoadTensor(*reader, slicer, h + "mlp.c_fc.bias", Shape{F}, 0));
      shard.Fl = l.fc_bias.shape()[0];
      ASSIGN_OR_RETURN(l.mlp_proj_weight_t, LoadTransposed(*reader, slicer, h + "mlp.c_proj.weight", Shape{F, C}, 0));
      ASSIGN_OR_RETURN(l.mlp_proj_bias, LoadTensor(*reader, whole, h + "mlp.c_proj.bias", Shape{C}));
      ASSIGN_OR_RETURN(l.k_cache, Tensor::Zeros(Shape{shard.Hl, P, D}, DType::kF32));
      ASSIGN_OR_RETURN(l.v_cache, Tensor::Zeros(Shape{shard.Hl, P, D}, DType::kF32));
      shard.layers.push_back(std::move(l));
    }
    if (shard.layers.empty()) shard.Fl = BalancedSplit(F, T, r).size;
    ASSIGN_OR_RETURN(shard.x, FlatBuffer(chunk * C));
    ASSIGN_OR_RETURN(shard.normed, FlatBuffer(chunk * C));
    ASSIGN_OR_RETURN(shard.mean, FlatBuffer(chunk));
    ASSIGN_OR_RETURN(shard.rstd, FlatBuffer(chunk));
    ASSIGN_OR_RETURN(shard.qkv, FlatBuffer(chunk * 3 * shard.Cl));
    ASSIGN_OR_RETURN(shard.q, FlatBuffer(chunk * shard.Cl));
    ASSIGN_OR_RETURN(shard.scores, FlatBuffer(shard.Hl * chunk * P));
    ASSIGN_OR_RETURN(shard.probs, FlatBuffer(shard.Hl * chunk * P));
    ASSIGN_OR_RETURN(shard.context_heads, FlatBuffer(chunk * shard.Cl));
    ASSIGN_OR_RETURN(shard.context, FlatBuffer(chunk * shard.Cl));
    ASSIGN_OR_RETURN(shard.projected, FlatBuffer(chunk * C));
    ASSIGN_OR_RETURN(shard.hidden, FlatBuffer(chunk * shard.Fl));
    s->shards.push_back(std::move(shard));
  }
  ASSIGN_OR_RETURN(s->logits, FlatBuffer(V));
  s->ranked.resize(static_cast<size_t>(V));
  return std::unique_ptr<Generator>(new Generator(std::move(s)));
}

absl::StatusOr<std::vector<float>> Generator::Logits(std::span<const int64_t> ids, int64_t tokens_per_step) {
  State& s = *state_;
  RETURN_IF_ERROR(CheckIds(ids, s.V, s.P, "input"));
  if (tokens_per_step < 1)
    return absl::InvalidArgumentError(StrCat("tokens_per_step must be >= 1, got ", tokens_per_step));
  RETURN_IF_ERROR(s.Prefill(ids, tokens_per_step));
  const float* logits = s.logits.data<float>();
  return std::vector<float>(logits, logits + s.V);
}

absl::StatusOr<Generation> Generator::Generate(std::span<const int64_t> prompt, const GenerateOptions& options) {
  State& s = *state_;
  RETURN_IF_ERROR(CheckOptions(options, s.V));
  RETURN_IF_ERROR(CheckIds(prompt, s.V, s.P, "prompt"));
  Generation out;
  if (options.max_new_tokens == 0) return out;
  RETURN_IF_ERROR(s.Prefill(prompt, s.chunk));
  const int64_t allowed = options.vocab_limit.value_or(s.V);
  auto sequence = static_cast<int64_t>(prompt.size());  // tokens so far, prompt included
  for (int64_t step = 0;; ++step) {
    if (step == options.max_new_tokens) {
      out.stop = StopReason::kMaxNewTokens;
      break;
    }
    if (sequence == s.P) {  // the next token would have no position
      out.stop = StopReason::kContextFull;
      break;
    }
    ASSIGN_OR_RETURN(const int64_t token, ChooseToken(s.logits.data<float>(), allowed, options, step, s.ranked));
    if (options.stop_token && token == *options.stop_token) {
      out.stop = StopReason::kStopToken;
      break;
    }
    out.ids.push_back(token);
    ++sequence;
    // Fed only if another token will be chosen: the last one costs no forward.
    if (step + 1 < options.max_new_tokens && sequence < s.P) {
      RETURN_IF_ERROR(s.Forward(std::span<const int64_t>(&out.ids.back(), 1), /*want_logits=*/true));
    }
  }
  return out;
}

const models::Gpt2Config& Generator::model_config() const { return state_->config; }
const fs::path& Generator::checkpoint_dir() const { return state_->dir; }
int64_t Generator::iteration() const { return state_->iteration; }
const nlohmann::json& Generator::run_config() const { return state_->run_config; }

absl::StatusOr<std::unique_ptr<data::Tokenizer>> LoadRunTokenizer(const nlohmann::json& run_config) {
  if (!run_config.is_object() || !run_config.contains("tokenization") || !run_config["tokenization"].is_object() ||
      !run_config["tokenization"].contains("tokenizer") || run_config["tokenization"]["tokenizer"].is_null()) {
    return absl::FailedPreconditionError(
        "the run's config names no tokenizer (tokenization.tokenizer is null): it trained on token ids only");
  }
  absl::StatusOr<TokenizationConfig> t = TokenizationKeys().Read(run_config["tokenization"]);
  if (!t.ok()) return absl::InvalidArgumentError(StrCat("the run's tokenization: ", t.status().message()));
  absl::StatusOr<data::TokenizerFiles> files = ConfiguredTokenizerFiles(*t);
  if (!files.ok()) return absl::InvalidArgumentError(StrCat("the run's ", files.status().message()));
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = data::LoadTokenizer(*files);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), StrCat("the run's tokenization: ", tokenizer.status().message()));
  }
  return std::move(*tokenizer);
}

absl::StatusOr<TextGeneration> GenerateText(const fs::path& path, std::string_view prompt,
                                            const TextGenerateOptions& options) {
  ASSIGN_OR_RETURN(const std::unique_ptr<Generator> generator, Generator::Open(path, options.generator));
  ASSIGN_OR_RETURN(const std::unique_ptr<data::Tokenizer> tokenizer, LoadRunTokenizer(generator->run_config()));
  if (tokenizer->vocab_size() > generator->vocab_size()) {
    return absl::FailedPreconditionError(StrCat("the run's ", tokenizer->kind(), " tokenizer has ",
                                                tokenizer->vocab_size(), " tokens, more than the model's ",
                                                generator->vocab_size(), " (model.vocab_size)"));
  }
  absl::StatusOr<std::vector<int64_t>> encoded = tokenizer->Encode(prompt);
  if (!encoded.ok()) return absl::Status(encoded.status().code(), StrCat("the prompt: ", encoded.status().message()));
  std::vector<int64_t> ids = *std::move(encoded);
  const std::optional<int64_t> end_of_text = tokenizer->EndOfDocumentId();
  // An empty prompt starts a new document, as GPT-2's unconditional samples do.
  if (ids.empty() && end_of_text) ids.push_back(*end_of_text);
  GenerateOptions generate = options.generate;
  generate.vocab_limit = std::min(generate.vocab_limit.value_or(tokenizer->vocab_size()), tokenizer->vocab_size());
  if (options.stop_at_end_of_text && !generate.stop_token) generate.stop_token = end_of_text;
  TextGeneration out;
  out.prompt_tokens = static_cast<int64_t>(ids.size());
  ASSIGN_OR_RETURN(out.generation, generator->Generate(ids, generate));
  ASSIGN_OR_RETURN(out.text, tokenizer->Decode(out.generation.ids));
  return out;
}

}  // namespace tessera
