#pragma once
// The geometry of one fused attention kernel call (ops/attention.cc), shared
// by the CPU kernels and the CUDA launchers (plain C++: nvcc includes it).
//
// q (B, H, T, D) may be a block of the logical queries along T (its slice),
// k and v (B, H, S, D) are whole along S. With `causal`, local query t sees
// keys s <= t + causal_shift, causal_shift = the query block's offset +
// S - T_logical (keys aligned to the end of the queries, as the fused
// softmaxes align them). The mask, when present, is (B, S) bytes, 1 = keep.

#include <cstdint>

namespace tessera::ops {

struct AttentionShape {
  int64_t batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;
  bool causal = false;
  int64_t causal_shift = 0;
  float scale = 1.0f;
  const uint8_t* mask = nullptr;  // (batch, keys); null: none
};

}  // namespace tessera::ops
