// The device mesh (LiBai's rank layout and layer -> stage rule) and SBP
// inference: boxing costs, data / tensor / 2-D / pipeline parallel graphs,
// hints as constraints, determinism.

#include "scheduler/sbp_infer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/text.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "scheduler/mesh.h"

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing \"" << (part) << "\" in:\n" << (text)

namespace tessera::scheduler {
namespace {

using graph::Graph;
using graph::GraphBuilder;
using graph::InitRule;
using graph::Sym;
using graph::ValueId;

const Sbp kB = Sbp::Broadcast();
const Sbp kP = Sbp::PartialSum();
const Sbp kS0 = Sbp::Split(0);
const Sbp kS1 = Sbp::Split(1);

DeviceMesh MakeMesh(int64_t world, int64_t tensor, int64_t pipeline = 1, int64_t layers = 0) {
  auto mesh = DeviceMesh::Make({.device_type = DeviceType::kCpu,
                                .data = -1,
                                .tensor = tensor,
                                .pipeline = pipeline,
                                .world_size = world,
                                .pipeline_num_layers = layers});
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return mesh.value();
}

std::string MeshError(ParallelConfig config) {
  auto mesh = DeviceMesh::Make(config);
  EXPECT_FALSE(mesh.ok());
  return mesh.ok() ? "" : std::string(mesh.status().message());
}

// ---- mesh

TEST(DeviceMeshTest, RanksFormContiguousStagesOfDataByTensorMeshes) {
  const DeviceMesh mesh = MakeMesh(/*world=*/8, /*tensor=*/2, /*pipeline=*/2, /*layers=*/4);
  EXPECT_EQ(mesh.data_parallel_size(), 2);  // derived: 8 / (2 * 2)
  EXPECT_EQ(mesh.tensor_parallel_size(), 2);
  EXPECT_EQ(mesh.num_stages(), 2);
  EXPECT_EQ(mesh.hierarchy(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(mesh.stage_placement(0).ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(mesh.stage_placement(1).ranks(), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.stage_placement(1).hierarchy(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(mesh.stage_placement(1).device_type(), DeviceType::kCpu);
  // rank = stage base + d * tp + t: {4, 6} is a data-parallel group, {4, 5} a tensor-parallel one.
  EXPECT_EQ(mesh.RankOf(1, 0, 0), 4);
  EXPECT_EQ(mesh.RankOf(1, 1, 0), 6);
  EXPECT_EQ(mesh.RankOf(1, 0, 1), 5);
  EXPECT_EQ(mesh.RankOf(0, 1, 1), 3);
  for (int64_t rank = 0; rank < 8; ++rank) {
    auto coords = mesh.CoordinatesOf(rank);
    ASSERT_TRUE(coords.ok()) << coords.status();
    EXPECT_EQ(mesh.RankOf(coords->stage, coords->data, coords->tensor), rank);
  }
  EXPECT_EQ(*mesh.CoordinatesOf(6), (MeshCoordinates{.stage = 1, .data = 1, .tensor = 0}));
  EXPECT_FALSE(mesh.CoordinatesOf(8).ok());
  EXPECT_EQ(mesh.ToString(), "cpu, 8 ranks: pipeline 2 x data 2 x tensor 2; layers per stage [2, 2]");

  const DeviceMesh tensor_only = MakeMesh(4, 4);
  EXPECT_EQ(tensor_only.data_parallel_size(), 1);
  EXPECT_EQ(tensor_only.hierarchy(), (std::vector<int64_t>{1, 4}));
  const DeviceMesh explicit_data = *DeviceMesh::Make({.data = 3, .world_size = 3});
  EXPECT_EQ(explicit_data.hierarchy(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(explicit_data.stage_placement(0).ToString(), "cpu:{0,1,2}@[3,1]");
}

TEST(DeviceMeshTest, LayersMapToStagesByLibaiRule) {
  // Divisible, >= 4 stages, >= 8 layers: the last stage (head + loss) gets fewer.
  const DeviceMesh gpt = MakeMesh(4, 1, 4, 24);
  EXPECT_EQ(gpt.LayersPerStage(), (std::vector<int64_t>{6, 7, 7, 4}));
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 0},  {5, 0},  {6, 1},  {12, 1}, {13, 2},
                                                             {19, 2}, {20, 3}, {23, 3}, {-1, 3}};
  for (const auto& [layer, stage] : expected) {
    auto got = gpt.StageOfLayer(layer);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, stage) << "layer " << layer;
  }
  // Uneven: the remainder goes one layer each to the last stages.
  EXPECT_EQ(MakeMesh(4, 1, 4, 10).LayersPerStage(), (std::vector<int64_t>{2, 2, 3, 3}));
  EXPECT_EQ(MakeMesh(2, 1, 2, 5).LayersPerStage(), (std::vector<int64_t>{2, 3}));
  // Fewer than 4 stages: plain even cut.
  EXPECT_EQ(MakeMesh(2, 1, 2, 8).LayersPerStage(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(MakeMesh(4, 1, 4, 8).LayersPerStage(), (std::vector<int64_t>{2, 2, 3, 1}));
  EXPECT_EQ(MakeMesh(4, 1, 4, 4).LayersPerStage(), (std::vector<int64_t>{1, 1, 1, 1}));
  // One stage: every layer index, and "unassigned", is stage 0.
  const DeviceMesh flat = MakeMesh(4, 2);
  EXPECT_EQ(*flat.StageOfLayer(0), 0);
  EXPECT_EQ(*flat.StageOfLayer(1000), 0);
  EXPECT_EQ(*flat.StageOfLayer(-1), 0);
  EXPECT_TRUE(flat.LayersPerStage().empty());
  // Outside the layers.
  auto past = gpt.StageOfLayer(24);
  ASSERT_FALSE(past.ok());
  EXPECT_CONTAINS(past.status().message(), "layer_idx 24 is outside the 24 pipeline layers");
  EXPECT_FALSE(gpt.StageOfLayer(-2).ok());
}

TEST(DeviceMeshTest, ACustomStageListPlacesEachLayer) {
  ParallelConfig config{.pipeline = 2, .world_size = 2, .pipeline_num_layers = 4};
  config.custom_stage_of_layer = {0, 0, 0, 1};  // LiBai's rule would give [2, 2]
  auto mesh = DeviceMesh::Make(config);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->LayersPerStage(), (std::vector<int64_t>{3, 1}));
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {3, 1}, {-1, 1}};
  for (const auto& [layer, stage] : expected) EXPECT_EQ(*mesh->StageOfLayer(layer), stage) << "layer " << layer;
  EXPECT_EQ(mesh->ToString(), "cpu, 2 ranks: pipeline 2 x data 1 x tensor 1; layers per stage [3, 1]");
  EXPECT_FALSE(mesh->StageOfLayer(4).ok());
  config.pipeline = 3;
  config.world_size = 3;
  config.custom_stage_of_layer = {0, 1, 1, 2};
  EXPECT_EQ(DeviceMesh::Make(config)->LayersPerStage(), (std::vector<int64_t>{1, 2, 1}));
  // One stage: a list of zeros is accepted and changes nothing.
  ParallelConfig flat{.world_size = 2, .pipeline_num_layers = 2};
  flat.custom_stage_of_layer = {0, 0};
  EXPECT_EQ(*DeviceMesh::Make(flat)->StageOfLayer(1), 0);
}

TEST(DeviceMeshTest, BadCustomStageListsAreOneLineErrors) {
  const auto error = [](std::vector<int64_t> stages, int64_t pipeline = 2, int64_t layers = 4) {
    ParallelConfig config{.pipeline = pipeline, .world_size = pipeline, .pipeline_num_layers = layers};
    config.custom_stage_of_layer = std::move(stages);
    return MeshError(config);
  };
  EXPECT_CONTAINS(error({0, 0, 1}), "custom_pipeline_stage_id has 3 entries, one per layer is needed: the model has 4");
  EXPECT_CONTAINS(error({0, 0, 1, 2}),
                  "custom_pipeline_stage_id[3] = 2 is outside the 2 pipeline stages (valid: 0..1)");
  EXPECT_CONTAINS(error({0, -1, 1, 1}), "custom_pipeline_stage_id[1] = -1 is outside");
  EXPECT_CONTAINS(error({0, 1, 0, 1}), "custom_pipeline_stage_id[2] = 0 comes after stage 1");
  EXPECT_CONTAINS(error({0, 0, 0, 0}), "custom_pipeline_stage_id gives stage 1 no layer");
  EXPECT_CONTAINS(error({0, 0, 2, 2}, 3), "gives stage 1 no layer");
  EXPECT_CONTAINS(error({0, 1}, 1, 2), "custom_pipeline_stage_id[1] = 1 is outside the 1 pipeline stages");
  EXPECT_CONTAINS(error({0, 0}, 1, 0), "custom_pipeline_stage_id needs pipeline_num_layers");
}

TEST(DeviceMeshTest, BadConfigsFailWithOneLineReasons) {
  EXPECT_CONTAINS(MeshError({.tensor = 4, .world_size = 6}),
                  "world size 6 is not divisible by tensor parallel size 4 x pipeline parallel size 1");
  EXPECT_CONTAINS(MeshError({.tensor = 2, .pipeline = 2, .world_size = 8}),
                  "pipeline parallel size 2 needs pipeline_num_layers");
  EXPECT_CONTAINS(MeshError({.pipeline = 4, .world_size = 4, .pipeline_num_layers = 3}),
                  "more pipeline stages (4) than layers (3)");
  EXPECT_CONTAINS(MeshError({.data = 3, .tensor = 2, .world_size = 8}), "but the world size is 8");
  EXPECT_CONTAINS(MeshError({.tensor = 0, .world_size = 8}), "must be positive");
  EXPECT_CONTAINS(MeshError({.world_size = 0}), "world size must be positive");
  for (const std::string& message : {MeshError({.tensor = 4, .world_size = 6}), MeshError({.world_size = -1})}) {
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// ---- costs

// Edge costs are core/boxing_cost.h's BoxingCost, pinned row by row in
// tests/comm/boxing_test.cc; here, the words.
TEST(DescribeBoxingTest, NamesEachAxisConversion) {
  EXPECT_EQ(DescribeBoxing({0, {kP, kB}}, {0, {kB, kB}}), "dp: P -> B (all-reduce)");
  EXPECT_EQ(DescribeBoxing({0, {kP, kS1}}, {0, {kB, kB}}),
            "dp: P -> B (all-reduce); tp: S(1) -> B (all-gather, then unpack)");
  EXPECT_EQ(DescribeBoxing({0, {kB, kP}}, {0, {kB, kS0}}), "tp: P -> S(0) (reduce-scatter)");
  EXPECT_EQ(DescribeBoxing({0, {kS0, kB}}, {0, {kS1, kB}}), "dp: S(0) -> S(1) (all-to-all)");
  EXPECT_EQ(DescribeBoxing({0, {kB, kB}}, {0, {kB, kS1}}), "tp: B -> S(1) (local slice)");
  EXPECT_EQ(DescribeBoxing({0, {kS0, kB}}, {1, {kS0, kB}}), "across placements: stage 0 -> stage 1 (point-to-point)");
  EXPECT_EQ(DescribeBoxing({1, {kP, kB}}, {0, {kB, kB}}),
            "across placements: stage 1 -> stage 0 (point-to-point), (P, B) -> (B, B)");
}

// ---- graphs

// x (8, 5) -> Linear(5, 7) + bias -> gelu -> Linear(7, 3) + bias ->
// cross-entropy vs labels (8,) -> mean; fc1 on layer 0, fc2 on layer 1.
Graph BuildMlp() {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{8, 5}});
  Sym labels = b.Input("labels", {DType::kI64, Shape{8}});
  Sym h, logits;
  {
    auto scope = b.Scope("fc1", 0);
    Sym w = b.Variable("weight", {5, 7}, InitRule::Normal(0, 0.5, 1, 0));
    Sym bias = b.Variable("bias", {7}, InitRule::Zeros());
    h = Gelu(Matmul(x, w) + bias);  // (8, 7)
  }
  {
    auto scope = b.Scope("fc2", 1);
    Sym w = b.Variable("weight", {7, 3}, InitRule::Normal(0, 0.5, 1, 2));
    Sym bias = b.Variable("bias", {3}, InitRule::Zeros());
    logits = Matmul(h, w) + bias;  // (8, 3)
  }
  b.MarkLoss(ReduceMean(SparseSoftmaxCrossEntropy(logits, labels)));
  auto graph = b.Finish();
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *std::move(graph);
}

// Megatron's MLP block: x (8, 16) -> column-parallel Linear(16, 32) -> gelu
// -> row-parallel Linear(32, 16) = y, fetched; loss = mean(y).
struct ColRow {
  Graph graph;
  ValueId x, w1, w2, h, y;
};
ColRow BuildColRow(NdSbp w1_hint = {kB, kS1}, NdSbp w2_hint = {kB, kS0}) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{8, 16}});
  auto scope = b.Scope("mlp", 0);
  Sym w1 = b.Variable("c_fc.weight", {16, 32}, InitRule::Normal(0, 0.02, 1, 0), {.sbp = std::move(w1_hint)});
  Sym w2 = b.Variable("c_proj.weight", {32, 16}, InitRule::Normal(0, 0.02, 1, 1), {.sbp = std::move(w2_hint)});
  Sym h = Gelu(Matmul(x, w1));  // (8, 32)
  Sym y = Matmul(h, w2);        // (8, 16)
  b.MarkFetch("y", y);
  b.MarkLoss(ReduceMean(y));
  ColRow out{Graph(), x.id(), w1.id(), w2.id(), h.id(), y.id()};
  auto graph = b.Finish();
  EXPECT_TRUE(graph.ok()) << graph.status();
  out.graph = *std::move(graph);
  return out;
}

// Autodiff -> AdamW -> dead-code elimination, as train/engine.cc does;
// `ids` are renumbered like the graph.
void Train(Graph& graph, const std::vector<ValueId*>& ids = {}) {
  auto gradients = graph::Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  auto optimizer = graph::ApplyOptimizer(graph, *gradients, {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  auto remap = graph::EliminateDeadCode(graph);
  ASSERT_TRUE(remap.ok()) << remap.status();
  for (ValueId* id : ids) *id = remap->at(static_cast<size_t>(*id));
}
void Train(ColRow& cr) { Train(cr.graph, {&cr.x, &cr.w1, &cr.w2, &cr.h, &cr.y}); }

SbpAssignment Infer(const Graph& graph, const DeviceMesh& mesh) {
  auto assignment = InferSbp(graph, mesh);
  EXPECT_TRUE(assignment.ok()) << assignment.status();
  return assignment.ok() ? *std::move(assignment) : SbpAssignment{};
}

std::vector<BoxingEdge> EdgesInto(const SbpAssignment& a, graph::NodeId consumer) {
  std::vector<BoxingEdge> out;
  for (const BoxingEdge& e : a.edges) {
    if (e.kind == BoxingEdgeKind::kOpInput && e.consumer == consumer) out.push_back(e);
  }
  return out;
}

// The optimizer node that updates `variable` (its output 0 is the update).
const graph::Node& UpdateNode(const Graph& graph, ValueId variable) {
  return graph.producer(graph.variable_updates().at(variable));
}

bool IsForward(const graph::Node& node) {
  return node.scope.rfind("grad/", 0) != 0 && node.scope.rfind("optimizer/", 0) != 0;
}

// Every trainable variable's gradient arrives partial over data parallel (and
// split like its variable over tensor parallel) and is all-reduced exactly
// once, into its optimizer update; the update gives back the variable's own
// layout; no other op input is all-reduced.
void ExpectOneAllReducePerGradient(const Graph& graph, const SbpAssignment& a) {
  for (ValueId var : graph.Variables()) {
    if (!graph.variable_info(var).trainable) continue;
    const std::string& name = graph.value(var).name;
    const graph::Node& update = UpdateNode(graph, var);
    EXPECT_EQ(update.op, "adamw_update") << name;
    const ValueId gradient = update.inputs[1];
    const NdSbp& var_layout = a.values[static_cast<size_t>(var)].nd_sbp;
    EXPECT_EQ(a.values[static_cast<size_t>(gradient)].nd_sbp[0], kP) << name;
    EXPECT_EQ(a.values[static_cast<size_t>(gradient)].nd_sbp[1], var_layout[1]) << name;
    std::vector<BoxingEdge> into;  // into the gradient input (a pipeline also moves lr to the stage)
    for (const BoxingEdge& e : EdgesInto(a, update.id)) {
      if (e.input_index == 1) into.push_back(e);
    }
    ASSERT_EQ(into.size(), 1u) << name << "\n" << a.ToText(graph);
    EXPECT_EQ(into[0].value, gradient) << name;
    EXPECT_EQ(into[0].input_index, 1) << name;
    EXPECT_EQ(into[0].description, "dp: P -> B (all-reduce)") << name;
    EXPECT_EQ(into[0].to.nd_sbp, var_layout) << name;
    // The update (and the state updates) come out in the variables' layouts: no update edges.
    for (ValueId out : update.outputs) EXPECT_EQ(a.values[static_cast<size_t>(out)].nd_sbp, var_layout) << name;
  }
  for (const BoxingEdge& e : a.edges) {
    EXPECT_NE(e.kind, BoxingEdgeKind::kVariableUpdate) << e.description;
    if (e.description.find("P -> B") != std::string::npos && e.kind == BoxingEdgeKind::kOpInput) {
      EXPECT_EQ(graph.node(e.consumer).op, "adamw_update") << "an all-reduce before " << graph.node(e.consumer).op;
    }
  }
}

TEST(SbpInferTest, DataParallelMlpAllReducesEachWeightGradientOnce) {
  Graph graph = BuildMlp();
  Train(graph);
  const SbpAssignment a = Infer(graph, MakeMesh(/*world=*/4, /*tensor=*/1));
  ASSERT_EQ(a.nodes.size(), static_cast<size_t>(graph.num_nodes()));
  ASSERT_EQ(a.values.size(), static_cast<size_t>(graph.num_values()));
  // Inputs split over data parallel, variables broadcast, one stage.
  EXPECT_EQ(a.values[static_cast<size_t>(*graph.FindInput("x"))].nd_sbp, (NdSbp{kS0, kB}));
  EXPECT_EQ(a.values[static_cast<size_t>(*graph.FindInput("labels"))].nd_sbp, (NdSbp{kS0, kB}));
  EXPECT_EQ(a.values[static_cast<size_t>(*graph.FindInput("lr"))].nd_sbp, (NdSbp{kB, kB}));  // a scalar: B
  for (ValueId var : graph.Variables()) EXPECT_EQ(a.values[static_cast<size_t>(var)].nd_sbp, (NdSbp{kB, kB}));
  for (const NodeLayout& n : a.nodes) EXPECT_EQ(n.stage, 0);
  // The forward runs without boxing, batch-split.
  for (const graph::Node& node : graph.nodes()) {
    if (!IsForward(node)) continue;
    EXPECT_TRUE(EdgesInto(a, node.id).empty()) << node.op << "\n" << a.ToText(graph);
    const NodeLayout& nl = a.nodes[static_cast<size_t>(node.id)];
    ASSERT_EQ(nl.signatures.size(), 2u);
    // On the tensor-parallel axis of size 1 everything is B.
    for (const Sbp& s : nl.signatures[1].inputs) EXPECT_EQ(s, kB);
    for (const Sbp& s : nl.signatures[1].outputs) EXPECT_EQ(s, kB);
    if (node.op == "matmul") {
      EXPECT_EQ(nl.signatures[0].ToString(), "S(0), B -> S(0)");
    }
  }
  ExpectOneAllReducePerGradient(graph, a);
  // The loss is a partial sum over data parallel; the sink all-reduces it.
  const ValueId loss = graph.losses().at(0);
  EXPECT_EQ(a.values[static_cast<size_t>(loss)].nd_sbp, (NdSbp{kP, kB}));
  ASSERT_FALSE(a.edges.empty());
  const BoxingEdge& sink = a.edges.back();
  EXPECT_EQ(sink.kind, BoxingEdgeKind::kSink);
  EXPECT_EQ(sink.value, loss);
  EXPECT_EQ(sink.to, (ValueLayout{0, {kB, kB}}));
  EXPECT_EQ(sink.description, "dp: P -> B (all-reduce)");
  EXPECT_DOUBLE_EQ(sink.cost, 2 * 4.0 * 3 / 4);
  // Total = the edges' costs: four gradient all-reduces (5x7, 7, 7x3, 3 floats) and the loss.
  double total = 0;
  for (const BoxingEdge& e : a.edges) total += e.cost;
  EXPECT_DOUBLE_EQ(a.total_cost, total);
  EXPECT_DOUBLE_EQ(a.total_cost, 2 * 4.0 * 3 / 4 * (35 + 7 + 21 + 3 + 1));
}

TEST(SbpInferTest, ColumnThenRowParallelLinearsNeedOneAllReduce) {
  ColRow cr = BuildColRow();
  const Graph& graph = cr.graph;  // forward only
  const SbpAssignment a = Infer(graph, MakeMesh(/*world=*/4, /*tensor=*/4));
  auto layout = [&](ValueId v) { return a.values[static_cast<size_t>(v)].nd_sbp; };
  EXPECT_EQ(layout(cr.x), (NdSbp{kB, kB}));  // (S(0), B) on a data-parallel axis of 1
  EXPECT_EQ(layout(cr.w1), (NdSbp{kB, kS1}));
  EXPECT_EQ(layout(cr.w2), (NdSbp{kB, kS0}));
  EXPECT_EQ(layout(cr.h), (NdSbp{kB, kS1}));  // columns of h stay on their tensor-parallel rank
  EXPECT_EQ(layout(cr.y), (NdSbp{kB, kP}));   // partial sums of the row-parallel product
  EXPECT_EQ(a.nodes[static_cast<size_t>(graph.value(cr.y).producer)].signatures[1].ToString(), "S(1), S(0) -> P");
  // No boxing between the two matmuls; y is all-reduced once, into the sink.
  std::vector<BoxingEdge> into_ops, y_edges;
  for (const BoxingEdge& e : a.edges) {
    if (e.kind == BoxingEdgeKind::kOpInput) into_ops.push_back(e);
    if (e.value == cr.y) y_edges.push_back(e);
  }
  EXPECT_TRUE(into_ops.empty()) << a.ToText(graph);
  ASSERT_EQ(y_edges.size(), 1u) << a.ToText(graph);
  EXPECT_EQ(y_edges[0].kind, BoxingEdgeKind::kSink);
  EXPECT_EQ(y_edges[0].description, "tp: P -> B (all-reduce)");
  EXPECT_DOUBLE_EQ(y_edges[0].cost, 2 * (8 * 16 * 4.0) * 3 / 4);
  // mean(y) stays partial; the host reads it all-reduced.
  EXPECT_EQ(layout(graph.losses().at(0)), (NdSbp{kB, kP}));
}

TEST(SbpInferTest, DataAndTensorParallelOnATwoByTwoMesh) {
  ColRow cr = BuildColRow();
  Train(cr);
  const Graph& graph = cr.graph;
  const SbpAssignment a = Infer(graph, MakeMesh(/*world=*/4, /*tensor=*/2));
  auto layout = [&](ValueId v) { return a.values[static_cast<size_t>(v)].nd_sbp; };
  EXPECT_EQ(layout(cr.x), (NdSbp{kS0, kB}));
  EXPECT_EQ(layout(cr.h), (NdSbp{kS0, kS1}));
  EXPECT_EQ(layout(cr.y), (NdSbp{kS0, kP}));
  for (const graph::Node& node : graph.nodes()) {
    if (IsForward(node)) {
      EXPECT_TRUE(EdgesInto(a, node.id).empty()) << node.op << "\n" << a.ToText(graph);
    }
  }
  // Weight gradients: partial over data parallel, split like their weight over tensor parallel.
  ExpectOneAllReducePerGradient(graph, a);
  EXPECT_EQ(layout(UpdateNode(graph, cr.w1).inputs[1]), (NdSbp{kP, kS1}));
  EXPECT_EQ(layout(UpdateNode(graph, cr.w2).inputs[1]), (NdSbp{kP, kS0}));
  // Optimizer state is laid out like its variable.
  EXPECT_EQ(layout(*graph.FindVariable("mlp.c_fc.weight.adam_m")), (NdSbp{kB, kS1}));
  EXPECT_EQ(layout(*graph.FindVariable("mlp.c_proj.weight.adam_v")), (NdSbp{kB, kS0}));
  // The fetched y: gathered over data parallel, all-reduced over tensor parallel.
  bool found = false;
  for (const BoxingEdge& e : a.edges) {
    if (e.kind != BoxingEdgeKind::kSink || e.value != cr.y) continue;
    found = true;
    EXPECT_EQ(e.description, "dp: S(0) -> B (all-gather); tp: P -> B (all-reduce)");
    // The tp all-reduce runs on the dp shard (T/2), then dp gathers all of T.
    EXPECT_DOUBLE_EQ(e.cost, 2 * 256.0 / 2 + 512.0 / 2);
  }
  EXPECT_TRUE(found) << a.ToText(graph);
}

TEST(SbpInferTest, OptimizerStateFollowsItsVariableUnlessHinted) {
  ColRow cr = BuildColRow();
  Train(cr);
  Graph& graph = cr.graph;
  // The optimizer pass copies the hint; without it the state still follows the weight.
  const ValueId m = *graph.FindVariable("mlp.c_fc.weight.adam_m");
  ASSERT_TRUE(graph.SetHints(m, std::nullopt, std::nullopt).ok());
  const SbpAssignment a = Infer(graph, MakeMesh(4, 2));
  EXPECT_EQ(a.values[static_cast<size_t>(m)].nd_sbp, (NdSbp{kB, kS1}));
}

TEST(SbpInferTest, PipelineStagesComeFromLayerIndexAndCrossWithPointToPoint) {
  Graph graph = BuildMlp();
  Train(graph);
  const DeviceMesh mesh = MakeMesh(/*world=*/4, /*tensor=*/1, /*pipeline=*/2, /*layers=*/2);
  const SbpAssignment a = Infer(graph, mesh);
  for (const graph::Node& node : graph.nodes()) {
    const int64_t stage = a.nodes[static_cast<size_t>(node.id)].stage;
    if (node.layer_idx >= 0) {
      EXPECT_EQ(stage, node.layer_idx) << node.op << " " << node.scope;
    }
    for (ValueId out : node.outputs) EXPECT_EQ(a.values[static_cast<size_t>(out)].stage, stage);
  }
  // Unassigned nodes: x goes where it is read (stage 0); labels, the loss and
  // the autodiff seed follow the head (stage 1).
  EXPECT_EQ(a.values[static_cast<size_t>(*graph.FindInput("x"))].stage, 0);
  EXPECT_EQ(a.values[static_cast<size_t>(*graph.FindInput("labels"))].stage, 1);
  EXPECT_EQ(a.values[static_cast<size_t>(graph.losses().at(0))].stage, 1);
  // Forward h (stage 0 -> 1) and its gradient (1 -> 0) cross placements at cost T.
  int forward = 0, backward = 0;
  for (const BoxingEdge& e : a.edges) {
    if (e.from.stage == e.to.stage) continue;
    EXPECT_CONTAINS(e.description, "across placements");
    const TensorMeta& meta = graph.value(e.value).meta;
    EXPECT_DOUBLE_EQ(e.cost, static_cast<double>(meta.shape.NumElements() * 4)) << e.description;
    if (e.kind != BoxingEdgeKind::kOpInput) continue;
    const graph::Node& consumer = graph.node(e.consumer);
    if (consumer.op == "matmul" && consumer.scope == "fc2" && e.from.stage == 0) {
      ++forward;
      EXPECT_EQ(e.description, "across placements: stage 0 -> stage 1 (point-to-point)");
      EXPECT_EQ(e.to.nd_sbp, (NdSbp{kS0, kB}));
    }
    if (consumer.op == "gelu_grad" && e.from.stage == 1) ++backward;
  }
  EXPECT_EQ(forward, 1) << a.ToText(graph);
  EXPECT_EQ(backward, 1) << a.ToText(graph);
  // Each gradient is still all-reduced once over its stage's data-parallel axis.
  ExpectOneAllReducePerGradient(graph, a);
  // The sink is on the last stage.
  EXPECT_EQ(a.edges.back().kind, BoxingEdgeKind::kSink);
  EXPECT_EQ(a.edges.back().to, (ValueLayout{1, {kB, kB}}));
}

TEST(SbpInferTest, LayerIndexOutsideThePipelineIsAnError) {
  Graph graph = BuildMlp();
  auto a = InferSbp(graph, MakeMesh(2, 1, /*pipeline=*/2, /*layers=*/2));
  EXPECT_TRUE(a.ok()) << a.status();
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 4}});
  {
    auto scope = b.Scope("h.5", 5);
    b.MarkFetch("y", Relu(x));
  }
  auto g = b.Finish();
  ASSERT_TRUE(g.ok());
  auto bad = InferSbp(*g, MakeMesh(2, 1, 2, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_CONTAINS(bad.status().message(),
                  "op 'relu' (node 1, scope 'h.5'): layer_idx 5 is outside the 2 pipeline layers");
}

// With global-norm clipping a gradient is read by its square sum and by the
// scaling before the update: the data-parallel reduction happens once, and
// the scaling reuses the layout the norm needed.
TEST(SbpInferTest, ClippedGradientIsReducedOnce) {
  Graph graph = BuildMlp();
  auto gradients = graph::Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  auto optimizer = graph::ApplyOptimizer(graph, *gradients, {.clip_grad_max_norm = 1.0});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  ASSERT_TRUE(graph::EliminateDeadCode(graph).ok());
  const SbpAssignment a = Infer(graph, MakeMesh(4, 1));
  // Reductions of tensors (the norm's per-gradient square sums are scalars);
  // edges are per consumer, the lowering converts each (value, layout) once.
  std::set<std::pair<ValueId, std::string>> reductions;
  for (const BoxingEdge& e : a.edges) {
    if (e.from.nd_sbp[0].is_partial() && graph.value(e.value).meta.shape.rank() > 0) {
      reductions.insert({e.value, NdSbpToString(e.to.nd_sbp)});
    }
  }
  EXPECT_EQ(reductions.size(), gradients->size()) << a.ToText(graph);
}

// LiBai's layer_idx -1 pins a node to the last stage even when its inputs
// are all on stage 0; an unassigned node follows its inputs.
TEST(SbpInferTest, LayerMinusOneIsTheLastStage) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 4}});
  Sym h, last, follows;
  {
    auto scope = b.Scope("h.0", 0);
    h = Relu(x);
  }
  {
    auto scope = b.Scope("head", graph::kLastLayer);
    last = Exp(h);
  }
  follows = Exp(h);
  b.MarkFetch("last", last);
  b.MarkFetch("follows", follows);
  auto g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status();
  const SbpAssignment a = Infer(*g, MakeMesh(3, 1, /*pipeline=*/3, /*layers=*/3));
  EXPECT_EQ(a.values[static_cast<size_t>(h.id())].stage, 0);
  EXPECT_EQ(a.values[static_cast<size_t>(last.id())].stage, 2);
  EXPECT_EQ(a.values[static_cast<size_t>(follows.id())].stage, 0);
}

TEST(SbpInferTest, GradientAccumulationPassesLayoutsThrough) {
  Graph graph = BuildMlp();
  auto gradients = graph::Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  auto accumulated = graph::AccumulateGradients(graph, *gradients, 4);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  ASSERT_TRUE(graph::ApplyOptimizer(graph, accumulated->gradients, {}).ok());
  ASSERT_TRUE(graph::EliminateDeadCode(graph).ok());
  const SbpAssignment a = Infer(graph, MakeMesh(2, 1));
  int repeats = 0, gradient_accs = 0;
  for (const graph::Node& node : graph.nodes()) {
    if (node.kind != graph::NodeKind::kRepeat && node.kind != graph::NodeKind::kAcc) continue;
    const NdSbp& in = a.values[static_cast<size_t>(node.inputs[0])].nd_sbp;
    const NdSbp& out = a.values[static_cast<size_t>(node.outputs[0])].nd_sbp;
    EXPECT_EQ(in, out) << node.op;
    EXPECT_TRUE(EdgesInto(a, node.id).empty()) << node.op;
    if (node.kind == graph::NodeKind::kRepeat) {
      ++repeats;
      EXPECT_EQ(out, (NdSbp{kB, kB}));
    } else {
      // acc of a partial gradient (or of the per-micro-batch loss) stays partial.
      EXPECT_EQ(out, (NdSbp{kP, kB})) << node.scope;
      if (node.scope.rfind("accumulate/", 0) == 0) ++gradient_accs;
    }
  }
  EXPECT_EQ(repeats, 4);
  EXPECT_EQ(gradient_accs, 4);
  ExpectOneAllReducePerGradient(graph, a);
}

// ZeRO: the MLP over 4 data-parallel ranks, each stage, with 4 micro-batches.
struct ZeroRun {
  Graph graph;
  SbpAssignment a;
};
ZeroRun InferZero(int stage, int64_t micro_batches) {
  ZeroRun run{BuildMlp(), {}};
  auto gradients = graph::Autodiff(run.graph);
  EXPECT_TRUE(gradients.ok()) << gradients.status();
  graph::GradientMap grads = *gradients;
  if (micro_batches > 1) {
    auto accumulated = graph::AccumulateGradients(run.graph, grads, micro_batches);
    EXPECT_TRUE(accumulated.ok()) << accumulated.status();
    grads = accumulated->gradients;
  }
  if (stage == 3) {
    auto gathered = graph::GatherPerReader(run.graph, grads);
    EXPECT_TRUE(gathered.ok()) << gathered.status();
    grads = gathered->gradients;
  }
  EXPECT_TRUE(graph::ApplyOptimizer(run.graph, grads, {}).ok());
  EXPECT_TRUE(graph::EliminateDeadCode(run.graph).ok());
  SbpInferOptions options;
  options.zero_stage = stage;
  auto a = InferSbp(run.graph, MakeMesh(4, 1), options);
  EXPECT_TRUE(a.ok()) << a.status();
  if (a.ok()) run.a = *std::move(a);
  return run;
}

// Each variable and its state lie S(k) over data parallel (fc2.bias, 3 long,
// has no axis of 4 and stays B); the update runs on the shard from a
// reduce-scattered gradient, with no boxing into any variable; readers get
// the variable all-gathered: once per iteration in stages 1 and 2 (before
// the repeat), per reader in stage 3 (forward and backward); stage 2
// reduce-scatters each micro-batch's gradient into a sharded accumulator.
TEST(SbpInferTest, ZeroShardsVariablesAndStateOverDataParallel) {
  for (int stage : {1, 2, 3}) {
    for (int64_t micro : {1, 4}) {
      SCOPED_TRACE(StrCat("stage ", stage, ", ", micro, " micro-batches"));
      const ZeroRun run = InferZero(stage, micro);
      const Graph& graph = run.graph;
      const SbpAssignment& a = run.a;
      ASSERT_EQ(a.values.size(), static_cast<size_t>(graph.num_values()));
      for (const BoxingEdge& e : a.edges) EXPECT_NE(e.kind, BoxingEdgeKind::kVariableUpdate) << e.description;
      int sharded = 0;
      for (ValueId var : graph.Variables()) {
        const std::string& name = graph.value(var).name;
        const NdSbp& layout = a.values[static_cast<size_t>(var)].nd_sbp;
        const bool short_bias = name == "fc2.bias" || name.rfind("fc2.bias.", 0) == 0;
        EXPECT_EQ(layout, short_bias ? (NdSbp{kB, kB}) : (NdSbp{kS0, kB})) << name;
        if (!graph.variable_info(var).trainable || short_bias) continue;
        ++sharded;
        const graph::Node& update = UpdateNode(graph, var);
        for (ValueId out : update.outputs) EXPECT_EQ(a.values[static_cast<size_t>(out)].nd_sbp, layout) << name;
        // The gradient: reduce-scattered into the update, or (stage 2 with
        // micro-batches) into its accumulator.
        std::vector<std::string> scatters;
        for (const BoxingEdge& e : a.edges) {
          if (e.kind == BoxingEdgeKind::kOpInput && e.description == "dp: P -> S(0) (reduce-scatter)" &&
              graph.value(e.value).meta == graph.value(var).meta &&
              (e.consumer == update.id || graph.node(e.consumer).scope == StrCat("accumulate/", name))) {
            scatters.push_back(graph.node(e.consumer).op);
          }
        }
        ASSERT_EQ(scatters.size(), 1u) << name << "\n" << a.ToText(graph);
        EXPECT_EQ(scatters[0], stage >= 2 && micro > 1 ? "acc" : "adamw_update") << name;
        // Its gathers: conversions S(0) -> B of it (or of what holds it
        // back), each (value, layout) once (edges are per consumer).
        std::set<ValueId> gathered;
        for (const BoxingEdge& e : a.edges) {
          if (e.description != "dp: S(0) -> B (all-gather)") continue;
          ValueId v = e.value;
          while (graph.producer(v).kind == graph::NodeKind::kRepeat || graph.producer(v).op == "depend") {
            v = graph.producer(v).inputs[0];
          }
          if (v == var) gathered.insert(e.value);
        }
        const int gathers = static_cast<int>(gathered.size());
        // fc1.weight is read by its forward matmul and by the backward
        // matmul making the gradient of x... which x does not need: one
        // reader; fc2.weight: forward and backward; biases: forward only.
        const int readers = name == "fc2.weight" ? 2 : 1;
        EXPECT_EQ(gathers, stage == 3 ? readers : 1) << name << "\n" << a.ToText(graph);
      }
      EXPECT_EQ(sharded, 3);
    }
  }
}

// ZeRO-3: a reader that cannot take a sharded variable gathered is an error
// naming the variable, which it reads through a repeat and a depend of its
// own (without a name). (In stages 1 and 2 only the repeat reads the
// variable, gathered once; its readers may convert it further.)
TEST(SbpInferTest, ZeroConstraintErrorsNameTheVariable) {
  graph::GraphBuilder b;
  graph::Sym x = b.Input("x", {DType::kF32, Shape{8, 4}});
  graph::Sym w = b.Variable("proj.weight", {4, 8}, graph::InitRule::Normal(0, 1, 4, 0));
  graph::Sym y = graph::Matmul(x, w);
  // Columns split over data parallelism: only w split by columns gives
  // that, and ZeRO-3 hands the matmul w whole.
  b.SetHints(y, std::nullopt, NdSbp{Sbp::Split(1), kB});
  b.MarkLoss(graph::ReduceMean(y * y));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = graph::Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  auto accumulated = graph::AccumulateGradients(graph, *gradients, 2);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  auto gathered = graph::GatherPerReader(graph, accumulated->gradients);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  ASSERT_TRUE(graph::ApplyOptimizer(graph, gathered->gradients, {}).ok());
  ASSERT_TRUE(graph::EliminateDeadCode(graph).ok());
  SbpInferOptions options;
  options.zero_stage = 3;
  auto a = InferSbp(graph, MakeMesh(4, 1), options);
  ASSERT_FALSE(a.ok()) << a->ToText(graph);
  EXPECT_CONTAINS(a.status().message(), "no SBP signature of op 'matmul'");
  EXPECT_CONTAINS(a.status().message(), "reads ZeRO-sharded 'proj.weight' gathered as (B, B)");
}

TEST(SbpInferTest, ConflictingHintsNameTheOpTheHintsAndTheNearestSignatures) {
  ColRow cr = BuildColRow();
  // gelu has no partial-sum signature.
  ASSERT_TRUE(cr.graph.SetHints(cr.h, std::nullopt, NdSbp{kS0, kP}).ok());
  auto a = InferSbp(cr.graph, MakeMesh(4, 2));
  ASSERT_FALSE(a.ok());
  const std::string message(a.status().message());
  EXPECT_CONTAINS(message, "no SBP signature of op 'gelu' (node 4, scope 'mlp')");
  EXPECT_CONTAINS(message, "output 0 (%4) hinted (S(0), P)");
  EXPECT_CONTAINS(message,
                  "nearest valid signatures (1 entry differing): (S(0), S(0)) -> (S(0), S(0)) | "
                  "(S(0), S(1)) -> (S(0), S(1)) | (S(0), B) -> (S(0), B)");
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(SbpInferTest, OptimizerStateHintAgainstItsVariableIsAnError) {
  ColRow cr = BuildColRow();
  Train(cr);
  const ValueId m = *cr.graph.FindVariable("mlp.c_fc.weight.adam_m");
  ASSERT_TRUE(cr.graph.SetHints(m, std::nullopt, NdSbp{kB, kS0}).ok());
  auto a = InferSbp(cr.graph, MakeMesh(4, 2));
  ASSERT_FALSE(a.ok());
  const std::string message(a.status().message());
  EXPECT_CONTAINS(message, "no SBP signature of op 'adamw_update'");
  EXPECT_CONTAINS(message, "scope 'optimizer/mlp.c_fc.weight'");
  EXPECT_CONTAINS(message, "updates variable 'mlp.c_fc.weight' laid out (B, S(1))");
  EXPECT_CONTAINS(message, "updates variable 'mlp.c_fc.weight.adam_m' laid out (B, S(0))");
  EXPECT_CONTAINS(message, "nearest valid signatures (1 entry differing)");
}

TEST(SbpInferTest, MalformedHintsAreErrors) {
  {
    ColRow cr = BuildColRow();
    ASSERT_TRUE(cr.graph.SetHints(cr.x, std::nullopt, NdSbp{kS0}).ok());
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "hint (S(0)) of %0 'x' (f32(8, 16)) needs 2 entries");
  }
  {
    ColRow cr = BuildColRow({kB, Sbp::Split(2)});
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "splits axis 2, outside the value's rank 2");
  }
  {
    ColRow cr = BuildColRow();
    Train(cr);
    const ValueId update = cr.graph.variable_updates().at(cr.w1);
    ASSERT_TRUE(cr.graph.SetHints(update, std::nullopt, NdSbp{kB, kB}).ok());
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "is hinted (B, B) but updates variable 'mlp.c_fc.weight' laid out (B, S(1))");
  }
  // A graph input or a variable as a partial sum: each rank's whole copy
  // was taken for one term (the values came out doubled on two ranks).
  {
    ColRow cr = BuildColRow({kP, kB});
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "hint (P, B) of");
    EXPECT_CONTAINS(a.status().message(), "a variable is split or broadcast, never partial (P)");
  }
  {
    ColRow cr = BuildColRow();
    ASSERT_TRUE(cr.graph.SetHints(cr.x, std::nullopt, NdSbp{kB, kP}).ok());
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "a graph input is split or broadcast, never partial (P)");
  }
  // A placement hint (not built yet) is an error, not ignored.
  {
    ColRow cr = BuildColRow();
    ASSERT_TRUE(cr.graph.SetHints(cr.x, *ParsePlacement("cpu:5-6"), std::nullopt).ok());
    auto a = InferSbp(cr.graph, MakeMesh(4, 2));
    ASSERT_FALSE(a.ok());
    EXPECT_CONTAINS(a.status().message(), "has a placement hint (cpu:{5,6}@[2]), which is not supported yet");
  }
}

TEST(SbpInferTest, HintsOnAnAxisOfOneDeviceAreCanonicalised) {
  // Column / row hints on a mesh without tensor parallelism mean all-B.
  ColRow cr = BuildColRow();
  Train(cr);
  const SbpAssignment a = Infer(cr.graph, MakeMesh(2, 1));
  EXPECT_EQ(a.values[static_cast<size_t>(cr.w1)].nd_sbp, (NdSbp{kB, kB}));
  EXPECT_EQ(a.values[static_cast<size_t>(cr.h)].nd_sbp, (NdSbp{kS0, kB}));
  ExpectOneAllReducePerGradient(cr.graph, a);
}

TEST(SbpInferTest, TieBreakKeepsLayoutsAndBroadcastsConstants) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{8, 5}});
  Sym w = b.Variable("w", {5, 5}, InitRule::Zeros());
  Sym zeros = b.Apply("zeros", {}, {{"shape", std::vector<int64_t>{8, 5}}});
  Sym h = Matmul(x, w) + zeros;  // matmul: S(0) x B -> S(0) beats the equally free P x B -> P
  Sym g = Gelu(Matmul(w, w));    // B stays B rather than slicing for free
  b.MarkFetch("h", h);
  b.MarkFetch("g", g);
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const SbpAssignment a = Infer(*graph, MakeMesh(4, 1));
  auto layout = [&](const Sym& s) { return a.values[static_cast<size_t>(s.id())].nd_sbp; };
  EXPECT_EQ(layout(zeros), (NdSbp{kB, kB}));  // an op without inputs: B, not its first signature S(0)
  EXPECT_EQ(layout(h), (NdSbp{kS0, kB}));
  EXPECT_EQ(layout(g), (NdSbp{kB, kB}));
  // The constant is sliced where it meets the split activation: an edge of cost 0.
  const std::vector<BoxingEdge> into_add = EdgesInto(a, graph->value(h.id()).producer);
  ASSERT_EQ(into_add.size(), 1u) << a.ToText(*graph);
  EXPECT_EQ(into_add[0].value, zeros.id());
  EXPECT_EQ(into_add[0].description, "dp: B -> S(0) (local slice)");
  EXPECT_EQ(into_add[0].cost, 0);
}

TEST(SbpInferTest, AReshapeKeepsANestedSplitOnlyWhereEveryPieceLinesUp) {
  // x (B, 8, 4) split on the batch over both axes of a 2 x 2 mesh, then
  // flattened to (B*8, 4): each axis alone maps S(0) to S(0) when B splits
  // evenly over 2, but the tensor axis splits the data axis's piece. B = 8
  // nests evenly (8 -> 4 -> 2); B = 10 does not (10 -> 5 -> 3, 2, while 80
  // rows split 40 -> 20, 20), so the reshape may not keep (S(0), S(0)) there.
  for (const int64_t batch : {8, 10}) {
    GraphBuilder b;
    Sym x = b.Input("x", {DType::kF32, Shape{batch, 8, 4}});
    Sym r = graph::Reshape(x, Shape{batch * 8, 4});
    Sym y = graph::Relu(r);
    b.MarkFetch("y", y);
    auto graph = b.Finish();
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(graph->SetHints(x.id(), std::nullopt, NdSbp{kS0, kS0}).ok());
    ASSERT_TRUE(graph->SetHints(y.id(), std::nullopt, NdSbp{kS0, kS0}).ok());
    const SbpAssignment a = Infer(*graph, MakeMesh(4, 2));
    const graph::NodeId reshape = graph->value(r.id()).producer;
    const NdSbp out = a.values[static_cast<size_t>(r.id())].nd_sbp;
    if (batch == 8) {
      EXPECT_EQ(out, (NdSbp{kS0, kS0})) << a.ToText(*graph);
      EXPECT_TRUE(EdgesInto(a, reshape).empty()) << a.ToText(*graph);
    } else {
      // Some boxing around the reshape now (before or after it).
      EXPECT_NE(out, (NdSbp{kS0, kS0})) << a.ToText(*graph);
      EXPECT_FALSE(EdgesInto(a, reshape).empty() && EdgesInto(a, graph->value(y.id()).producer).empty())
          << a.ToText(*graph);
    }
  }
  // The op's own check, device by device.
  const ops::OpSchema* reshape = ops::BuiltinOps().Find("reshape");
  ASSERT_NE(reshape, nullptr);
  const auto valid = [&](int64_t batch, const NdSbp& in, const NdSbp& out, std::vector<int64_t> hierarchy) {
    return reshape->NdSbpValid({{DType::kF32, Shape{batch, 8, 4}}}, {{DType::kF32, Shape{batch * 8, 4}}}, {in}, {out},
                               hierarchy);
  };
  EXPECT_TRUE(valid(8, {kS0, kS0}, {kS0, kS0}, {2, 2}));
  EXPECT_FALSE(valid(10, {kS0, kS0}, {kS0, kS0}, {2, 2}));
  EXPECT_TRUE(valid(10, {kS0, kB}, {kS0, kB}, {2, 2}));
  EXPECT_TRUE(valid(10, {kS0, kP}, {kS0, kP}, {2, 2}));
  EXPECT_TRUE(valid(12, {kS0, kS0}, {kS0, kS0}, {2, 3}));   // 12 -> 6 -> 2, 2, 2
  EXPECT_FALSE(valid(12, {kS0, kS0}, {kS0, kS0}, {3, 3}));  // 12 -> 4 -> 2, 1, 1
  EXPECT_FALSE(valid(8, {kS0, kS1}, {kS0, kS0}, {2, 2}));   // different elements
}

TEST(SbpInferTest, ResultsAreDeterministic) {
  ColRow cr = BuildColRow();
  Train(cr);
  const DeviceMesh pipeline = MakeMesh(/*world=*/8, /*tensor=*/2, /*pipeline=*/2, /*layers=*/2);
  const Graph copy = cr.graph;
  const SbpAssignment first = Infer(cr.graph, MakeMesh(4, 2));
  const SbpAssignment second = Infer(copy, MakeMesh(4, 2));
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.ToText(cr.graph), second.ToText(copy));
  EXPECT_FALSE(first.edges.empty());
  const Graph mlp = [] {
    Graph g = BuildMlp();
    Train(g);
    return g;
  }();
  EXPECT_EQ(Infer(mlp, pipeline), Infer(mlp, pipeline));
}

}  // namespace
}  // namespace tessera::scheduler
