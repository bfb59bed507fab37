#pragma once
// The geometry of one fused attention kernel call (ops/attention.cc), shared
// by the CPU kernels and the CUDA launchers (plain C++: nvcc includes it).
//
// q (B, H, T, D) may be a block of the logical queries along T (its slice),
// k and v (B, H, S, D) are whole along S. With `bthd` q, y, dy, dq are
// (B, T, H, D) and k, v, dk, dv (B, S, H, D): a head's rows are then
// H · D apart (RowStride), which the kernels follow; lse and the per-row
// scratch are (B, H, T) either way. With `causal`, local query t sees
// keys s <= t + causal_shift, causal_shift = the query block's offset +
// S - T_logical (keys aligned to the end of the queries, as the fused
// softmaxes align them). The mask, when present, is (B, S) bytes, 1 = keep.
//
// Attention dropout (dropout_rate > 0) multiplies each probability by the
// mask value the `dropout` op would give the logical probabilities tensor
// (B_L, H_L, T_L, S) at that element (ops/random.cc: Philox keyed by seed,
// tensor_id and step, the element's global index, keep when the 24 high
// bits >= dropout_threshold, kept values scaled by dropout_scale), so fused
// and unfused attention draw the same masks. Global index of local
// (b, h, t, s): (((b + batch_offset) · H_L + h + head_offset) · T_L + t +
// query_offset) · S + s.

#include <cstdint>

#ifdef __CUDACC__
#define TESSERA_ATTENTION_HD __host__ __device__
#else
#define TESSERA_ATTENTION_HD
#endif

namespace tessera::ops {

struct AttentionShape {
  int64_t batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;
  bool causal = false;
  int64_t causal_shift = 0;
  float scale = 1.0f;
  const uint8_t* mask = nullptr;  // (batch, keys); null: none
  // Dropout (dropout_rate 0: none).
  float dropout_rate = 0.0f;
  int32_t dropout_threshold = 0;
  float dropout_scale = 1.0f;
  uint64_t dropout_seed = 0;
  uint32_t tensor_id = 0, step = 0;
  int64_t batch_offset = 0, head_offset = 0, query_offset = 0;
  int64_t logical_heads = 0, logical_queries = 0;
  bool bthd = false;

  // Where row t of (batch · head) bh starts in a tensor with `rows` rows a
  // head (queries T or keys S), in elements; the head's next row is
  // RowStride() further.
  TESSERA_ATTENTION_HD int64_t RowOffset(int64_t bh, int64_t t, int64_t rows) const {
    if (!bthd) return (bh * rows + t) * head_dim;
    return ((bh / heads * rows + t) * heads + bh % heads) * head_dim;
  }
  TESSERA_ATTENTION_HD int64_t QueryRow(int64_t bh, int64_t t) const { return RowOffset(bh, t, queries); }
  TESSERA_ATTENTION_HD int64_t KeyRow(int64_t bh, int64_t s) const { return RowOffset(bh, s, keys); }
  TESSERA_ATTENTION_HD int64_t RowStride() const { return bthd ? heads * head_dim : head_dim; }

  // The global index of local element (b, h, t, s) of the probabilities.
  TESSERA_ATTENTION_HD int64_t ProbabilityIndex(int64_t b, int64_t h, int64_t t, int64_t s) const {
    return (((b + batch_offset) * logical_heads + h + head_offset) * logical_queries + t + query_offset) * keys + s;
  }
};

}  // namespace tessera::ops
