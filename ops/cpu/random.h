#pragma once
// What other CPU kernels share of the random ops' kernels (ops/cpu/random.cc):
// the dropout op's mask, for kernels that apply dropout themselves (the
// fused attention) and must draw exactly the mask the op would.

#include <cstdint>

namespace tessera::ops::cpu {

// keep = u >= rate with u = k / 2^24 (k a Philox word's 24 high bits), i.e.
// k >= ceil(rate · 2^24): the integer threshold of that exact test.
int32_t DropoutThreshold(double rate);

// out[i] = the dropout op's mask value (1 / (1 - rate) where kept, else 0)
// of global index global + i of tensor `tensor_id` at `step`, seed `seed`.
void DropoutMaskRun(uint64_t seed, uint32_t tensor_id, uint32_t step, double rate, uint64_t global, int64_t length,
                    float* out);

}  // namespace tessera::ops::cpu
