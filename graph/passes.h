#pragma once
// Graph passes (DESIGN §6): dead-code elimination, autodiff, fusions,
// mixed precision, loss scaling, activation checkpointing, gradient
// accumulation, ZeRO 3's gathers, gradient buckets and the optimizer. Each
// rewrites a Graph in place (appending nodes, removing them, or rebuilding
// it); none keeps state between calls. train/engine.cc runs them for
// training in this order, each where it applies: FuseBiasDropoutAdd ->
// AutoMixedPrecision -> ScaleLoss -> Autodiff -> FoldCastRoundTrips ->
// FoldAddsIntoProducers -> RecomputeSegments -> AccumulateGradients ->
// GatherPerReader -> BucketGradients -> UnscaleGradients -> ApplyOptimizer
// -> EliminateDeadCode.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace tessera::graph {

// Removes every node that no root needs. Roots: losses, fetches, variable
// updates (both the variable and its new value). Graph inputs are the feed
// interface and are always kept. Returns old value id -> new value id
// (kNoValue for removed values); ids held by callers must be remapped.
absl::StatusOr<std::vector<ValueId>> EliminateDeadCode(Graph& graph);

// variable value -> its gradient value (same meta).
using GradientMap = std::map<ValueId, ValueId>;

struct AutodiffOptions {
  // Values to differentiate with respect to; empty = every trainable variable.
  // Values that the loss does not depend on through differentiable inputs
  // get no entry.
  std::vector<ValueId> wrt = {};
};

// Appends the backward graph of `loss` (a scalar) and returns the gradients.
// The seed is ones of the loss's shape; every op on a path from a wrt value to
// the loss has its gradient rule called through a symbolic GradEmitter, and
// several contributions to one value are summed with `add`. Inputs declared
// non-differentiable (labels, ids, masks) get nothing. Errors: a non-scalar
// loss; an op on such a path without a gradient rule (named with its node);
// a rule that fails (named). Backward nodes copy the forward node's
// layer_idx, are marked Node::backward, and their scope is
// "grad/<forward scope>" (for people: passes go by the flag).
absl::StatusOr<GradientMap> Autodiff(Graph& graph, ValueId loss, const AutodiffOptions& options = {});
// The same for the graph's single marked loss.
absl::StatusOr<GradientMap> Autodiff(Graph& graph, const AutodiffOptions& options = {});

struct RecomputeResult {
  GradientMap gradients;       // the same pairs, in the new graph's ids
  int64_t segments = 0;        // segments recomputed in backward
  std::vector<ValueId> remap;  // old value id -> new value id
};

// Activation checkpointing (graph/passes/recompute.cc): after Autodiff, every
// recomputable segment (Node::checkpoint_segment, a transformer layer) whose
// values backward reads is computed again in backward, started by a
// gradient reaching it, and backward reads the recomputed values; only what
// leaves a segment (its output) is kept from forward. Same ops, attributes
// and order: the losses are bit-identical. Errors: a segment read in
// backward before any gradient reaches it; a graph already accumulated.
// For passes that replay a graph into a new one (nodes are only ever
// appended): adds input or variable node `n` of `from` to `out` as it was
// (name, meta, init, hints, layer, scope) and returns its value there.
absl::StatusOr<ValueId> ReplayLeaf(const Graph& from, const Node& n, Graph& out);
// The options that give a replayed node `n`'s layer, scope, name of its first
// output, backward flag and checkpoint segment.
NodeOptions ReplayOptions(const Graph& from, const Node& n);
// `at` on the pipeline layer of variable `var` (where its update runs), for
// the per-variable ops on its gradient between backward and the update.
NodeOptions OnVariablesStage(const Graph& graph, ValueId var, NodeOptions at);
// Marks in `out` the losses, fetches and variable updates of `from`, through
// `remap` (old value id -> id in `out`).
absl::Status ReplayMarks(const Graph& from, const std::vector<ValueId>& remap, Graph& out);
// `gradients` (variable -> gradient) through `remap`, both sides.
GradientMap RemapGradients(const GradientMap& gradients, const std::vector<ValueId>& remap);
// Adds node `n` of `from` (any kind) to `out` as it was, reading `inputs`
// (ids in `out`), with its outputs' hints; records its outputs' new ids in
// `remap` (old value id -> id in `out`).
absl::Status ReplayNode(const Graph& from, const Node& n, const std::vector<ValueId>& inputs, Graph& out,
                        std::vector<ValueId>& remap);

// Whether two layer indices (Node::layer_idx) run on the same pipeline stage.
using SameStageFn = std::function<bool(int64_t layer_a, int64_t layer_b)>;
// `same_stage` null: one stage.
absl::StatusOr<RecomputeResult> RecomputeSegments(Graph& graph, const GradientMap& gradients,
                                                  const SameStageFn& same_stage = {});

// The terms of a sum `v`: the leaves of its tree of `add`s of one shape
// and dtype (the autodiff sums a value's contributions with a chain of
// adds), first input's first; {v} when v is no such add. Empty when there
// would be more than kMaxSumTerms (adds form a DAG: y = x + x repeated
// doubles the leaves).
inline constexpr size_t kMaxSumTerms = 64;
std::vector<ValueId> SumTerms(const Graph& graph, ValueId v);

struct AccumulationResult {
  GradientMap gradients;       // variable -> mean of its m micro-batch gradients
  std::vector<ValueId> remap;  // old value id -> new value id (the graph is rebuilt)
};

// Gradient accumulation over `num_micro_batches` (m) micro-batches, for a
// graph built at micro-batch size with its gradients from Autodiff: inserts
// `repeat` after every variable that ops read (all of those reads now go
// through it) and, for each gradient, `acc` followed by a 1/m scale, so the
// result is the gradient of the mean loss over the global batch (DESIGN §4:
// loss normalisation is by the global batch). Losses and fetches computed
// per micro-batch are replaced by their mean over the m micro-batches (acc
// and a 1/m scale), so they are iteration values again; remap maps them to
// the micro-batch values. The graph is rebuilt, so every id changes: use
// `remap`. m = 1 changes nothing.
// Over pipeline stages (`same_stage` on layers; null: one stage), a variable
// read on several stages gets one repeat per stage, on it (it crosses to a
// stage once per iteration, not per micro-batch), and a gradient that the
// autodiff summed across stages (a tied embedding's) is accumulated on each
// stage, the stages' sums added once per iteration on the variable's stage.
// `root_scaled`: the autodiff's root was the loss times 1/m already (the
// engine's scalar_mul, under fp16 before the loss scale), so the gradients
// are summed, not scaled after: each micro-batch's backward then sees the
// upstream values a run of the whole batch sees, which under 16-bit
// autocasting rounds alike.
absl::StatusOr<AccumulationResult> AccumulateGradients(Graph& graph, const GradientMap& gradients,
                                                       int64_t num_micro_batches, const SameStageFn& same_stage = {},
                                                       bool root_scaled = false);

struct CastRoundTripResult {
  int64_t folded = 0;          // round trips taken out (and casts folded into their producer)
  int64_t merged = 0;          // casts that repeated an earlier one
  int64_t widened = 0;         // readers that now widen a 16-bit value themselves
  GradientMap gradients;       // the gradients, through remap
  std::vector<ValueId> remap;  // old value id -> new value id (the graph is rebuilt)
};

// After autodiff under mixed precision (graph/passes/cast_round_trips.cc):
// a cast whose input is a cast from its own dtype, f32 -> bf16/f16 -> f32
// (the rounding skipped) or 16-bit -> f32 -> 16-bit (exact), is taken out
// and its readers read the first cast's input, when nothing else reads the
// value between (nor marks it). Autodiff makes such a pair for every
// matmul's input gradient: the product in f32, cast to the input's type,
// and the AMP cast's gradient back to f32. Gradients keep f32 there. The
// exact direction may have reshapes between and other readers of the f32
// value (the fused attention's 16-bit dq, dk, dv, cast to f32, reshaped,
// and cast back for the projection's GEMMs): the last cast's readers read
// the reshapes of the 16-bit value. A cast to a 16-bit type that is the
// only reader of an f32 output its op can give in that type
// (cross_entropy_partials_grad's dlogits) folds into the op. A reduce_sum
// of a 16-bit value cast to f32 (behind reshapes) sums the 16-bit value,
// widening it itself: the same bits (the bias's gradient of the fused
// attention's dq, dk, dv). Casts of one
// value to one type on the same layer (and pass, and checkpoint segment)
// become one. The graph is rebuilt: use `remap`.
absl::StatusOr<CastRoundTripResult> FoldCastRoundTrips(Graph& graph, const GradientMap& gradients);

struct BiasDropoutAddResult {
  int64_t fused = 0;           // bias_add (-> dropout) -> add chains made one bias_dropout_add
  std::vector<ValueId> remap;  // old value id -> new value id (empty when nothing fused)
};

// On the forward graph, before autodiff (graph/passes/bias_dropout_add.cc):
// add(residual, dropout(bias_add(x, bias))), or without the dropout, whose
// intermediate values nothing else reads (nor marks, nor hints), on one
// layer and checkpoint segment, becomes bias_dropout_add(x, bias, residual)
// with the dropout's attributes (rate 0 without one): the same operations in
// the same order, so the same bits, in one pass over the tensor instead of
// three. The add's output keeps its id's hints; the graph is rebuilt when
// anything fused: use `remap`.
absl::StatusOr<BiasDropoutAddResult> FuseBiasDropoutAdd(Graph& graph);

struct AddFoldResult {
  int64_t folded = 0;          // adds now done by the op that makes one of their terms
  GradientMap gradients;       // the gradients, through remap
  std::vector<ValueId> remap;  // old value id -> new value id
};

// After autodiff (graph/passes/add_folds.cc): add(t, c) where the term t
// has no other live reader (nor is marked, hinted or a gradient) and its op
// is in the add's pass and checkpoint segment becomes that op adding c
// itself, the same bits as the add: a matmul's product on the add's layer
// becomes matmul_add(a, b, c) there (the GEMM's epilogue; q, k and v's
// input gradients, summed term by term), a layer_norm_grad's dx becomes
// layer_norm_grad_add(..., c) on the layer norm's layer when c exists
// before it (the residual stream's gradient). Over pipeline stages
// (`same_stage`; null: one stage) a product does not fold a term made on
// another stage (AccumulateGradients sums those per stage). The graph is
// rebuilt when anything folds: use `remap`.
absl::StatusOr<AddFoldResult> FoldAddsIntoProducers(Graph& graph, const GradientMap& gradients,
                                                    const SameStageFn& same_stage = {});

struct MixedPrecisionResult {
  int64_t ops = 0;             // ops that now read low-precision inputs
  std::vector<ValueId> remap;  // old value id -> new value id (the graph is rebuilt)
};

// Automatic mixed precision (graph/passes/amp.cc), on the forward graph
// before autodiff: every matmul and batch_matmul (attention's products
// included), matmul_bias_gelu and the fused attention (q, k, v; not its
// mask) reads each f32 input through its own cast to `low` (bf16 or f16)
// and still yields f32; every other op (softmax, norms, losses,
// reductions, the optimizer) stays f32, and so do the variables (the f32
// master weights the optimizer updates): their gradients come back through
// the casts as f32.
absl::StatusOr<MixedPrecisionResult> AutoMixedPrecision(Graph& graph, DType low);

struct GatherPerReaderResult {
  GradientMap gradients;       // the same pairs, in the new graph's ids
  int64_t copies = 0;          // depend copies added
  std::vector<ValueId> remap;  // old value id -> new value id (the graph is rebuilt)
};

// ZeRO-3 (graph/passes/zero.cc), after gradient accumulation and before the
// optimizer: every op that reads a trained variable (a key of `gradients`,
// or its repeat) together with some other input reads it through its own
// depend(variable, first other input). Under ZeRO-3's layouts
// (scheduler::SbpInferOptions::zero_stage) each such copy is the shard,
// gathered for that reader alone once its other input exists (the layer's
// activation in forward, its output gradient in backward) and freed after
// it: no reader holds the whole variable longer than it needs. The values
// computed are unchanged.
absl::StatusOr<GatherPerReaderResult> GatherPerReader(Graph& graph, const GradientMap& gradients);

struct BucketResult {
  int64_t buckets = 0;    // buckets of two or more gradients
  int64_t gradients = 0;  // gradients in them
};

// Gradient buckets (graph/passes/buckets.cc), after accumulation and before
// the optimizer: the f32 gradients smaller than `bucket_bytes`, in the
// order backward computes them, are grouped into buckets of at most
// `bucket_bytes` on one pipeline stage (`same_stage` on their variables'
// layers; null: one stage); each bucket of two or more is flattened and
// joined, held in layout `reduced` (a hint on a depend of it: B over data
// parallelism, so its partial sums are all-reduced once, as soon as the
// bucket's last gradient exists, while backward goes on) and split back,
// and `gradients` maps each variable to its piece. For layouts where every
// gradient is reduced to `reduced` (data and pipeline parallelism without
// ZeRO or tensor parallelism). bucket_bytes <= 0: nothing.
absl::StatusOr<BucketResult> BucketGradients(Graph& graph, GradientMap& gradients, int64_t bucket_bytes,
                                             const NdSbp& reduced, const SameStageFn& same_stage = {});

enum class OptimizerKind : uint8_t { kSgd, kAdamW };

// Hyper-parameters follow torch.optim.SGD / torch.optim.AdamW and
// torch.nn.utils.clip_grad_norm_.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  bool nesterov = false;
  // AdamW (t = the iteration's step + 1, from the runtime)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool bias_correction = true;
  // Global-norm clipping: unset = none. grad *= min(1, max_norm / (norm + 1e-6)).
  std::optional<double> clip_grad_max_norm = std::nullopt;
  // p of the norm: (Σ |g|^p)^(1/p) over every gradient element, p > 0, or
  // +infinity for max |g| (torch's norm_type).
  double clip_grad_norm_type = 2.0;
  // Variables whose name contains one of these (case-insensitively) get no
  // weight decay, unless their VariableInfo::weight_decay says otherwise
  // (LiBai excludes biases and norm parameters; "norm" matches BERT's
  // LayerNorm, "ln_" Hugging Face GPT-2's ln_1 / ln_f).
  std::vector<std::string> no_weight_decay_patterns = {"bias", "norm", "ln_"};
  // The graph input that feeds the learning rate (f32 scalar) per iteration;
  // created when absent.
  std::string lr_input_name = "lr";
};

struct OptimizerResult {
  ValueId lr = kNoValue;         // the learning-rate graph input
  ValueId grad_norm = kNoValue;  // global gradient p-norm (before clipping) when clipping; fetched as "grad_norm"
  // variable -> its state variables (SGD: momentum buffer, none at momentum
  // 0; AdamW: m, v).
  std::map<ValueId, std::vector<ValueId>> state;
};

// Whether weight decay applies to `variable` under `options` (per-variable
// flag first, then the name patterns).
bool WeightDecayApplies(const Graph& graph, ValueId variable, const OptimizerOptions& options);

// For every (variable, gradient) pair: optional global-norm clipping of all
// gradients together, then one sgd_update / adamw_update node whose new
// parameter and new state are set as the variables' updates. State variables
// ("<name>.momentum" (SGD at momentum > 0), "<name>.adam_m", "<name>.adam_v")
// are non-trainable and start at zero. `skip`, when given (a one-element f32 value), is every
// update's input after lr: nonzero leaves the variables and their state as
// they were (a step dynamic loss scaling skips); `skipped` (with skip;
// AdamW only) the steps skipped before, which its bias correction leaves out.
absl::StatusOr<OptimizerResult> ApplyOptimizer(Graph& graph, const GradientMap& gradients,
                                               const OptimizerOptions& options, ValueId skip = kNoValue,
                                               ValueId skipped = kNoValue);

struct LossScaleOptions {
  double initial_scale = 65536;
  int64_t growth_interval = 2000;
};

struct LossScaleResult {
  ValueId scaled_loss = kNoValue;  // what autodiff differentiates: loss x scale
  ValueId scale = kNoValue;        // the non-trainable variable "amp.loss_scale"
  ValueId good_steps = kNoValue;   // its state "amp.loss_scale_good_steps"
  ValueId skipped_steps = kNoValue;  // "amp.skipped_steps": steps skipped so far (AdamW's t leaves them out)
};

struct UnscaleResult {
  ValueId skip = kNoValue;   // found_inf: ApplyOptimizer's skip
  ValueId skipped = kNoValue;  // skipped_steps as this iteration reads it: ApplyOptimizer's skipped
};

// Dynamic loss scaling for fp16 mixed precision (graph/passes/loss_scale.cc).
// ScaleLoss, before autodiff: the loss times a scale variable, to
// differentiate instead of the loss (which stays the reported loss). Under
// gradient accumulation the loss given is already the micro-batch's times
// 1/m (the engine's): its fp16 gradients are then as large as the whole
// batch's in one pass, so a step overflows (and is skipped) at the same
// scale whatever the micro-batching, pipelines included.
absl::StatusOr<LossScaleResult> ScaleLoss(Graph& graph, ValueId loss, const LossScaleOptions& options);
// UnscaleGradients, after accumulation and before ApplyOptimizer: every
// gradient divided by the scale; returns found_inf (1 when any unscaled
// gradient holds a NaN or an infinity, fetched as "skipped", the scale as
// "loss_scale") for ApplyOptimizer's skip and the steps skipped so far for
// its skipped, and sets the scale's update (loss_scale_update: halve on
// found_inf, double after growth_interval clean steps) and the count's
// (one more when skipped). `scaled` in the graph's current ids.
absl::StatusOr<UnscaleResult> UnscaleGradients(Graph& graph, GradientMap& gradients, const LossScaleResult& scaled,
                                               const LossScaleOptions& options);

}  // namespace tessera::graph
