#include "nn/layers.h"

#include <string>

#include "core/text.h"

namespace tessera::nn {

absl::StatusOr<Parallel> ParseParallel(std::string_view text) {
  if (text == "col") return Parallel::kColumn;
  if (text == "row") return Parallel::kRow;
  if (text == "data") return Parallel::kData;
  return absl::InvalidArgumentError(StrCat("unknown parallel mode '", text, "' (col, row or data)"));
}

std::string_view ParallelName(Parallel parallel) {
  switch (parallel) {
    case Parallel::kColumn:
      return "col";
    case Parallel::kRow:
      return "row";
    case Parallel::kData:
      return "data";
  }
  return "?";
}

// ---- Linear

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module(options.layer_idx), in_(in_features), out_(out_features), options_(options) {
  NdSbp weight_sbp = Replicated(), bias_sbp = Replicated();
  if (options_.parallel == Parallel::kColumn) {
    weight_sbp = TensorParallelSplit(1);
    bias_sbp = TensorParallelSplit(0);
  } else if (options_.parallel == Parallel::kRow) {
    weight_sbp = TensorParallelSplit(0);
  }
  DeclareParameter({"weight", Shape{in_, out_}, ParameterInit::Normal(options_.init_std), weight_sbp});
  if (options_.bias) DeclareParameter({"bias", Shape{out_}, ParameterInit::Zeros(), bias_sbp});
}

Sym Linear::Apply(const Sym& x, Epilogue epilogue, const std::string& approximate) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  const Shape shape = x.shape();  // a copy: Sym::shape() refers into the graph, which grows
  if (shape.rank() < 2 || shape[shape.rank() - 1] != in_) {
    b->Fail(absl::InvalidArgumentError(
        StrCat("Linear '", full_name(), "' takes (..., ", in_, ") of rank >= 2, got ", shape.ToString())));
    return Sym();
  }
  if (epilogue == Epilogue::kBiasGelu && !options_.bias) {
    b->Fail(absl::InvalidArgumentError(StrCat("Linear '", full_name(), "' has no bias to fuse with GELU")));
    return Sym();
  }
  const bool flatten = shape.rank() > 2;
  Sym x2 = flatten ? graph::Reshape(x, Shape{-1, in_}) : x;  // (rows, in)
  Sym y;                                                     // (rows, out)
  if (epilogue == Epilogue::kBiasGelu) {
    y = b->Apply("matmul_bias_gelu", {x2, weight(), bias()}, {{"approximate", approximate}});
  } else {
    // A row-parallel layer's product is a partial sum over tp: its bias is
    // added once the sum is whole (as Megatron's RowParallelLinear does), not
    // to every piece, so it stays a bias_add after the GEMM.
    const bool with_bias = epilogue == Epilogue::kBias && options_.bias;
    if (with_bias && options_.parallel != Parallel::kRow) {
      y = graph::MatmulBias(x2, weight(), bias());
    } else {
      y = graph::Matmul(x2, weight());
      if (with_bias) y = graph::BiasAdd(y, bias());
    }
  }
  if (!flatten) return y;
  std::vector<int64_t> out_dims = shape.dims();
  out_dims.back() = out_;
  return graph::Reshape(y, Shape(out_dims));
}

Sym Linear::Forward(const Sym& x) { return Apply(x, Epilogue::kBias); }
Sym Linear::ForwardWithoutBias(const Sym& x) { return Apply(x, Epilogue::kNone); }
Sym Linear::ForwardGelu(const Sym& x, const std::string& approximate, bool fused) {
  if (fused) return Apply(x, Epilogue::kBiasGelu, approximate);
  if (!options_.bias && x.builder() != nullptr) {
    x.builder()->Fail(absl::InvalidArgumentError(StrCat("Linear '", full_name(), "' has no bias to add before GELU")));
    return Sym();
  }
  const Sym h = ForwardWithoutBias(x);
  if (h.builder() == nullptr) return Sym();
  return h.builder()->Apply("bias_gelu", {h, bias()}, {{"approximate", approximate}});
}

// ---- Embedding, VocabEmbedding

Embedding::Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options)
    : Embedding(num_embeddings, dim, options, Replicated()) {}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options, NdSbp weight_sbp)
    : Module(options.layer_idx) {
  DeclareParameter({"weight", Shape{num_embeddings, dim}, ParameterInit::Normal(options.init_std), weight_sbp});
}

Sym Embedding::Forward(const Sym& ids) {
  GraphBuilder* b = Prepare(ids);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  return b->Apply("embedding", {weight(), ids});
}

VocabEmbedding::VocabEmbedding(int64_t vocab_size, int64_t dim, EmbeddingOptions options)
    : Embedding(vocab_size, dim, options, TensorParallelSplit(0)) {}

// ---- LayerNorm

LayerNorm::LayerNorm(int64_t hidden, LayerNormOptions options) : Module(options.layer_idx), options_(options) {
  DeclareParameter({"weight", Shape{hidden}, ParameterInit::Ones(), Replicated()});
  DeclareParameter({"bias", Shape{hidden}, ParameterInit::Zeros(), Replicated()});
}

Sym LayerNorm::Forward(const Sym& x) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  std::vector<Sym> out = b->Op("layer_norm", {x, parameter("weight"), parameter("bias")}, {{"eps", options_.eps}});
  return out.empty() ? Sym() : out[0];  // (y, mean, rstd): the statistics are for the backward
}

// ---- Dropout

Dropout::Dropout(double rate, int64_t layer_idx) : Module(layer_idx), rate_(rate) {}

ops::AttrMap Dropout::NextDrawAttrs() {
  if (rate_ == 0) return {{"dropout_rate", 0.0}};
  const int64_t key = StreamKey(StrCat(full_name(), "#", calls_++));
  return {{"dropout_rate", rate_}, {"seed", seeds().dropout}, {"tensor_id", key}};
}

Sym Dropout::Forward(const Sym& x) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  if (!(rate_ >= 0 && rate_ < 1)) {
    b->Fail(absl::InvalidArgumentError(StrCat("Dropout '", full_name(), "': rate must be in [0, 1), got ", rate_)));
    return Sym();
  }
  if (rate_ == 0) return x;
  auto scope = EnterScope(*b);
  const int64_t key = StreamKey(StrCat(full_name(), "#", calls_++));
  return b->Apply("dropout", {x}, {{"rate", rate_}, {"seed", seeds().dropout}, {"tensor_id", key}});
}

}  // namespace tessera::nn
