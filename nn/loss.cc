#include "nn/loss.h"

#include <vector>

#include "core/text.h"

namespace tessera::nn {

Sym LMLogits::Forward(const Sym& x, const Sym& word_embeddings) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  const Shape s = x.shape();
  const Shape w = word_embeddings.shape();
  if (s.rank() < 2 || w.rank() != 2 || s[s.rank() - 1] != w[1]) {
    b->Fail(absl::InvalidArgumentError(StrCat("LMLogits '", full_name(), "': x (..., C) and word embeddings (V, C) ",
                                              "do not match: ", s.ToString(), " and ", w.ToString())));
    return Sym();
  }
  const bool flatten = s.rank() > 2;
  const Sym x2 = flatten ? graph::Reshape(x, Shape{-1, w[1]}) : x;             // (N, C)
  const Sym logits = graph::Matmul(x2, word_embeddings, {.transpose_b = true});  // (N, V)
  if (!flatten) return logits;
  std::vector<int64_t> dims = s.dims();
  dims.back() = w[0];
  return graph::Reshape(logits, Shape(dims));
}

Sym ParallelCrossEntropyLoss::Forward(const Sym& logits, const Sym& labels) {
  GraphBuilder* b = Prepare(logits);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  const Sym losses = Losses(*b, logits, labels);
  return losses.valid() ? graph::ReduceMean(losses) : Sym();
}

ParallelCrossEntropyLoss::Weighted ParallelCrossEntropyLoss::Forward(const Sym& logits, const Sym& labels,
                                                                     const Sym& weights) {
  GraphBuilder* b = Prepare(logits);
  if (b == nullptr) return {};
  auto scope = EnterScope(*b);
  // 2-D logits (N, V) take labels of any shape with N elements.
  const Shape& s = logits.shape();
  const bool flatten = s.rank() == 2 && labels.rank() > 1 && labels.shape().NumElements() == s[0];
  const Sym losses = Losses(*b, logits, flatten ? graph::Reshape(labels, Shape{s[0]}) : labels);  // (N, 1)
  if (!losses.valid() || !weights.valid()) return {};
  const Shape& l = labels.shape();
  const Shape& w = weights.shape();
  const absl::StatusOr<Shape> broadcast = BroadcastShapes(l, w);
  if (!broadcast.ok() || *broadcast != l) {
    b->Fail(absl::InvalidArgumentError(StrCat("ParallelCrossEntropyLoss '", full_name(), "': weights ", w.ToString(),
                                              " do not broadcast to the labels' shape ", l.ToString())));
    return {};
  }
  // each weight stands for NumElements(labels) / NumElements(weights) tokens
  const double tokens_per_weight = static_cast<double>(l.NumElements()) / static_cast<double>(w.NumElements());
  return {.mean = graph::ReduceMean(losses),
          .weighted_sum = graph::ReduceSum(graph::Reshape(losses, l) * weights),
          .weight = graph::ReduceSum(weights) * tokens_per_weight};
}

Sym ParallelCrossEntropyLoss::Losses(GraphBuilder& b, const Sym& logits, const Sym& labels) {
  const Shape s = logits.shape();
  if (s.rank() < 2 || labels.shape() != Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 1))) {
    b.Fail(absl::InvalidArgumentError(
        StrCat("ParallelCrossEntropyLoss '", full_name(), "': logits (..., V) of rank >= 2 ",
               "and labels (...) do not match: ", s.ToString(), " and ", labels.shape().ToString())));
    return Sym();
  }
  const int64_t V = s[s.rank() - 1];
  const Sym flat = s.rank() > 2 ? graph::Reshape(logits, Shape{-1, V}) : logits;  // (N, V)
  const Sym ids = labels.rank() > 1 ? graph::Reshape(labels, Shape{-1}) : labels;  // (N,)
  const Sym row_max = b.Apply("reduce_max", {flat}, {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  const std::vector<Sym> parts = b.Op("cross_entropy_partials", {flat, row_max, ids});  // (N, 1) each
  if (parts.size() != 2) return Sym();
  return graph::Log(parts[0]) - parts[1];
}

}  // namespace tessera::nn
