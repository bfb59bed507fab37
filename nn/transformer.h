#pragma once
// Transformer layers in global view (GPT-2 flavour, pre-LN): MLP,
// MultiheadAttention (with its fused QKV projection), TransformerLayer.
// Parameter names and layouts are Hugging Face GPT-2's (c_fc, c_proj,
// c_attn, ln_1, ln_2), except c_attn's documented 3-D view below.
//
// Fused QKV and tensor parallelism. HF stores c_attn.weight as (C, 3C) =
// [q | k | v] column blocks; a plain column split of that would cut across
// q, k and v instead of by heads. Tessera declares the same bytes with the
// logical shape (C, 3, C) — element (i, j, c) is HF's (i, j·C + c), so a
// loader only reshapes — hinted (B, S(2)): every tp rank holds, for each of
// q, k and v, the same block of output columns, i.e. the same heads when
// num_heads % tp == 0. c_attn.bias (3C) is declared (3, C), hinted (B, S(1)).
// The forward takes q, k, v with ONE `split` op along axis 1 (sizes 1, 1, 1;
// S(2) passes through, and its gradient is one `concat`, also S(2) -> S(2)),
// rather than three slices (whose gradients are three zero-filled full-size
// slice_grads summed): then per part a reshape (C, 1, C) -> (C, C)
// (S(2) -> S(1), exact for any split), a column-parallel matmul_bias
// (B, S(1), S(0)) -> S(1), reshape (B·T, C) -> (B, T, H, D) (S(1) -> S(2): exact
// when H % tp == 0); unfused, a transpose to heads (B, H, T, D) (S(2) ->
// S(1)), scores and the context then batch_matmuls split on the head axis
// (S(1)); fused, one flash_attention reading (B, T, H, D) as it is (S(2));
// c_proj is row-parallel (its matmul S(1) x S(0) -> P over tp).
//
// Not thread-safe. Shapes: B batch, T sequence, C hidden, H heads, D = C / H.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"

namespace tessera::nn {

// Weights of GPT-2's output projections (attn.c_proj, mlp.c_proj) are
// usually drawn with a smaller std (HF / LiBai: init_std / sqrt(2 · layers)).
struct MlpOptions {
  double output_dropout_prob = 0;
  // bias_gelu's `approximate`: "tanh" (GPT-2's gelu_new) or "none" (erf, BERT's).
  std::string gelu_approximate = "tanh";
  // c_fc, its bias and the GELU as one matmul_bias_gelu op (the GEMM's
  // epilogue; cuBLASLt's on GPUs); false: matmul, then bias_gelu.
  bool bias_gelu_fusion = false;
  int64_t layer_idx = 0;
  double init_std = 0.02;         // c_fc.weight
  double output_init_std = 0.02;  // c_proj.weight
};

// GPT-2's MLP: c_fc (C -> F, column parallel), GELU (fused with c_fc's GEMM
// and bias: matmul_bias_gelu, or with the bias only: bias_gelu; tanh
// approximation unless options say "none"), c_proj (F -> C, row parallel),
// dropout. x (..., C) -> (..., C).
class MLP : public Module {
 public:
  MLP(int64_t hidden, int64_t ffn_hidden, MlpOptions options = {});
  Sym Forward(const Sym& x);
  Sym operator()(const Sym& x) { return Forward(x); }

 private:
  Linear c_fc_, c_proj_;
  Dropout dropout_;
  std::string gelu_approximate_;
  bool bias_gelu_fusion_;
};

// The fused QKV projection "c_attn": weight (C, 3, C) hinted (B, S(2)), bias
// (3, C) hinted (B, S(1)) (see the top of this file). x (N, C) -> q, k, v,
// each (N, C) and column-split over tp.
class FusedQKV : public Module {
 public:
  FusedQKV(int64_t hidden, int64_t layer_idx, double init_std);
  struct Output {
    Sym q, k, v;
  };
  Output Forward(const Sym& x);
};

struct AttentionOptions {
  bool causal = true;
  double attention_dropout_prob = 0;  // on the attention probabilities
  double output_dropout_prob = 0;     // on c_proj's output (HF's resid_dropout)
  int64_t layer_idx = 0;
  double init_std = 0.02;         // c_attn.weight
  double output_init_std = 0.02;  // c_proj.weight
  // One flash_attention op (ops/attention.cc) instead of q kᵀ, the fused
  // softmax, attention dropout and the product with v: the (T, T) scores
  // are never stored; the op draws attn_dropout's masks. It reads q, k, v
  // as (B, T, H, D) views of the projections (layout "bthd"), so the heads
  // are never transposed.
  bool fused = false;
};

// Multi-head self-attention: c_attn (fused QKV), softmax(q kᵀ / sqrt(D)) with
// the causal and/or padding mask (one fused_scale_*_softmax op), attention
// dropout, context (or, with `fused`, one flash_attention op for all of
// these, drawing the same dropout masks), c_proj (row parallel), output
// dropout. Children:
// c_attn, c_proj, attn_dropout, resid_dropout.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t hidden, int64_t num_heads, AttentionOptions options = {});
  // x (B, T, C) -> (B, T, C). padding_mask: optional bool (B, T), true = a
  // real token (keys that are false are dropped), as HF's attention_mask.
  Sym Forward(const Sym& x, const Sym& padding_mask = Sym());
  Sym operator()(const Sym& x, const Sym& padding_mask = Sym()) { return Forward(x, padding_mask); }

 private:
  // softmax(scale · q kᵀ, masks) with dropout, times v: (B, H, T, D).
  Sym UnfusedAttention(GraphBuilder& b, const Sym& q, const Sym& k, const Sym& v, const Sym& padding_mask,
                       double scale);

  int64_t hidden_, num_heads_;
  AttentionOptions options_;
  FusedQKV c_attn_;
  Linear c_proj_;
  Dropout attn_dropout_, resid_dropout_;
};

struct TransformerLayerOptions {
  bool causal = true;
  // false: pre-LN (GPT-2). true: post-LN (BERT): each sub-layer's residual
  // sum is normalised, h = ln_1(x + attn(x)); y = ln_2(h + mlp(h)).
  bool post_layernorm = false;
  std::string gelu_approximate = "tanh";  // the MLP's (MlpOptions)
  double attention_dropout_prob = 0;
  double output_dropout_prob = 0;  // after attention and after the MLP
  double layernorm_epsilon = 1e-5;
  int64_t layer_idx = 0;
  double init_std = 0.02;
  double output_init_std = 0.02;
  bool fused_attention = false;  // AttentionOptions::fused
  bool bias_gelu_fusion = false;  // the MLP's (MlpOptions)
};

// A pre-LN GPT-2 block: h = x + attn(ln_1(x)); y = h + mlp(ln_2(h)); with
// post_layernorm BERT's block: h = ln_1(x + attn(x)); y = ln_2(h + mlp(h)).
// Children: ln_1, attn, ln_2, mlp. x (B, T, C) -> (B, T, C). The layer is a
// recomputable segment (GraphBuilder::Recomputable): activation
// checkpointing recomputes it in backward from x.
class TransformerLayer : public Module {
 public:
  TransformerLayer(int64_t hidden, int64_t num_heads, int64_t ffn_hidden, TransformerLayerOptions options = {});
  Sym Forward(const Sym& x, const Sym& padding_mask = Sym());
  Sym operator()(const Sym& x, const Sym& padding_mask = Sym()) { return Forward(x, padding_mask); }

 private:
  bool post_layernorm_;
  LayerNorm ln_1_;
  MultiheadAttention attn_;
  LayerNorm ln_2_;
  MLP mlp_;
};

}  // namespace tessera::nn
