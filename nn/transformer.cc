#include "nn/transformer.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/text.h"

namespace tessera::nn {
namespace {

// (..., C) -> (rows, C); 2-D inputs pass unchanged.
Sym Flatten(const Sym& x, int64_t features) {
  return x.rank() > 2 ? graph::Reshape(x, Shape{-1, features}) : x;
}

// (rows, C) back to `like`'s shape.
Sym Unflatten(const Sym& y, const Sym& like) {
  return like.rank() > 2 ? graph::Reshape(y, like.shape()) : y;
}

bool CheckLastAxis(GraphBuilder& b, const Module& m, const Sym& x, int64_t features, int min_rank) {
  const Shape s = x.shape();
  if (s.rank() >= min_rank && s[s.rank() - 1] == features) return true;
  b.Fail(absl::InvalidArgumentError(StrCat("'", m.full_name(), "' takes (..., ", features, ") of rank >= ", min_rank,
                                           ", got ", s.ToString())));
  return false;
}

}  // namespace

// ---- MLP

MLP::MLP(int64_t hidden, int64_t ffn_hidden, MlpOptions options)
    : Module(options.layer_idx),
      c_fc_(hidden, ffn_hidden,
            {.parallel = Parallel::kColumn, .layer_idx = options.layer_idx, .init_std = options.init_std}),
      c_proj_(ffn_hidden, hidden,
              {.parallel = Parallel::kRow, .layer_idx = options.layer_idx, .init_std = options.output_init_std}),
      dropout_(options.output_dropout_prob, options.layer_idx),
      gelu_approximate_(std::move(options.gelu_approximate)),
      bias_gelu_fusion_(options.bias_gelu_fusion) {
  RegisterModule("c_fc", c_fc_);
  RegisterModule("c_proj", c_proj_);
  RegisterModule("dropout", dropout_);
}

Sym MLP::Forward(const Sym& x) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  if (!CheckLastAxis(*b, *this, x, c_fc_.in_features(), 2)) return Sym();
  // (N, F), S(1) over tp; "tanh": GPT-2's gelu_new
  const Sym h = c_fc_.ForwardGelu(Flatten(x, c_fc_.in_features()), gelu_approximate_, bias_gelu_fusion_);
  Sym y = dropout_(c_proj_(h));                                                         // (N, C)
  return Unflatten(y, x);
}

// ---- FusedQKV

FusedQKV::FusedQKV(int64_t hidden, int64_t layer_idx, double init_std) : Module(layer_idx) {
  DeclareParameter({"weight", Shape{hidden, 3, hidden}, ParameterInit::Normal(init_std), TensorParallelSplit(2)});
  DeclareParameter({"bias", Shape{3, hidden}, ParameterInit::Zeros(), TensorParallelSplit(1)});
}

FusedQKV::Output FusedQKV::Forward(const Sym& x) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return {};
  auto scope = EnterScope(*b);
  const int64_t C = parameter("weight").shape()[0];
  if (x.rank() != 2 || x.shape()[1] != C) {
    b->Fail(absl::InvalidArgumentError(StrCat("'", full_name(), "' takes (N, ", C, "), got ", x.shape().ToString())));
    return {};
  }
  const std::vector<int64_t> thirds = {1, 1, 1};
  const std::vector<Sym> w = b->Op("split", {parameter("weight")}, {{"axis", int64_t{1}}, {"sizes", thirds}});
  const std::vector<Sym> bias = b->Op("split", {parameter("bias")}, {{"axis", int64_t{0}}, {"sizes", thirds}});
  if (w.size() != 3 || bias.size() != 3) return {};  // the builder holds the error
  Sym out[3];
  for (size_t i = 0; i < 3; ++i) {
    const Sym wi = graph::Reshape(w[i], Shape{C, C});     // (C, 1, C) S(2) -> (C, C) S(1)
    const Sym bi = graph::Reshape(bias[i], Shape{C});     // (1, C) S(1) -> (C,) S(0)
    out[i] = graph::MatmulBias(x, wi, bi);                // (N, C), S(1) over tp
  }
  return {out[0], out[1], out[2]};
}

// ---- MultiheadAttention

MultiheadAttention::MultiheadAttention(int64_t hidden, int64_t num_heads, AttentionOptions options)
    : Module(options.layer_idx),
      hidden_(hidden),
      num_heads_(num_heads),
      options_(options),
      c_attn_(hidden, options.layer_idx, options.init_std),
      c_proj_(hidden, hidden,
              {.parallel = Parallel::kRow, .layer_idx = options.layer_idx, .init_std = options.output_init_std}),
      attn_dropout_(options.attention_dropout_prob, options.layer_idx),
      resid_dropout_(options.output_dropout_prob, options.layer_idx) {
  RegisterModule("c_attn", c_attn_);
  RegisterModule("c_proj", c_proj_);
  RegisterModule("attn_dropout", attn_dropout_);
  RegisterModule("resid_dropout", resid_dropout_);
}

Sym MultiheadAttention::Forward(const Sym& x, const Sym& padding_mask) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  if (num_heads_ < 1 || hidden_ % num_heads_ != 0) {
    b->Fail(absl::InvalidArgumentError(StrCat("MultiheadAttention '", full_name(), "': hidden size ", hidden_,
                                              " is not a multiple of the number of heads ", num_heads_)));
    return Sym();
  }
  const Shape s = x.shape();
  if (s.rank() != 3 || s[2] != hidden_) {
    b->Fail(absl::InvalidArgumentError(
        StrCat("MultiheadAttention '", full_name(), "' takes (B, T, ", hidden_, "), got ", s.ToString())));
    return Sym();
  }
  const int64_t B = s[0], T = s[1], C = hidden_, H = num_heads_, D = C / H;
  if (padding_mask.valid() && (padding_mask.dtype() != DType::kBool || padding_mask.shape() != Shape{B, T})) {
    b->Fail(absl::InvalidArgumentError(StrCat("MultiheadAttention '", full_name(), "': padding_mask must be bool (",
                                              B, ", ", T, "), got ", padding_mask.meta().ToString())));
    return Sym();
  }
  const FusedQKV::Output qkv = c_attn_.Forward(graph::Reshape(x, Shape{B * T, C}));  // each (B·T, C)
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Sym context;  // (B·T, C), S(1) over tp
  if (options_.fused) {
    // The fused op reads the heads of (B·T, C) in place as (B, T, H, D)
    // (layout "bthd", a reshape the lowering folds into a view) and writes
    // the context so: no transposes either way.
    if (!(options_.attention_dropout_prob >= 0 && options_.attention_dropout_prob < 1)) {
      b->Fail(absl::InvalidArgumentError(StrCat("MultiheadAttention '", full_name(),
                                                "': attention_dropout_prob must be in [0, 1), got ",
                                                options_.attention_dropout_prob)));
      return Sym();
    }
    // The fused op drops the probabilities exactly as attn_dropout would.
    ops::AttrMap attrs = attn_dropout_.NextDrawAttrs();
    attrs.Set("scale", scale);
    attrs.Set("causal", options_.causal);
    attrs.Set("layout", std::string("bthd"));
    auto heads = [&](const Sym& t) { return graph::Reshape(t, Shape{B, T, H, D}); };
    const Sym q = heads(qkv.q), k = heads(qkv.k), v = heads(qkv.v);
    const std::vector<Sym> out = padding_mask.valid()
                                     ? b->Op("flash_attention_masked", {q, k, v, padding_mask}, attrs)
                                     : b->Op("flash_attention", {q, k, v}, attrs);
    if (out.size() != 2) return Sym();  // the builder holds the error
    context = graph::Reshape(out[0], Shape{B * T, C});
  } else {
    auto heads = [&](const Sym& t) {  // -> (B, H, T, D)
      return graph::Transpose(graph::Reshape(t, Shape{B, T, H, D}), {0, 2, 1, 3});
    };
    context = UnfusedAttention(*b, heads(qkv.q), heads(qkv.k), heads(qkv.v), padding_mask, scale);
    context = graph::Reshape(graph::Transpose(context, {0, 2, 1, 3}), Shape{B * T, C});
  }
  const Sym y = resid_dropout_(c_proj_(context));                                       // (B·T, C)
  return graph::Reshape(y, Shape{B, T, C});
}

Sym MultiheadAttention::UnfusedAttention(GraphBuilder& builder, const Sym& q, const Sym& k, const Sym& v,
                                         const Sym& padding_mask, double scale) {
  GraphBuilder* b = &builder;
  const int64_t B = q.shape()[0], T = q.shape()[2];
  const Sym scores = graph::BatchMatmul(q, k, {.transpose_b = true});  // (B, H, T, T), unscaled
  Sym probs;
  if (padding_mask.valid()) {
    const Sym mask = graph::Reshape(padding_mask, Shape{B, 1, 1, T});
    probs = b->Apply("fused_scale_mask_softmax", {scores, mask}, {{"scale", scale}, {"causal", options_.causal}});
  } else if (options_.causal) {
    probs = b->Apply("fused_scale_causal_softmax", {scores}, {{"scale", scale}});
  } else {
    probs = graph::Softmax(scores * scale);
  }
  probs = attn_dropout_(probs);
  return graph::BatchMatmul(probs, v);  // (B, H, T, D)
}

// ---- TransformerLayer

TransformerLayer::TransformerLayer(int64_t hidden, int64_t num_heads, int64_t ffn_hidden,
                                   TransformerLayerOptions options)
    : Module(options.layer_idx),
      post_layernorm_(options.post_layernorm),
      ln_1_(hidden, {.eps = options.layernorm_epsilon, .layer_idx = options.layer_idx}),
      attn_(hidden, num_heads,
            {.causal = options.causal,
             .attention_dropout_prob = options.attention_dropout_prob,
             .output_dropout_prob = options.output_dropout_prob,
             .layer_idx = options.layer_idx,
             .init_std = options.init_std,
             .output_init_std = options.output_init_std,
             .fused = options.fused_attention}),
      ln_2_(hidden, {.eps = options.layernorm_epsilon, .layer_idx = options.layer_idx}),
      mlp_(hidden, ffn_hidden,
           {.output_dropout_prob = options.output_dropout_prob,
            .gelu_approximate = options.gelu_approximate,
            .bias_gelu_fusion = options.bias_gelu_fusion,
            .layer_idx = options.layer_idx,
            .init_std = options.init_std,
            .output_init_std = options.output_init_std}) {
  RegisterModule("ln_1", ln_1_);
  RegisterModule("attn", attn_);
  RegisterModule("ln_2", ln_2_);
  RegisterModule("mlp", mlp_);
}

Sym TransformerLayer::Forward(const Sym& x, const Sym& padding_mask) {
  GraphBuilder* b = Prepare(x);
  if (b == nullptr) return Sym();
  auto scope = EnterScope(*b);
  // The layer is one recomputable segment: with
  // train.activation_checkpoint.enabled, backward recomputes it from x.
  auto segment = b->Recomputable();
  // The residual stream is hinted (S(0), B): batch-split over dp, whole on
  // every tp rank (LiBai's to_global(sbp=[S(0), B]) at the same points). It
  // makes SBP inference take the Megatron layout: column matmuls B x S(1)
  // from it, and one P -> B all-reduce (or reduce-scatter + all-gather)
  // after each row-parallel projection back into it. The layer norms'
  // outputs (the column-parallel inputs) are hinted the same: forward they
  // are so anyway; backward (autodiff gives a hinted value's gradient its
  // hint) their gradient is all-reduced there, Megatron's f, and the norms'
  // own gradients are whole on every tp rank with no communication.
  const auto stream = [&](const Sym& s) {
    b->SetHints(s, std::nullopt, BatchSplit());
    return s;
  };
  if (post_layernorm_) {  // BERT: the sums and their norms are the stream
    const Sym h = stream(ln_1_(stream(x + attn_(x, padding_mask))));
    return stream(ln_2_(stream(h + mlp_(h))));
  }
  const Sym a = ln_1_(x);
  b->SetHints(a, std::nullopt, BatchSplit());
  const Sym h = x + attn_(a, padding_mask);  // (B, T, C)
  b->SetHints(h, std::nullopt, BatchSplit());
  const Sym m = ln_2_(h);
  b->SetHints(m, std::nullopt, BatchSplit());
  const Sym y = h + mlp_(m);
  b->SetHints(y, std::nullopt, BatchSplit());
  return y;
}

}  // namespace tessera::nn
