#pragma once
// The CUDA emulator's CUB: cub::DeviceRadixSort::SortPairs, as
// ops/cuda/embedding.cu calls it. Stable by key over bits [begin, end)
// (signed keys in their order, as CUB's), queued on the stream; the first
// call's null temporary storage asks for its size (CUB's protocol; the
// emulator asks for 1 byte, and checks it is passed back).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_emu/internal.h"
#include "cuda_runtime_api.h"

namespace cub {

struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, N num_items, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<K>, "the emulator sorts integer keys");
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    if (temp_bytes < 1 || num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) ||
        begin_bit >= end_bit) {
      return cudaErrorInvalidValue;
    }
    const auto n = static_cast<size_t>(num_items);
    return cuda_emu::Enqueue(stream, [=]() -> cudaError_t {
      if (n > 0 && (keys_in == nullptr || keys_out == nullptr || values_in == nullptr || values_out == nullptr)) {
        return cudaErrorIllegalAddress;
      }
      using U = std::make_unsigned_t<K>;
      // The key's bits [begin, end), signed keys flipped into unsigned order.
      auto digits = [&](K k) {
        U u = static_cast<U>(k);
        if constexpr (std::is_signed_v<K>) u ^= U{1} << (sizeof(K) * 8 - 1);
        u >>= begin_bit;
        const int width = end_bit - begin_bit;
        return width >= static_cast<int>(sizeof(K) * 8) ? u : static_cast<U>(u & ((U{1} << width) - 1));
      };
      std::vector<size_t> perm(n);
      std::iota(perm.begin(), perm.end(), size_t{0});
      std::stable_sort(perm.begin(), perm.end(),
                       [&](size_t a, size_t b) { return digits(keys_in[a]) < digits(keys_in[b]); });
      std::vector<K> k(n);
      std::vector<V> v(n);
      for (size_t i = 0; i < n; ++i) {
        k[i] = keys_in[perm[i]];
        v[i] = values_in[perm[i]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
      return cudaSuccess;
    });
  }
};

}  // namespace cub
