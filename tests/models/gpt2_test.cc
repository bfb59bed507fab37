// models.GPT2: Hugging Face parameter names and shapes, the SBP hints and
// layer_idx of every parameter, layout-invariant synthetic data, the first
// loss against a plain-loop GPT-2, determinism, and training through the
// engine and the trainer.
// Shapes: B batch, T sequence, C hidden, H heads, F MLP hidden, V vocabulary,
// P positions, L layers.

#include "models/gpt2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/config.h"
#include "graph/passes.h"
#include "nn/module.h"
#include "scheduler/mesh.h"
#include "scheduler/sbp_infer.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/nn/reference.h"
#include "train/engine.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera::models {
namespace {

using ::tessera::nn::testing::Add;
using ::tessera::nn::testing::AttentionRef;
using ::tessera::nn::testing::Floats;
using ::tessera::nn::testing::LayerNormRef;
using ::tessera::nn::testing::MlpRef;

std::string Source(const std::string& rel) { return std::string(TESSERA_SOURCE_DIR) + "/" + rel; }

nlohmann::json NanoConfig(const std::vector<std::string>& overrides = {}) {
  auto config = LoadJobConfig(Source("configs/gpt2_nano.json"), overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::unique_ptr<Model> MakeModel(const nlohmann::json& model_node) {
  auto model = Gpt2::FromJson(model_node);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// A small GPT-2 config node for the reference comparisons.
nlohmann::json SmallModel(double dropout) {
  return {{"_target_", "models.GPT2"}, {"vocab_size", 37},  {"hidden_size", 16},
          {"num_layers", 2},           {"num_attention_heads", 4}, {"max_seq_length", 12},
          {"seq_length", 7},           {"embedding_dropout_prob", dropout}, {"attention_dropout_prob", dropout},
          {"output_dropout_prob", dropout}, {"init_seed", 5}, {"data_seed", 3}, {"dropout_seed", 9}};
}

Tensor Fill(const Model& model, int64_t iteration, const std::string& input, int64_t batch, int64_t T) {
  Tensor t = *Tensor::Zeros(Shape{batch, T}, DType::kI64);
  const absl::Status s = model.FillBatch(iteration, input, t);
  EXPECT_TRUE(s.ok()) << s;
  return t;
}

TEST(Gpt2, ParametersAreHuggingFaceGpt2s) {
  const nlohmann::json config = NanoConfig();
  std::unique_ptr<Model> model = MakeModel(config["model"]);
  ASSERT_NE(model, nullptr);
  auto graph = model->BuildGraph(4);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const int64_t V = 256, C = 64, P = 32, F = 256, L = 2;
  std::map<std::string, Shape> want = {{"wte.weight", {V, C}}, {"wpe.weight", {P, C}},
                                       {"ln_f.weight", {C}},   {"ln_f.bias", {C}}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    want[h + "ln_1.weight"] = {C};
    want[h + "ln_1.bias"] = {C};
    want[h + "attn.c_attn.weight"] = {C, 3, C};  // HF's (C, 3C), same bytes
    want[h + "attn.c_attn.bias"] = {3, C};       // HF's (3C)
    want[h + "attn.c_proj.weight"] = {C, C};
    want[h + "attn.c_proj.bias"] = {C};
    want[h + "ln_2.weight"] = {C};
    want[h + "ln_2.bias"] = {C};
    want[h + "mlp.c_fc.weight"] = {C, F};
    want[h + "mlp.c_fc.bias"] = {F};
    want[h + "mlp.c_proj.weight"] = {F, C};
    want[h + "mlp.c_proj.bias"] = {C};
  }
  std::map<std::string, Shape> got;
  int64_t numel = 0;
  for (graph::ValueId id : graph->Variables()) {
    got[graph->value(id).name] = graph->value(id).meta.shape;
    numel += graph->value(id).meta.shape.NumElements();
  }
  EXPECT_EQ(got, want);
  // HF's GPT2Model parameter count: V·C + P·C + L·(12C² + 13C) + 2C.
  EXPECT_EQ(numel, V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C);
}

TEST(Gpt2, HintsAndLayerIdxFollowTheConvention) {
  std::unique_ptr<Model> model = MakeModel(NanoConfig()["model"]);
  ASSERT_NE(model, nullptr);
  auto graph = model->BuildGraph(4);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const NdSbp BB = nn::Replicated();
  auto BS = [](int axis) { return nn::TensorParallelSplit(axis); };
  const std::map<std::string, NdSbp> by_suffix = {
      {"ln_1.weight", BB},           {"ln_1.bias", BB},          {"attn.c_attn.weight", BS(2)},
      {"attn.c_attn.bias", BS(1)},   {"attn.c_proj.weight", BS(0)}, {"attn.c_proj.bias", BB},
      {"ln_2.weight", BB},           {"ln_2.bias", BB},          {"mlp.c_fc.weight", BS(1)},
      {"mlp.c_fc.bias", BS(0)},      {"mlp.c_proj.weight", BS(0)}, {"mlp.c_proj.bias", BB}};
  for (graph::ValueId id : graph->Variables()) {
    const graph::Value& v = graph->value(id);
    ASSERT_TRUE(v.sbp_hint.has_value()) << v.name;
    const int64_t layer = graph->producer(id).layer_idx;
    if (v.name == "wte.weight") {
      EXPECT_EQ(*v.sbp_hint, BS(0));
      EXPECT_EQ(layer, 0);
    } else if (v.name == "wpe.weight") {
      EXPECT_EQ(*v.sbp_hint, BB);
      EXPECT_EQ(layer, 0);
    } else if (v.name.starts_with("ln_f.")) {
      EXPECT_EQ(*v.sbp_hint, BB);
      EXPECT_EQ(layer, -1);
    } else {
      ASSERT_TRUE(v.name.starts_with("h.")) << v.name;
      const size_t dot = v.name.find('.', 2);
      EXPECT_EQ(layer, std::stoll(v.name.substr(2, dot - 2))) << v.name;
      EXPECT_EQ(*v.sbp_hint, by_suffix.at(v.name.substr(dot + 1))) << v.name;
    }
  }
  for (const char* input : {"input_ids", "labels"}) {
    auto id = graph->FindInput(input);
    ASSERT_TRUE(id.ok()) << input;
    ASSERT_TRUE(graph->value(*id).sbp_hint.has_value());
    EXPECT_EQ(*graph->value(*id).sbp_hint, nn::BatchSplit());
  }
  // The loss and the head are on the last stage; the embeddings on the first.
  EXPECT_EQ(graph->producer(graph->losses().at(0)).layer_idx, -1);
  for (const graph::Node& n : graph->nodes()) {
    if (n.op == "embedding" || n.op == "arange") {
      EXPECT_EQ(n.layer_idx, 0) << n.op;
    }
    if (n.op == "cross_entropy_partials" || n.op == "reduce_max") {
      EXPECT_EQ(n.layer_idx, -1) << n.op;
    }
  }
}

// The hints give Megatron's layout under tensor parallelism: SBP inference
// (scheduler/sbp_infer.h) keeps every parameter in its hinted layout, runs
// the column matmuls B x S(1) -> S(1) and attention split by heads, the row
// matmuls S(1) x S(0) -> P, and pays exactly two all-reduces of the hidden
// state per block (after attn.c_proj and mlp.c_proj). The same after the
// engine's bias-dropout-add fusion (`dropout_fusion`), which makes each
// row-parallel bias, its dropout and the residual add one op.
void ExpectMegatronForward(bool fusion, bool dropout_fusion) {
  SCOPED_TRACE(StrCat(fusion ? "model.bias_gelu_fusion=true" : "unfused", dropout_fusion ? ", bias_dropout_add" : ""));
  std::unique_ptr<Model> model =
      MakeModel(NanoConfig({StrCat("model.bias_gelu_fusion=", fusion ? "true" : "false")})["model"]);
  ASSERT_NE(model, nullptr);
  const int64_t batch = 4, T = 32, C = 64;
  auto graph = model->BuildGraph(batch);
  ASSERT_TRUE(graph.ok()) << graph.status();
  if (dropout_fusion) {
    auto fused = graph::FuseBiasDropoutAdd(*graph);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(fused->fused, 2 * 2);
  }
  int fused_ops = 0, bias_gelus = 0, linears = 0, bias_adds = 0, bias_dropout_adds = 0;
  for (const graph::Node& n : graph->nodes()) {
    fused_ops += n.op == "matmul_bias_gelu";
    bias_gelus += n.op == "bias_gelu";
    linears += n.op == "matmul_bias";
    bias_adds += n.op == "bias_add";
    bias_dropout_adds += n.op == "bias_dropout_add";
  }
  EXPECT_EQ(fused_ops, fusion ? 2 : 0);  // gpt2_nano's 2 layers
  EXPECT_EQ(bias_gelus, fusion ? 0 : 2);
  // Per layer: q, k and v (column-parallel) add their bias in the GEMM;
  // the two row-parallel c_proj add theirs to the whole sum.
  EXPECT_EQ(linears, 2 * 3);
  EXPECT_EQ(bias_adds, dropout_fusion ? 0 : 2 * 2);
  EXPECT_EQ(bias_dropout_adds, dropout_fusion ? 2 * 2 : 0);
  for (int64_t dp : {1, 2}) {
    auto mesh = scheduler::DeviceMesh::Make({.data = dp, .tensor = 2, .world_size = 2 * dp});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto sbp = scheduler::InferSbp(*graph, *mesh);
    ASSERT_TRUE(sbp.ok()) << sbp.status();
    for (const scheduler::BoxingEdge& e : sbp->edges) {
      if (!graph->IsVariable(e.value)) continue;  // a parameter is never communicated (B -> P of a bias is local)
      EXPECT_EQ(e.cost, 0) << graph->value(e.value).name << ": " << e.description;
    }
    for (const graph::Node& n : graph->nodes()) {
      if (n.op != "matmul" && n.op != "matmul_bias" && n.op != "matmul_bias_gelu") continue;
      const Sbp tp_out = sbp->nodes[static_cast<size_t>(n.id)].outputs[0][1];
      if (n.scope.ends_with("c_attn") || n.scope.ends_with("c_fc")) {
        EXPECT_EQ(tp_out, Sbp::Split(1)) << n.scope;
      } else if (n.scope.ends_with("c_proj")) {
        EXPECT_TRUE(tp_out.is_partial_sum()) << n.scope;
      } else if (n.scope == "lm_head") {
        EXPECT_EQ(tp_out, Sbp::Split(1)) << "logits split over the vocabulary";
      }
    }
    for (const graph::Node& n : graph->nodes()) {
      if (n.op == "batch_matmul" || n.op == "fused_scale_causal_softmax") {
        EXPECT_EQ(sbp->nodes[static_cast<size_t>(n.id)].outputs[0][1], Sbp::Split(1)) << n.op << " split by heads";
      }
    }
    const double hidden_bytes = static_cast<double>(batch * T * C * 4);
    for (const char* block : {"h.0", "h.1"}) {
      int all_reduces = 0;
      double cost = 0;
      for (const scheduler::BoxingEdge& e : sbp->edges) {
        if (e.consumer == graph::kNoNode || !graph->node(e.consumer).scope.starts_with(block)) continue;
        cost += e.cost;
        all_reduces += e.cost > 0 && e.description.find("tp: P -> B (all-reduce)") != std::string::npos;
      }
      EXPECT_EQ(all_reduces, 2) << block;
      if (dp == 1) {
        EXPECT_DOUBLE_EQ(cost, 2 * hidden_bytes) << block;  // 2 x 2T(p-1)/p, p = 2
      }
    }
  }
}

// With model.bias_gelu_fusion each MLP's c_fc, bias and GELU are one
// matmul_bias_gelu op, column-split as c_fc's matmul is, at the same cost.
TEST(Gpt2, TensorParallelForwardIsMegatrons) {
  ExpectMegatronForward(false, false);
  ExpectMegatronForward(true, false);
  ExpectMegatronForward(true, true);
}

// Backward mirrors forward (autodiff gives a hinted activation's gradient
// the hint): under tensor parallelism each block's backward pays exactly two
// all-reduces of the hidden state (the gradients at the layer norms'
// outputs, Megatron's f) and communicates no parameter.
TEST(Gpt2, TensorParallelBackwardIsMegatrons) {
  std::unique_ptr<Model> model = MakeModel(NanoConfig()["model"]);
  ASSERT_NE(model, nullptr);
  const int64_t batch = 4, T = 32, C = 64;
  auto graph = model->BuildGraph(batch);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto gradients = graph::Autodiff(*graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  ASSERT_TRUE(graph::ApplyOptimizer(*graph, *gradients, {.clip_grad_max_norm = 1.0}).ok());
  ASSERT_TRUE(graph::EliminateDeadCode(*graph).ok());
  auto mesh = scheduler::DeviceMesh::Make({.data = 1, .tensor = 2, .world_size = 2});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto sbp = scheduler::InferSbp(*graph, *mesh);
  ASSERT_TRUE(sbp.ok()) << sbp.status();
  const double hidden_bytes = static_cast<double>(batch * T * C * 4);
  for (const scheduler::BoxingEdge& e : sbp->edges) {
    if (!graph->IsVariable(e.value)) continue;
    EXPECT_EQ(e.cost, 0) << graph->value(e.value).name << ": " << e.description;
  }
  for (const char* block : {"grad/h.0", "grad/h.1"}) {
    std::set<std::pair<graph::ValueId, std::string>> conversions;  // shared by their consumers
    for (const scheduler::BoxingEdge& e : sbp->edges) {
      if (e.cost == 0 || e.consumer == graph::kNoNode || !graph->node(e.consumer).scope.starts_with(block)) continue;
      EXPECT_EQ(e.description, "tp: P -> B (all-reduce)") << block;
      EXPECT_DOUBLE_EQ(e.cost, hidden_bytes) << block << ": " << e.description;  // 2T(p-1)/p, p = 2
      conversions.insert({e.value, NdSbpToString(e.to.nd_sbp)});
    }
    EXPECT_EQ(conversions.size(), 2u) << block << "\n" << sbp->ToText(*graph);
  }
}

TEST(Gpt2, DataIsLayoutInvariantAndShifted) {
  std::unique_ptr<Model> model = MakeModel(NanoConfig()["model"]);
  ASSERT_NE(model, nullptr);
  const int64_t T = 32;
  const std::vector<int64_t> ids8 = Fill(*model, 3, "input_ids", 8, T).ToVector<int64_t>();
  const std::vector<int64_t> ids4 = Fill(*model, 3, "input_ids", 4, T).ToVector<int64_t>();
  const std::vector<int64_t> labels8 = Fill(*model, 3, "labels", 8, T).ToVector<int64_t>();
  const std::vector<int64_t> next = Fill(*model, 4, "input_ids", 8, T).ToVector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(ids8.begin(), ids8.begin() + 4 * T), ids4);  // row j independent of the batch size
  EXPECT_NE(ids8, next);
  std::set<std::vector<int64_t>> rows;
  for (int64_t j = 0; j < 8; ++j) {
    rows.insert(std::vector<int64_t>(ids8.begin() + j * T, ids8.begin() + (j + 1) * T));
    for (int64_t t = 0; t + 1 < T; ++t) EXPECT_EQ(labels8[static_cast<size_t>(j * T + t)], ids8[static_cast<size_t>(j * T + t + 1)]);
  }
  EXPECT_EQ(rows.size(), 8u);
  for (int64_t id : ids8) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 256);
  }
  Tensor wrong = *Tensor::Zeros(Shape{2, T}, DType::kI64);
  EXPECT_FALSE(model->FillBatch(0, "tokens", wrong).ok());
}

// GPT-2 (HF GPT2LMHeadModel without dropout) in plain loops: the mean
// cross-entropy of `labels` under the model's logits for `ids` (B, T).
double Gpt2LossReference(const std::map<std::string, Floats>& w, const std::vector<int64_t>& ids,
                         const std::vector<int64_t>& labels, int64_t B, int64_t T, int64_t C, int64_t H, int64_t L,
                         int64_t V, int64_t F, double eps) {
  const int64_t N = B * T;
  Floats h(static_cast<size_t>(N * C));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      h[static_cast<size_t>(n * C + c)] = w.at("wte.weight")[static_cast<size_t>(ids[static_cast<size_t>(n)] * C + c)] +
                                          w.at("wpe.weight")[static_cast<size_t>((n % T) * C + c)];
    }
  }
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const Floats a = AttentionRef(LayerNormRef(h, N, C, w.at(p + "ln_1.weight"), w.at(p + "ln_1.bias"), eps), B, T, C,
                                  H, w.at(p + "attn.c_attn.weight"), w.at(p + "attn.c_attn.bias"),
                                  w.at(p + "attn.c_proj.weight"), w.at(p + "attn.c_proj.bias"), true, {});
    h = Add(h, a);
    const Floats m = MlpRef(LayerNormRef(h, N, C, w.at(p + "ln_2.weight"), w.at(p + "ln_2.bias"), eps), N, C, F,
                            w.at(p + "mlp.c_fc.weight"), w.at(p + "mlp.c_fc.bias"), w.at(p + "mlp.c_proj.weight"),
                            w.at(p + "mlp.c_proj.bias"));
    h = Add(h, m);
  }
  h = LayerNormRef(h, N, C, w.at("ln_f.weight"), w.at("ln_f.bias"), eps);
  const Floats& wte = w.at("wte.weight");
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> logits(static_cast<size_t>(V));
    double max = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(h[static_cast<size_t>(n * C + c)]) * wte[static_cast<size_t>(v * C + c)];
      logits[static_cast<size_t>(v)] = s;
      max = std::max(max, s);
    }
    double sum = 0;
    for (double l : logits) sum += std::exp(l - max);
    total += std::log(sum) + max - logits[static_cast<size_t>(labels[static_cast<size_t>(n)])];
  }
  return total / static_cast<double>(N);
}

TEST(Gpt2, FirstLossMatchesPlainLoopReference) {
  std::unique_ptr<Model> model = MakeModel(SmallModel(0.0));
  ASSERT_NE(model, nullptr);
  const int64_t B = 3, T = 7, C = 16, H = 4, L = 2, V = 37, F = 64;
  auto graph = model->BuildGraph(B);
  ASSERT_TRUE(graph.ok()) << graph.status();
  graph::testing::GraphInterpreter interpreter(*graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  // Perturb norms and biases too, so a mix-up between them would show.
  std::map<std::string, Floats> weights;
  uint32_t seed = 100;
  for (graph::ValueId id : graph->Variables()) {
    const graph::Value& v = graph->value(id);
    Floats values = interpreter.variable(id).ToVector<float>();
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
    for (float& x : values) x += noise(rng);
    ASSERT_TRUE(interpreter.SetVariable(v.name, Tensor::FromVector(v.meta.shape, values)).ok());
    weights[v.name] = values;
  }
  const Tensor ids = Fill(*model, 0, "input_ids", B, T), labels = Fill(*model, 0, "labels", B, T);
  auto values = interpreter.Run({{"input_ids", ids}, {"labels", labels}});
  ASSERT_TRUE(values.ok()) << values.status();
  const double loss = (*values)[static_cast<size_t>(graph->losses().at(0))].ToDoubleVector().at(0);
  const double want = Gpt2LossReference(weights, ids.ToVector<int64_t>(), labels.ToVector<int64_t>(), B, T, C, H, L,
                                        V, F, 1e-5);
  EXPECT_NEAR(loss, want, 1e-4 * want);

  // With the real init (std 0.02) the first loss is close to ln V.
  graph::testing::GraphInterpreter fresh(*graph);
  ASSERT_TRUE(fresh.InitVariables().ok());
  auto first = fresh.Run({{"input_ids", ids}, {"labels", labels}});
  ASSERT_TRUE(first.ok());
  EXPECT_NEAR((*first)[static_cast<size_t>(graph->losses().at(0))].ToDoubleVector().at(0), std::log(double(V)), 0.05);
}

// An embedder may hand the engine a graph it differentiated itself (train
// off): the engine's forward-graph fusion leaves it as it is and compiles.
TEST(Gpt2, TheEngineCompilesAGraphDifferentiatedByItsCaller) {
  std::unique_ptr<Model> model = MakeModel(SmallModel(0.1));
  ASSERT_NE(model, nullptr);
  auto graph = model->BuildGraph(2);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto gradients = graph::Autodiff(*graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  for (const auto& [var, grad] : *gradients) ASSERT_TRUE(graph->MarkFetch(graph->value(var).name, grad).ok());
  CompileOptions options;
  options.train = false;
  auto engine = Engine::Compile(*std::move(graph), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
}

// A batch the data-parallel ranks cannot split evenly: the plan's error
// says so (it named only a reshape's SBP signatures).
TEST(Gpt2, ABatchDataParallelRanksCannotSplitIsNamed) {
  std::unique_ptr<Model> model = MakeModel(SmallModel(0.0));
  ASSERT_NE(model, nullptr);
  auto graph = model->BuildGraph(6);
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.lower.parallel.world_size = 4;
  auto engine = Engine::Compile(*std::move(graph), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const absl::Status plan = (*engine)->Plan(1).status();
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.message().find("has batch 6, which the 4 data-parallel ranks cannot split evenly: make it a "
                                "multiple of 4)"),
            std::string::npos)
      << plan;
}

// Losses of `iterations` training steps through the engine (AdamW, constant lr).
std::vector<double> TrainThroughEngine(const Model& model, int64_t batch, int64_t iterations, double lr) {
  auto graph = model.BuildGraph(batch);
  EXPECT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kAdamW;
  auto engine = Engine::Compile(*std::move(graph), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<double> losses;
  const auto feed = [&](int64_t iteration, int64_t, std::string_view input, const Tensor& out) -> absl::Status {
    if (input == options.optimizer.lr_input_name) {
      Tensor t = out;
      return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{static_cast<float>(lr)}));
    }
    return model.FillBatch(iteration, input, out);
  };
  const auto fetch = [&](int64_t, const std::map<std::string, Tensor>& values) -> absl::Status {
    losses.push_back(values.at("loss").ToVector<float>().at(0));
    return absl::OkStatus();
  };
  const absl::Status s = (*engine)->Run(iterations, feed, fetch);
  EXPECT_TRUE(s.ok()) << s;
  return losses;
}

TEST(Gpt2, DeterministicAndDropoutChangesTheLoss) {
  std::unique_ptr<Model> off = MakeModel(SmallModel(0.0));
  std::unique_ptr<Model> on = MakeModel(SmallModel(0.1));
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  const int64_t steps = 30;
  const std::vector<double> a = TrainThroughEngine(*off, 4, steps, 1e-2);
  const std::vector<double> b = TrainThroughEngine(*off, 4, steps, 1e-2);
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  EXPECT_EQ(a, b);  // dropout off: bit-identical runs
  const std::vector<double> c = TrainThroughEngine(*on, 4, steps, 1e-2);
  const std::vector<double> d = TrainThroughEngine(*on, 4, steps, 1e-2);
  ASSERT_EQ(c.size(), static_cast<size_t>(steps));
  EXPECT_EQ(c, d);  // dropout masks are keyed by (seed, site, step, index): reproducible too
  EXPECT_NE(a[0], c[0]);
  // A few steps through the engine lower the loss (each step sees new data).
  double tail = 0;
  for (int64_t i = steps - 5; i < steps; ++i) tail += a[static_cast<size_t>(i)] / 5;
  EXPECT_LT(tail, a.front() - 0.2) << "first " << a.front() << ", last 5 " << tail;
}

TEST(Gpt2, TrainerLowersTheLoss) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_gpt2_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const nlohmann::json config =
      NanoConfig({"train.train_iter=80", "train.log_period=40", "train.output_dir=" + dir.string()});
  auto summary = Train(config);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<double>& losses = summary->losses;
  ASSERT_EQ(losses.size(), 80u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.1);
  double tail = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) tail += losses[i] / 10;
  EXPECT_LT(tail, losses.front() - 1.0) << "first " << losses.front() << ", last 10 " << tail;
  EXPECT_TRUE(std::filesystem::exists(dir / "metrics.jsonl"));
  std::filesystem::remove_all(dir);
}

TEST(Gpt2, ConfigErrorsAreNamed) {
  nlohmann::json node = SmallModel(0.0);
  node["hiden_size"] = 8;
  auto typo = Gpt2::FromJson(node);
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("did you mean 'model.hidden_size'"), std::string::npos) << typo.status();

  node = SmallModel(0.0);
  node["num_attention_heads"] = 3;
  auto heads = Gpt2::FromJson(node);
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.status().message().find("multiple of num_attention_heads"), std::string::npos) << heads.status();

  node = SmallModel(0.0);
  node["seq_length"] = 13;
  EXPECT_FALSE(Gpt2::FromJson(node).ok());
  node = SmallModel(0.0);
  node["output_dropout_prob"] = 1.0;
  EXPECT_FALSE(Gpt2::FromJson(node).ok());

  Registry<Model> registry("model");
  ASSERT_TRUE(RegisterBuiltinModels(registry).ok());
  EXPECT_TRUE(registry.Create(SmallModel(0.0)).ok());
}

}  // namespace
}  // namespace tessera::models
