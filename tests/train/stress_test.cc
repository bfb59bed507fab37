// Random graphs (linear layers with split weights, GELU, residual scales,
// transposes, dropout, reshapes) with random SBP hints on random device
// meshes (data, tensor and pipeline parallel, with and without
// micro-batches), their reshapes folded into views (LowerOptions::
// fold_reshapes) against a one-device run that copies them. The
// generator knows which trials are valid: every valid one must train with
// the one-device losses. A quarter of the trials carry a fault the generator
// planted (a hint outside the value's rank, a hint of the wrong length, more
// stages than layers, a world size that does not match the mesh, layers
// beyond pipeline_num_layers) and must fail with that fault's one-line error.
// Every run has a deadline (tests/deadline.h).
//
// The seed changes with every run and is printed; TESSERA_STRESS_SEED=<n>
// replays a run, TESSERA_STRESS_TRIALS=<n> changes the number of trials and
// TESSERA_STRESS_VERBOSE=1 prints every trial.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/text.h"
#include "graph/builder.h"
#include "tests/deadline.h"
#include "train/engine.h"

namespace tessera {
namespace {

constexpr int64_t kGlobalBatch = 12, kFeatures = 6, kIterations = 3;
constexpr int kDefaultTrials = 400;  // about 4 s in Release
// Layouts agree with one device up to float rounding in sums: measured over
// 4500 valid trials, at most 4.7e-7 relative. (The models are kept from
// diverging, which would amplify rounding: residual scales of 0.1.)
constexpr double kRtol = 5e-6;

// A mistake the generator plants in the parallel run, and the error it must
// give.
enum class Fault {
  kNone,
  kHintOutsideRank,
  kHintOfWrongLength,
  kMoreStagesThanLayers,
  kWrongWorldSize,
  kLayerBeyondPipeline
};
constexpr Fault kFaults[] = {Fault::kHintOutsideRank, Fault::kHintOfWrongLength, Fault::kMoreStagesThanLayers,
                             Fault::kWrongWorldSize, Fault::kLayerBeyondPipeline};

struct Trial {
  uint32_t graph_seed = 0;
  int64_t data = 1, tensor = 1, pipeline = 1, micro_batches = 1;
  int64_t layers = 2;               // what the graph has
  int64_t pipeline_num_layers = 2;  // what the mesh is told (= layers unless the fault says otherwise)
  int64_t world_size = 1;           // data x tensor x pipeline unless the fault says otherwise
  Fault fault = Fault::kNone;
  std::string expected_error;  // a substring of the fault's error
  // Sources and the Sink on a thread of their own (LowerOptions), as on
  // GPUs; drawn from graph_seed's bits, leaving the draws of later trials
  // as they were.
  bool feeds_on_copy_stream = false;

  std::string ToString() const {
    return StrCat("graph seed ", graph_seed, ", data ", data, " tensor ", tensor, " pipeline ", pipeline, " (world ",
                  world_size, "), ", micro_batches, " micro-batches, ", layers, " layers (pipeline_num_layers ",
                  pipeline_num_layers, ")", feeds_on_copy_stream ? ", feeds on the copy stream" : "",
                  fault == Fault::kNone ? "" : StrCat(", fault expecting '", expected_error, "'"));
  }
};

// Draws a layout (at most 12 devices: the run stays short on 2 cores) and,
// when `fault` is not kNone, plants it.
Trial Draw(std::mt19937& rng, Fault fault) {
  const auto draw = [&rng](uint32_t n) { return static_cast<int64_t>(1 + rng() % n); };
  Trial t;
  t.graph_seed = static_cast<uint32_t>(rng());
  t.feeds_on_copy_stream = ((t.graph_seed >> 7) & 1) != 0;
  do {
    t.data = draw(3);
    t.tensor = draw(3);
    t.pipeline = draw(3);
  } while (t.data * t.tensor * t.pipeline > 12);
  static constexpr int64_t kMicroBatches[] = {1, 2, 3, 4};  // divisors of the global batch
  t.micro_batches = kMicroBatches[rng() % 4];
  t.layers = std::max<int64_t>(2, t.pipeline) + static_cast<int64_t>(rng() % 2);
  t.world_size = t.data * t.tensor * t.pipeline;
  t.pipeline_num_layers = t.layers;
  t.fault = fault;
  switch (fault) {
    case Fault::kNone:
      break;
    case Fault::kHintOutsideRank:
      t.expected_error = "splits axis 2, outside the value's rank 2";
      break;
    case Fault::kHintOfWrongLength:
      t.expected_error = "needs 2 entries (data parallel, tensor parallel)";
      break;
    case Fault::kMoreStagesThanLayers:
      t.pipeline = std::min<int64_t>(t.pipeline, 2) + 1;
      t.layers = t.pipeline_num_layers = t.pipeline - 1;
      t.data = t.tensor = 1;
      t.world_size = t.pipeline;
      t.expected_error = StrCat("more pipeline stages (", t.pipeline, ") than layers (", t.layers, ")");
      break;
    case Fault::kWrongWorldSize:
      t.world_size += 1 + static_cast<int64_t>(rng() % 3);
      t.expected_error = t.world_size % (t.tensor * t.pipeline) != 0
                             ? "is not divisible by tensor parallel size"
                             : StrCat("devices, but the world size is ", t.world_size);
      break;
    case Fault::kLayerBeyondPipeline:
      t.pipeline = std::max<int64_t>(t.pipeline, 2);
      t.world_size = t.data * t.tensor * t.pipeline;
      t.layers = t.pipeline + 1;
      t.pipeline_num_layers = t.layers - 1;
      t.expected_error =
          StrCat("layer_idx ", t.layers - 1, " is outside the ", t.pipeline_num_layers, " pipeline layers");
      break;
  }
  return t;
}

// The same random model for every layout: hints (and the planted hint
// faults) only where `parallel`, and a graph of micro-batch rows.
absl::StatusOr<graph::Graph> BuildRandom(const Trial& t, int64_t batch, bool parallel) {
  std::mt19937 rng(t.graph_seed);
  const auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  const Sbp choices[] = {Sbp::Broadcast(), Sbp::Split(0), Sbp::Split(1)};
  graph::GraphBuilder b;
  graph::Sym h = b.Input("x", {DType::kF32, Shape{batch, kFeatures}});
  int64_t width = kFeatures;
  bool trains = false;  // a variable drawn
  const auto dropout = [&](const graph::Sym& x, int64_t tensor_id) {
    return b.Apply("dropout", {x}, {{"rate", 0.1 * (1 + pick(3))}, {"seed", int64_t{7}}, {"tensor_id", tensor_id}});
  };
  for (int64_t layer = 0; layer < t.layers; ++layer) {
    auto scope = b.Scope(StrCat("l", layer), layer);
    for (int op = 0; op < 2; ++op) {
      const int kind = pick(9);
      switch (kind) {
        case 0:
        case 1:
        case 8: {  // linear with a randomly split weight
          const int64_t out = 3 + pick(5);
          graph::VariableOptions options;
          const Sbp split = choices[pick(3)];  // drawn either way: the same graph hinted or not
          if (parallel) options.sbp = NdSbp{Sbp::Broadcast(), split};
          trains = true;
          graph::Sym w = b.Variable(
              StrCat("w", op), Shape{width, out},
              graph::InitRule::Normal(0, 0.3, static_cast<int64_t>(t.graph_seed % 100000), layer * 10 + op), options);
          if (kind == 8) {
            // Through reshapes, which the parallel run folds into their
            // readers (views of the input register, no copy; the one-device
            // run copies): a dropout reads a view (its draws by the view's
            // positions), a chain of two folds into one, and the matmul's
            // gradient reads its view in the backward.
            h = graph::Reshape(dropout(graph::Reshape(h, Shape{batch, width, 1}), layer * 10 + op),
                               Shape{batch, 1, width});
            h = graph::Reshape(h, Shape{batch, width});
          }
          h = graph::Matmul(h, w);
          width = out;
          break;
        }
        case 2:
          h = graph::Gelu(h, "tanh");
          break;
        case 3: {  // residual through a scale
          trains = true;
          graph::Sym s = b.Variable(StrCat("s", op), Shape{width}, graph::InitRule::Constant(0.1));
          h = h + h * s;
          break;
        }
        case 4:
          h = graph::Transpose(graph::Tanh(graph::Transpose(h, {1, 0})), {1, 0});
          break;
        case 5:  // dropout: its mask must not depend on the layout or the micro-batching
          h = dropout(h, layer * 10 + op);
          break;
        default:
          // Dropout of the transposed value (the batch on axis 1): under
          // micro-batching its draws move along axis 1 (the scheduler's
          // InferMicroLayouts), so the mask does not depend on m.
          h = graph::Transpose(dropout(graph::Transpose(h, {1, 0}), layer * 10 + op), {1, 0});
          break;
      }
      const bool hint = pick(6) == 0;
      const NdSbp layout{choices[pick(2)], choices[pick(3)]};
      if (parallel && hint) b.SetHints(h, std::nullopt, layout);
    }
  }
  if (parallel && t.fault == Fault::kHintOutsideRank) {
    b.SetHints(h, std::nullopt, NdSbp{Sbp::Broadcast(), Sbp::Split(2)});
  }
  if (parallel && t.fault == Fault::kHintOfWrongLength) {
    b.SetHints(h, std::nullopt, NdSbp{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::Broadcast()});
  }
  {
    auto scope = b.Scope("loss", t.layers - 1);
    // A graph that drew no weight trains one here (a loss of no trainable
    // variable is refused: it would train nothing).
    if (!trains) h = h * b.Variable("gain", Shape{width}, graph::InitRule::Constant(1.0));
    b.MarkLoss(graph::ReduceMean(h * h));
  }
  return b.Finish();
}

// The losses of kIterations iterations: on one device without micro-batches
// (!parallel) or in the trial's layout.
absl::StatusOr<std::vector<double>> Train(const Trial& t, bool parallel) {
  const int64_t m = parallel ? t.micro_batches : 1;
  ASSIGN_OR_RETURN(graph::Graph graph, BuildRandom(t, kGlobalBatch / m, parallel));
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kSgd;
  options.optimizer.momentum = 0.5;
  options.num_micro_batches = m;
  options.stall_timeout_s = 15;
  // One intra-op thread per device: a trial has up to 12 devices on a few cores.
  options.intra_op_threads = 1;
  if (parallel) {
    options.lower.parallel.data = t.data;
    options.lower.parallel.tensor = t.tensor;
    options.lower.parallel.pipeline = t.pipeline;
    options.lower.parallel.world_size = t.world_size;
    options.lower.parallel.pipeline_num_layers = t.pipeline_num_layers;
    options.lower.feeds_on_copy_stream = t.feeds_on_copy_stream;
  } else {
    options.lower.fold_reshapes = false;  // the reference copies every reshape
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Compile(std::move(graph), options));
  std::vector<double> losses(kIterations, NAN);
  const auto feed = [](int64_t it, int64_t micro, std::string_view input, const Tensor& out) -> absl::Status {
    const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
    for (int64_t i = 0; i < out.NumElements(); ++i) {
      const int64_t row = micro * rows + (rows > 0 ? i / kFeatures : 0);
      out.data<float>()[i] = input == "lr"
                                 ? 0.05f
                                 : std::sin(0.7f * static_cast<float>(row) + 0.3f * static_cast<float>(i % kFeatures) +
                                            static_cast<float>(it));
    }
    return absl::OkStatus();
  };
  const auto fetch = [&losses](int64_t it, const std::map<std::string, Tensor>& values) {
    losses[static_cast<size_t>(it)] = values.at("loss").ToVector<float>().at(0);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(engine->Run(kIterations, feed, fetch));
  return losses;
}

// A non-negative integer from the environment, or `fallback`.
uint64_t FromEnvironment(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  if (*end != '\0') {
    ADD_FAILURE() << name << "=" << value << " is not a non-negative integer";
    return fallback;
  }
  return parsed;
}

TEST(Stress, ValidLayoutsTrainLikeOneDeviceAndPlantedFaultsFailClearly) {
  const uint64_t time_seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  const uint64_t seed = FromEnvironment("TESSERA_STRESS_SEED", time_seed % 1'000'000'007);
  const auto trials = static_cast<int>(FromEnvironment("TESSERA_STRESS_TRIALS", kDefaultTrials));
  const bool verbose = std::getenv("TESSERA_STRESS_VERBOSE") != nullptr;
  std::printf("stress: seed %llu (replay with TESSERA_STRESS_SEED=%llu), %d trials\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed), trials);
  std::fflush(stdout);
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  int trained = 0, refused = 0;
  double worst = 0;
  for (int trial = 0; trial < trials; ++trial) {
    // Every fourth trial carries a fault, each kind in turn.
    const Fault fault = trial % 4 == 3 ? kFaults[(trial / 4) % std::size(kFaults)] : Fault::kNone;
    const Trial t = Draw(rng, fault);
    const std::string what = StrCat("trial ", trial, " of seed ", seed, ": ", t.ToString());
    SCOPED_TRACE(what);
    if (verbose) std::printf("%s\n", what.c_str());
    absl::StatusOr<std::vector<double>> expected, losses;
    {
      ::tessera::testing::Deadline deadline(std::chrono::seconds(60), "the one-device run of " + what);
      expected = Train(t, false);
    }
    ASSERT_TRUE(expected.ok()) << expected.status();
    {
      ::tessera::testing::Deadline deadline(std::chrono::seconds(60), "the parallel run of " + what);
      losses = Train(t, true);
    }
    if (t.fault != Fault::kNone) {
      ASSERT_FALSE(losses.ok()) << "the planted fault was accepted";
      const std::string message(losses.status().message());
      EXPECT_NE(message.find(t.expected_error), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_EQ(losses.status().code(), absl::StatusCode::kInvalidArgument) << message;
      ++refused;
      continue;
    }
    ASSERT_TRUE(losses.ok()) << losses.status();
    ++trained;
    for (size_t i = 0; i < losses->size(); ++i) {
      const double difference = std::abs((*losses)[i] - (*expected)[i]) / std::max(std::abs((*expected)[i]), 1e-6);
      worst = std::max(worst, difference);
      EXPECT_LE(difference, kRtol) << "iteration " << i << ": " << (*losses)[i] << " vs one device " << (*expected)[i];
    }
  }
  std::printf(
      "stress: %d valid layouts trained with the one-device losses (largest relative difference %.3g), "
      "%d planted faults refused with their errors\n",
      trained, worst, refused);
}

}  // namespace
}  // namespace tessera
