// Random graphs with random SBP hints on random device meshes (data, tensor
// and pipeline parallel, with and without micro-batches): each one either
// trains with the one-device losses or fails with a one-line error naming
// what is wrong — it never hangs (every run has a deadline).

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/text.h"
#include "graph/builder.h"
#include "train/engine.h"

namespace tessera {
namespace {

struct Trial {
  uint32_t seed;
  int64_t data, tensor, pipeline, micro_batches;
};

constexpr int64_t kGlobalBatch = 12, kFeatures = 6, kIterations = 3;

// The same random model for every layout; hints only where `hinted`.
absl::StatusOr<graph::Graph> BuildRandom(uint32_t seed, int64_t batch, int64_t layers, bool hinted) {
  std::mt19937 rng(seed);
  const auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  const Sbp choices[] = {Sbp::Broadcast(), Sbp::Split(0), Sbp::Split(1)};
  graph::GraphBuilder b;
  graph::Sym h = b.Input("x", {DType::kF32, Shape{batch, kFeatures}});
  int64_t width = kFeatures;
  for (int64_t layer = 0; layer < layers; ++layer) {
    auto scope = b.Scope(StrCat("l", layer), layer);
    for (int op = 0; op < 2; ++op) {
      switch (pick(5)) {
        case 0:
        case 1: {  // linear with a randomly split weight
          const int64_t out = 3 + pick(5);
          graph::VariableOptions options;
          const Sbp split = choices[pick(3)];  // drawn either way: the same graph hinted or not
          if (hinted) options.sbp = NdSbp{Sbp::Broadcast(), split};
          graph::Sym w = b.Variable(StrCat("w", op), Shape{width, out},
                                    graph::InitRule::Normal(0, 0.3, static_cast<int64_t>(seed % 100000), layer * 10 + op), options);
          h = graph::Matmul(h, w);
          width = out;
          break;
        }
        case 2:
          h = graph::Gelu(h, "tanh");
          break;
        case 3: {  // residual through a scale
          graph::Sym s = b.Variable(StrCat("s", op), Shape{width}, graph::InitRule::Constant(0.9));
          h = h + h * s;
          break;
        }
        default:
          h = graph::Transpose(graph::Tanh(graph::Transpose(h, {1, 0})), {1, 0});
          break;
      }
      const bool hint = pick(6) == 0;
      const NdSbp layout{choices[pick(2)], choices[pick(3)]};
      if (hinted && hint) b.SetHints(h, std::nullopt, layout);
    }
  }
  {
    auto scope = b.Scope("loss", layers - 1);
    b.MarkLoss(graph::ReduceMean(h * h));
  }
  return b.Finish();
}

absl::StatusOr<std::vector<double>> Train(const Trial& t, bool parallel) {
  const int64_t layers = std::max<int64_t>(2, t.pipeline);
  const int64_t m = parallel ? t.micro_batches : 1;
  ASSIGN_OR_RETURN(graph::Graph graph, BuildRandom(t.seed, kGlobalBatch / m, layers, parallel));
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kSgd;
  options.optimizer.momentum = 0.5;
  options.num_micro_batches = m;
  options.stall_timeout_s = 15;
  if (parallel) {
    options.lower.parallel.data = t.data;
    options.lower.parallel.tensor = t.tensor;
    options.lower.parallel.pipeline = t.pipeline;
    options.lower.parallel.world_size = t.data * t.tensor * t.pipeline;
    options.lower.parallel.pipeline_num_layers = layers;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Compile(std::move(graph), options));
  std::vector<double> losses(kIterations, NAN);
  const auto feed = [m](int64_t it, int64_t micro, std::string_view input, const Tensor& out) -> absl::Status {
    const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
    for (int64_t i = 0; i < out.NumElements(); ++i) {
      const int64_t row = micro * rows + (rows > 0 ? i / kFeatures : 0);
      out.data<float>()[i] = input == "lr" ? 0.05f : std::sin(0.7f * static_cast<float>(row) + 0.3f * static_cast<float>(i % kFeatures) +
                                                            static_cast<float>(it));
    }
    (void)m;
    return absl::OkStatus();
  };
  const auto fetch = [&losses](int64_t it, const std::map<std::string, Tensor>& values) {
    losses[static_cast<size_t>(it)] = values.at("loss").ToVector<float>().at(0);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(engine->Run(kIterations, feed, fetch));
  return losses;
}

TEST(Stress, RandomGraphsRunOrFailClearlyNeverHang) {
  std::mt19937 rng(2026);
  int ran = 0, failed = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const auto draw = [&rng](uint32_t n) { return static_cast<int64_t>(1 + rng() % n); };
    const uint32_t seed = static_cast<uint32_t>(rng());
    const int64_t data = draw(2), tensor = draw(3), pipeline = draw(2), micro = draw(2);
    const Trial t{seed, data, tensor, pipeline, micro};
    SCOPED_TRACE(StrCat("trial ", trial, ": seed ", t.seed, " data ", t.data, " tensor ", t.tensor, " pipeline ", t.pipeline,
                        " micro-batches ", t.micro_batches));
    auto reference = std::async(std::launch::async, [&t] { return Train(t, false); });
    ASSERT_EQ(reference.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "one-device run hangs";
    auto expected = reference.get();
    ASSERT_TRUE(expected.ok()) << expected.status();
    auto run = std::async(std::launch::async, [&t] { return Train(t, true); });
    ASSERT_EQ(run.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "parallel run hangs";
    auto losses = run.get();
    if (!losses.ok()) {
      ++failed;
      const std::string message(losses.status().message());
      if (std::getenv("TESSERA_STRESS_VERBOSE") != nullptr) std::printf("refused: %s\n", message.c_str());
      EXPECT_FALSE(message.empty());
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_NE(losses.status().code(), absl::StatusCode::kDeadlineExceeded) << message;
      EXPECT_NE(losses.status().code(), absl::StatusCode::kInternal) << message;
      continue;
    }
    ++ran;
    for (size_t i = 0; i < losses->size(); ++i) {
      EXPECT_NEAR((*losses)[i], (*expected)[i], 1e-4 * std::abs((*expected)[i]) + 1e-6) << "iteration " << i;
    }
  }
  std::printf("stress: %d layouts trained with the one-device losses, %d refused with an error\n", ran, failed);
  EXPECT_GT(ran, 12);
}

}  // namespace
}  // namespace tessera
