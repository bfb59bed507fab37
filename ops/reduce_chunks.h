#pragma once
// How the CUDA kernels cut a long reduction so that the whole GPU works on
// it: the reduced coordinates of each output are split into ReduceChunks
// contiguous ranges, each range is summed by its own block into a double
// partial, and the partials are combined in chunk order. The cut depends on
// the count alone, so the result is deterministic (the same bits on every
// run of one shape). Plain C++: the op schemas size the partials' workspace
// with it (ops/reduce.cc, ops/norm_softmax.cc), and nvcc includes it.
//
// One block per (output, chunk) would leave most of a GPU idle on the
// reductions training makes: a bias gradient sums 65,536 rows (GPT-2 124M at
// micro-batch 64) into 768 to 3,072 outputs, a layer norm's parameter
// gradients the same rows into 768 columns, and global-norm clipping sums
// 38.6 M squares into one output.

#include <cstdint>

namespace tessera::ops {

inline constexpr int64_t kReduceChunkLength = 1024;  // reduced coordinates per chunk, at least
inline constexpr int64_t kMaxReduceChunks = 1024;

// The chunks a reduction of `reduced` coordinates per output is cut into.
inline int64_t ReduceChunks(int64_t reduced) {
  const int64_t chunks = reduced / kReduceChunkLength;
  return chunks < 1 ? 1 : (chunks > kMaxReduceChunks ? kMaxReduceChunks : chunks);
}

// Bytes of the double partials of `outputs` outputs, each a reduction of
// `reduced` coordinates: 0 when one chunk does (the kernel writes the result
// directly).
inline int64_t ReducePartialBytes(int64_t outputs, int64_t reduced) {
  const int64_t chunks = ReduceChunks(reduced);
  return chunks == 1 ? 0 : 8 * outputs * chunks;
}

// The partials of a norm's parameter gradients over `rows` rows of C
// columns: dgamma's C sums, and dbeta's with `with_bias` (layer norm).
inline int64_t NormParamGradWorkspaceBytes(int64_t rows, int64_t C, bool with_bias) {
  return ReducePartialBytes(with_bias ? 2 * C : C, rows);
}

}  // namespace tessera::ops
