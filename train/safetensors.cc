#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/checked.h"
#include "core/file_util.h"
#include "core/status.h"
#include "core/strings.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

// A header beyond this is not a safetensors file we wrote or would load
// (Hugging Face's own reader caps it at 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

constexpr std::pair<DType, std::string_view> kNames[] = {
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"},
    {DType::kI64, "I64"}, {DType::kI32, "I32"}, {DType::kBool, "BOOL"},
};

}  // namespace

absl::StatusOr<std::string> SafetensorsDTypeName(DType dtype) {
  for (const auto& [d, name] : kNames) {
    if (d == dtype) return std::string(name);
  }
  return absl::InvalidArgumentError(StrCat("safetensors has no dtype ", DTypeName(dtype)));
}

absl::StatusOr<DType> SafetensorsDTypeFromName(std::string_view name) {
  for (const auto& [d, n] : kNames) {
    if (n == name) return d;
  }
  return absl::InvalidArgumentError(
      StrCat("dtype '", name, "' is not one Tessera has (F32, F16, BF16, F64, I64, I32, BOOL)"));
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const SafetensorsFile::Entry* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<Tensor> SafetensorsFile::Load(std::string_view name) const {
  const Entry* entry = Find(name);
  if (entry == nullptr) return absl::NotFoundError(StrCat(path_.string(), ": no tensor '", name, "'"));
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(entry->shape, entry->dtype));
  if (entry->bytes > 0) std::memcpy(t.raw_data(), entry->data, entry->bytes);
  return t;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::filesystem::path& path) {
  const auto fail = [&](auto&&... parts) { return absl::InvalidArgumentError(StrCat(path.string(), ": ", parts...)); };
  // (O_NONBLOCK: a FIFO in a file's place would block the open; it is
  // refused below instead.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(StrCat(path.string(), ": no such file"));
    return absl::InvalidArgumentError(StrCat(path.string(), ": cannot open: ", std::strerror(error)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->path_ = path;
  file->map_bytes_ = static_cast<size_t>(st.st_size);
  if (file->map_bytes_ < 8) {
    ::close(fd);
    return fail("truncated: ", file->map_bytes_, " bytes, a safetensors file starts with an 8-byte header size");
  }
  void* map = ::mmap(nullptr, file->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return fail("cannot map: ", std::strerror(errno));
  file->map_ = map;
  const char* bytes = static_cast<const char*>(map);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file->map_bytes_ - 8) {
    // (A header size of 8 printable bytes is text: a config, a corpus.)
    if (std::all_of(bytes, bytes + 8,
                    [](char c) { return c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c < 0x7f); })) {
      return fail(
          "not a safetensors file: it begins with text ('",
          EscapeControlChars(std::string_view(bytes, std::min<size_t>(file->map_bytes_, 16)), /*non_ascii=*/true),
          "'), where safetensors begins with its header's size in 8 bytes (a config file given?)");
    }
    return fail("not a safetensors file: its first 8 bytes give a header of ", header_bytes,
                " bytes, more than the file's ", file->map_bytes_);
  }
  const nlohmann::json header =
      nlohmann::json::parse(bytes + 8, bytes + 8 + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return fail("the header is not a JSON object");
  const char* data = bytes + 8 + header_bytes;
  const uint64_t data_bytes = file->map_bytes_ - 8 - header_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return fail("__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) return fail("__metadata__ '", key, "' is not a string");
        file->metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    if (name.empty()) return fail("a tensor with an empty name");
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      return fail("tensor '", name, "' needs dtype, shape and data_offsets");
    }
    const nlohmann::json& dtype = value.at("dtype");
    const nlohmann::json& shape = value.at("shape");
    const nlohmann::json& offsets = value.at("data_offsets");
    if (!dtype.is_string()) return fail("tensor '", name, "': dtype is not a string");
    auto parsed = SafetensorsDTypeFromName(dtype.get<std::string>());
    if (!parsed.ok()) return fail("tensor '", name, "': ", parsed.status().message());
    if (!shape.is_array()) return fail("tensor '", name, "': shape is not a list");
    std::vector<int64_t> dims;
    uint64_t elements = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62)) {
        return fail("tensor '", name, "': shape ", shape.dump(), " is not a list of sizes");
      }
      dims.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(elements, d.get<uint64_t>(), &elements)) {
        return fail("tensor '", name, "': shape ", shape.dump(), " overflows");
      }
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return fail("tensor '", name, "': data_offsets is not [begin, end]");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    uint64_t expected = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(DTypeSize(*parsed)), &expected) || begin > end ||
        end > data_bytes || end - begin != expected) {
      return fail("tensor '", name, "': data_offsets [", begin, ", ", end, "] do not hold ", dtype.get<std::string>(),
                  shape.dump(), " inside the ", data_bytes, " data bytes");
    }
    ranges.emplace_back(begin, end);
    file->tensors_[name] = Entry{*parsed, Shape(std::move(dims)), data + begin, static_cast<size_t>(end - begin)};
  }
  // The tensors' data fill the data bytes, in some order, without a gap
  // (as the format requires): bytes no tensor holds are damage (a file
  // appended to, or a header from another file).
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < covered) return fail("two tensors' data overlap");
    if (begin > covered) {
      return fail("data bytes ", covered, " to ", begin,
                  " belong to no tensor (the tensors' data_offsets must fill the ", data_bytes, " data bytes)");
    }
    covered = end;
  }
  if (covered != data_bytes) {
    return fail(data_bytes - covered, data_bytes - covered == 1 ? " byte" : " bytes",
                " after the last tensor's data: the file is longer than its header says (appended to, or damaged)");
  }
  return file;
}

absl::Status WriteSafetensors(const std::filesystem::path& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<std::string_view> parts;
  parts.reserve(tensors.size() + 2);
  parts.emplace_back();  // the size and header, set below
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__" || !names.insert(name).second) {
      return absl::InvalidArgumentError(
          StrCat(path.string(), ": tensor name '", name, "' is empty, reserved or repeated"));
    }
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDTypeName(tensor.dtype()));
    const uint64_t bytes = tensor.NumBytes();
    header[name] = {{"dtype", dtype}, {"shape", tensor.shape().dims()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    parts.emplace_back(static_cast<const char*>(tensor.raw_data()), static_cast<size_t>(bytes));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Pad to 8 bytes with spaces (the format's alignment convention).
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::string head(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) head[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
  head += text;
  parts[0] = head;
  return WriteFileDurably(path, parts);
}

}  // namespace tessera
