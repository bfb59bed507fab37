#pragma once
// The safetensors format (Hugging Face's), for checkpoint shards
// (train/checkpoint.h) and for Hugging Face weights:
//
//   u64 little-endian N | N bytes of JSON header | data
//   header: {"<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<string value>", ...}}
//
// Offsets are relative to the first byte after the header; tensors are
// row-major and little-endian. Supported dtypes: F32, F16, BF16, F64, I64,
// I32, BOOL (Tessera's dtypes); a file holding any other is refused, naming
// the tensor.
//
// SafetensorsFile maps a file read-only and checks everything a corrupt or
// hostile file could get wrong (header size, JSON, each entry's dtype, shape
// and offsets inside the data, sizes matching the shape) before handing out a
// byte; errors name the file. Immutable after Open: thread-safe.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace tessera {

class SafetensorsFile {
 public:
  struct Entry {
    DType dtype = DType::kF32;
    Shape shape;
    const char* data = nullptr;  // into the mapping; valid while the file object lives
    size_t bytes = 0;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, Entry, std::less<>>& tensors() const { return tensors_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // Null when the file has no tensor of that name.
  const Entry* Find(std::string_view name) const;
  // A copy of a tensor in host memory.
  [[nodiscard]] absl::StatusOr<Tensor> Load(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// Writes `tensors` (CPU tensors, in this order) and `metadata` to `path`
// durably (core/file_util.h: a temporary file, fsync, rename). Names must be
// distinct, non-empty and not "__metadata__".
[[nodiscard]] absl::Status WriteSafetensors(const std::filesystem::path& path,
                                            const std::vector<std::pair<std::string, Tensor>>& tensors,
                                            const std::map<std::string, std::string>& metadata = {});

// "F32" and back; InvalidArgument for a dtype the format (or Tessera) lacks.
[[nodiscard]] absl::StatusOr<std::string> SafetensorsDTypeName(DType dtype);
[[nodiscard]] absl::StatusOr<DType> SafetensorsDTypeFromName(std::string_view name);

}  // namespace tessera
