// Graph IR, builder, printing and dead-code elimination.

#include <gtest/gtest.h>

#include <cmath>

#include "core/text.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/graph/test_mlp.h"

namespace tessera::graph {
namespace {

TEST(GraphBuilderTest, InfersShapesAndOperators) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
  Sym w = b.Variable("w", {3, 2}, InitRule::Ones());
  Sym y = Matmul(x, w);
  EXPECT_EQ(y.shape(), (Shape{4, 2}));
  Sym z = (y * 2.0 + y) / y - 1.0;
  EXPECT_EQ(z.shape(), (Shape{4, 2}));
  EXPECT_EQ(b.graph().producer(z.id()).op, "scalar_add");
  EXPECT_EQ(ReduceMean(z).shape(), Shape{});
  EXPECT_TRUE(b.status().ok()) << b.status();
}

TEST(GraphBuilderTest, BadMatmulNamesOpAndShapes) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{8, 5}});
  Sym w = b.Variable("w", {7, 3}, InitRule::Zeros());
  Sym y = Matmul(x, w);
  EXPECT_FALSE(y.valid());
  ASSERT_FALSE(b.status().ok());
  const std::string message(b.status().message());
  EXPECT_CONTAINS(message, "matmul");
  EXPECT_CONTAINS(message, "(8, 5)");
  EXPECT_CONTAINS(message, "(7, 3)");
  // Sticky: later calls are no-ops, Finish returns the first error.
  const int64_t nodes = b.graph().num_nodes();
  Sym r = Relu(y) + x;
  EXPECT_FALSE(r.valid());
  EXPECT_FALSE(b.Variable("v", {2}, InitRule::Zeros()).valid());
  EXPECT_EQ(b.graph().num_nodes(), nodes);
  auto graph = b.Finish();
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status(), b.status());
  EXPECT_CONTAINS(std::string(graph.status().message()), "matmul");
}

TEST(GraphBuilderTest, ErrorsOnBadVariablesInputsAndHandles) {
  GraphBuilder b;
  b.Variable("w", {2}, InitRule::Zeros());
  b.Variable("w", {3}, InitRule::Zeros());
  EXPECT_CONTAINS(std::string(b.status().message()), "'w' already exists");

  GraphBuilder c;
  c.Variable("w", {2}, InitRule{"relu", {}});
  EXPECT_CONTAINS(std::string(c.status().message()), "relu");

  // (Normal and Uniform check theirs in the op; fill takes -inf as an op.)
  for (const double value : {std::nan(""), -HUGE_VAL}) {
    GraphBuilder nan;
    nan.Variable("w", {2}, InitRule::Constant(value));
    EXPECT_CONTAINS(std::string(nan.status().message()), "variable 'w': init value ");
    EXPECT_CONTAINS(std::string(nan.status().message()), " is not finite");
  }
  // A dimension of 0 holds nothing: refused naming the variable or input
  // (Linear(3, 0), a batch of 0 trained to a NaN loss without a word).
  GraphBuilder empty_variable;
  empty_variable.Variable("fc.weight", {3, 0}, InitRule::Zeros());
  EXPECT_CONTAINS(std::string(empty_variable.status().message()),
                  "variable 'fc.weight': shape (3, 0) has a dimension of 0");
  GraphBuilder empty_input;
  empty_input.Input("x", {DType::kF32, Shape{0, 5}});
  EXPECT_CONTAINS(std::string(empty_input.status().message()), "graph input 'x': shape (0, 5) has a dimension of 0");

  GraphBuilder minus_inf_op;
  minus_inf_op.Apply("fill", {}, {{"shape", std::vector<int64_t>{2}}, {"value", -HUGE_VAL}});
  EXPECT_TRUE(minus_inf_op.status().ok()) << minus_inf_op.status();

  GraphBuilder d, e;
  Sym a = d.Input("a", {DType::kF32, Shape{2}});
  Sym other = e.Input("a", {DType::kF32, Shape{2}});
  d.Apply("add", {a, other});
  EXPECT_CONTAINS(std::string(d.status().message()), "another GraphBuilder");

  GraphBuilder f;
  f.Apply("no_such_op", {});
  EXPECT_FALSE(f.status().ok());
}

TEST(GraphBuilderTest, ScopesPrefixVariablesAndSetLayers) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 4}});
  Sym y;
  {
    auto block = b.Scope("h", 3);
    auto inner = b.Scope("0");
    Sym w = b.Variable("ln_1.weight", {4}, InitRule::Ones());
    EXPECT_EQ(b.graph().value(w.id()).name, "h.0.ln_1.weight");
    EXPECT_EQ(b.graph().producer(w.id()).layer_idx, 3);
    y = x * w;
  }
  EXPECT_EQ(b.graph().producer(y.id()).layer_idx, 3);
  EXPECT_EQ(b.graph().producer(y.id()).scope, "h.0");
  EXPECT_EQ(b.scope(), "");
  Sym z = Exp(y);
  EXPECT_EQ(b.graph().producer(z.id()).layer_idx, kUnassignedLayer);
  EXPECT_TRUE(b.graph().FindVariable("h.0.ln_1.weight").ok());
}

// A small graph to print: x (2, 3) @ w^T, w (4, 3).
Graph PrintableGraph() {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
  Sym w = b.Variable("w", {4, 3}, InitRule::Normal(0, 0.02, 42, 7));
  Sym bias = b.Variable("bias", {4}, InitRule::Zeros(), {.trainable = false});
  Sym y = Matmul(x, w, {.transpose_b = true}) + bias;
  b.MarkFetch("y", y);
  b.MarkLoss(ReduceSum(y));
  auto graph = b.Finish();
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *std::move(graph);
}

TEST(GraphPrintTest, Text) {
  const Graph graph = PrintableGraph();
  EXPECT_EQ(graph.ToText(),
            "%0 = input \"x\" : f32(2, 3)\n"
            "%1 = variable \"w\" {init=normal(seed=42, std=0.02, tensor_id=7)} : f32(4, 3)\n"
            "%2 = variable \"bias\" {init=zeros(), trainable=false} : f32(4,)\n"
            "%3 = matmul(%0, %1) {transpose_b=true} : f32(2, 4)\n"
            "%4 = add(%3, %2) : f32(2, 4)\n"
            "%5 = reduce_sum(%4) : f32()\n"
            "loss %5\n"
            "fetch \"y\" = %4\n");
}

TEST(GraphPrintTest, Dot) {
  const std::string dot = PrintableGraph().ToDot();
  EXPECT_CONTAINS(dot, "digraph tessera {");
  EXPECT_CONTAINS(dot, "n1 [label=\"variable w\", shape=ellipse];");
  EXPECT_CONTAINS(dot, "n3 [label=\"matmul\\n{transpose_b=true}\", shape=box];");
  EXPECT_CONTAINS(dot, "n0 -> n3 [label=\"%0 f32(2, 3)\"];");
  EXPECT_CONTAINS(dot, "n1 -> n3 [label=\"%1 f32(4, 3)\"];");
  EXPECT_CONTAINS(dot, "label=\"loss\"");
  EXPECT_EQ(dot.back(), '\n');
}

TEST(GraphPrintTest, HintsAndLayers) {
  GraphBuilder b;
  auto placement = ParsePlacement("cpu:0-1");
  auto sbp = ParseNdSbp("S(0)");
  ASSERT_TRUE(placement.ok() && sbp.ok());
  Sym w;
  {
    auto scope = b.Scope("h.1", 1);
    w = b.Variable("w", {4, 2}, InitRule::Zeros(), {.placement = *placement, .sbp = *sbp});
  }
  Sym x = b.Input("x", {DType::kF32, Shape{2, 4}});
  b.SetHints(x, std::nullopt, *ParseNdSbp("B"));
  ASSERT_TRUE(b.status().ok()) << b.status();
  const Graph& graph = b.graph();
  EXPECT_EQ(graph.value(w.id()).placement_hint, *placement);
  EXPECT_EQ(graph.value(w.id()).sbp_hint, *sbp);
  const std::string text = graph.ToText();
  EXPECT_CONTAINS(text, StrCat(" : f32(4, 2) @", placement->ToString(), " ", NdSbpToString(*sbp), "  # layer 1 scope h.1\n"));
  EXPECT_CONTAINS(text, StrCat(" : f32(2, 4) ", NdSbpToString(*ParseNdSbp("B")), "\n"));
}

TEST(DeadCodeTest, RemovesUnusedKeepsNeeded) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
  Sym unused_input = b.Input("unused", {DType::kF32, Shape{1}});
  Sym w = b.Variable("w", {3, 3}, InitRule::Ones());
  Sym dead_var = b.Variable("dead", {3}, InitRule::Ones());
  Sym counter = b.Variable("counter", {1}, InitRule::Zeros(), {.trainable = false});
  Sym y = Matmul(x, w);
  Sym dead = Exp(y) + dead_var;        // feeds nothing
  Sym dead2 = Tanh(dead);
  Sym next = counter + 1.0;            // kept: a variable update
  Sym loss = ReduceMean(y);
  b.MarkLoss(loss);
  b.MarkFetch("y", y);
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  ASSERT_TRUE(graph.SetVariableUpdate(counter.id(), next.id()).ok());
  const int64_t before = graph.num_nodes();

  auto remap = EliminateDeadCode(graph);
  ASSERT_TRUE(remap.ok()) << remap.status();
  EXPECT_EQ(graph.num_nodes(), before - 4);  // exp, add, tanh, variable "dead"
  for (ValueId gone : {dead.id(), dead2.id(), dead_var.id()}) EXPECT_EQ((*remap)[static_cast<size_t>(gone)], kNoValue);
  for (ValueId kept : {x.id(), unused_input.id(), w.id(), y.id(), loss.id(), counter.id(), next.id()}) {
    EXPECT_NE((*remap)[static_cast<size_t>(kept)], kNoValue) << kept;
  }
  const ValueId new_loss = (*remap)[static_cast<size_t>(loss.id())];
  EXPECT_EQ(graph.losses(), std::vector<ValueId>{new_loss});
  EXPECT_EQ(*graph.FindFetch("y"), (*remap)[static_cast<size_t>(y.id())]);
  EXPECT_EQ(graph.variable_updates().at((*remap)[static_cast<size_t>(counter.id())]),
            (*remap)[static_cast<size_t>(next.id())]);
  EXPECT_FALSE(graph.FindVariable("dead").ok());
  // Dense ids, and the graph still runs.
  for (int64_t i = 0; i < graph.num_nodes(); ++i) EXPECT_EQ(graph.node(i).id, i);
  for (int64_t i = 0; i < graph.num_values(); ++i) EXPECT_EQ(graph.value(i).id, i);
  testing::GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  auto values = interpreter.Run({{"x", Tensor::FromVector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6})},
                                 {"unused", Tensor::FromVector<float>(Shape{1}, {0})}});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_FLOAT_EQ((*values)[static_cast<size_t>(new_loss)].ToVector<float>()[0], 10.5f);  // mean of [6, 6, 6, 15, 15, 15]
  EXPECT_FLOAT_EQ(interpreter.GetVariable("counter")->ToVector<float>()[0], 1.0f);
}

TEST(DeadCodeTest, MlpHasNoDeadCode) {
  testing::TestMlp mlp = testing::BuildTestMlp();
  const int64_t before = mlp.graph.num_nodes();
  ASSERT_TRUE(EliminateDeadCode(mlp.graph).ok());
  EXPECT_EQ(mlp.graph.num_nodes(), before);
}

}  // namespace
}  // namespace tessera::graph
