#pragma once
// What other CPU kernels share of the random ops' kernels (ops/cpu/random.cc):
// the dropout op's mask, for kernels that apply dropout themselves (the
// fused attention) and must draw exactly the mask the op would.

#include <cstdint>

namespace tessera::ops::cpu {

// keep = u >= rate with u = k / 2^24 (k a Philox word's 24 high bits), i.e.
// k >= ceil(rate · 2^24): the integer threshold of that exact test.
int32_t DropoutThreshold(double rate);

// out[i] = the dropout op's mask value (`scale` where kept, else 0) of
// global index global + i of tensor `tensor_id` at `step`, seed `seed`, for
// the op's rate: threshold = DropoutThreshold(rate), scale = 1 / (1 - rate)
// computed in double (from a rate rounded to float, 0.7 kept one word too
// many and scaled every kept value differently).
void DropoutMaskRun(uint64_t seed, uint32_t tensor_id, uint32_t step, int32_t threshold, float scale, uint64_t global,
                    int64_t length, float* out);

}  // namespace tessera::ops::cpu
