#include "train/tfevents.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>

#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera {
namespace {

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) != 0 ? 0x82F63B78u : 0u);
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// ---- The protobuf wire format, as much of it as an Event needs. A field is
// a key varint (field number << 3 | wire type) and then its value: a varint
// (wire type 0), 8 little-endian bytes (1), a length varint and that many
// bytes (2: strings and nested messages), or 4 little-endian bytes (5).

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
// Bytes assembled by shifts, so the file is little-endian on any host.
void PutLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}
void PutKey(std::string& out, uint32_t field, WireType type) { PutVarint(out, (field << 3) | type); }
void PutBytes(std::string& out, uint32_t field, std::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes);
}

// tensorflow.Event's field numbers (tensorflow/core/util/event.proto).
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
// tensorflow.Summary and Summary.Value (tensorflow/core/framework/summary.proto).
constexpr uint32_t kSummaryValue = 1;      // repeated Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float

constexpr std::string_view kFileVersion = "brain.Event:2";

std::string EncodeEvent(double wall_time, int64_t step, std::string_view file_version,
                        const std::vector<std::pair<std::string, float>>& values) {
  std::string event;
  PutKey(event, kEventWallTime, kFixed64);
  PutLittleEndian(event, std::bit_cast<uint64_t>(wall_time), 8);
  // int64 is a varint of the two's-complement 64-bit value (negative steps
  // take 10 bytes, as protobuf writes them).
  PutKey(event, kEventStep, kVarint);
  PutVarint(event, static_cast<uint64_t>(step));
  if (!file_version.empty()) PutBytes(event, kEventFileVersion, file_version);
  if (!values.empty()) {
    std::string summary;
    for (const auto& [tag, value] : values) {
      std::string encoded;
      PutBytes(encoded, kValueTag, tag);
      PutKey(encoded, kValueSimpleValue, kFixed32);
      PutLittleEndian(encoded, std::bit_cast<uint32_t>(value), 4);
      PutBytes(summary, kSummaryValue, encoded);
    }
    PutBytes(event, kEventSummary, summary);
  }
  return event;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name.data());
  // A name is one path component whatever the host is called.
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

absl::Status CheckTag(std::string_view tag) {
  if (tag.empty()) return absl::InvalidArgumentError("TensorBoard scalar tag is empty");
  // protobuf strings are UTF-8; a reader rejects the whole event otherwise.
  if (const auto bad = FirstInvalidUtf8(tag)) {
    return absl::InvalidArgumentError(StrCat("TensorBoard scalar tag is not UTF-8 (byte ", *bad, ")"));
  }
  return absl::OkStatus();
}

// Reads a varint at `at` (advancing it); false when the bytes end first or
// it runs past 10 bytes.
bool GetVarint(std::string_view bytes, size_t& at, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 70 && at < bytes.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(bytes[at++]);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// An event's step (0 when it has none, as protobuf reads it); nullopt if
// the bytes are not a well-formed message.
std::optional<int64_t> EventStep(std::string_view event) {
  int64_t step = 0;
  for (size_t at = 0; at < event.size();) {
    uint64_t key = 0, value = 0;
    if (!GetVarint(event, at, key)) return std::nullopt;
    switch (key & 7) {
      case kVarint:
        if (!GetVarint(event, at, value)) return std::nullopt;
        if ((key >> 3) == kEventStep) step = static_cast<int64_t>(value);
        break;
      case kFixed64:
        at += 8;
        break;
      case kLengthDelimited:
        if (!GetVarint(event, at, value) || value > event.size() - at) return std::nullopt;
        at += value;
        break;
      case kFixed32:
        at += 4;
        break;
      default:
        return std::nullopt;
    }
    if (at > event.size()) return std::nullopt;
  }
  return step;
}

uint64_t GetLittleEndian(std::string_view bytes, size_t at, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return value;
}

}  // namespace

absl::Status KeepEventsUpTo(const std::filesystem::path& dir, int64_t step) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::is_directory(dir, ec)) return absl::OkStatus();  // no run there yet
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // A link is left alone (its target may be anything).
    std::error_code kind_ec;
    if (it->path().filename().string().starts_with("events.out.tfevents.") &&
        std::filesystem::is_regular_file(it->symlink_status(kind_ec))) {
      files.push_back(it->path());
    }
  }
  if (ec) return absl::InternalError(StrCat("cannot list '", dir.string(), "': ", ec.message()));
  for (const std::filesystem::path& path : files) {
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      if (!in) return absl::InternalError(StrCat("cannot read TensorBoard event file '", path.string(), "'"));
      std::ostringstream read;
      read << in.rdbuf();
      bytes = read.str();
    }
    std::string kept;
    size_t at = 0;
    bool dropped = false;
    int64_t damaged = 0;
    while (at < bytes.size()) {
      // length (8) | its masked CRC (4) | data | the data's masked CRC (4)
      if (bytes.size() - at < 12) break;
      const uint64_t length = GetLittleEndian(bytes, at, 8);
      if (GetLittleEndian(bytes, at + 8, 4) != MaskCrc32c(Crc32c(std::string_view(bytes).substr(at, 8)))) break;
      if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) break;
      const std::string_view data = std::string_view(bytes).substr(at + 12, length);
      const size_t end = at + 16 + length;
      if (GetLittleEndian(bytes, at + 12 + length, 4) != MaskCrc32c(Crc32c(data))) {
        // A damaged record, framed whole: it goes alone (the valid events
        // after it were cut with it, as a torn tail).
        if (kept.empty() && !dropped) break;  // (the first: not an event file)
        ++damaged;
        dropped = true;
        at = end;
        continue;
      }
      const std::optional<int64_t> event_step = EventStep(data);
      if (event_step && *event_step > step) {
        dropped = true;
      } else {
        kept.append(bytes, at, end - at);
      }
      at = end;
    }
    if (!dropped && at == bytes.size()) continue;
    // Not an event file (its first record does not read as one): not ours
    // to cut.
    if (kept.empty() && !dropped) continue;
    if (step < 0 && kept.empty()) {
      // Nothing of it stays: it goes.
      std::filesystem::remove(path, ec);
      if (ec)
        return absl::InternalError(
            StrCat("cannot remove TensorBoard event file '", path.string(), "': ", ec.message()));
      continue;
    }
    if (damaged > 0 || at != bytes.size()) {
      TLOG_WARN("{}: dropped {} damaged record{}{}", path.string(), damaged, damaged == 1 ? "" : "s",
                at != bytes.size() ? StrCat(" and a torn tail of ", bytes.size() - at, " bytes") : std::string());
    }
    RETURN_IF_ERROR(WriteFileDurably(path, kept));
  }
  return absl::OkStatus();
}

uint32_t Crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char c : data) crc = kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::filesystem::path& dir,
                                                                         Options options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(StrCat("cannot create TensorBoard directory '", dir.string(), "': ", ec.message()));
  }
  const std::string base =
      StrCat("events.out.tfevents.", static_cast<int64_t>(std::floor(NowSeconds())), ".", HostName());
  // O_EXCL: two writers started in the same second (a restarted job, a test)
  // each get their own file instead of interleaving records in one.
  constexpr int kMaxSuffix = 1000;
  for (int suffix = 0; suffix <= kMaxSuffix; ++suffix) {
    std::filesystem::path path = dir / (suffix == 0 ? base : StrCat(base, ".", suffix));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return absl::ErrnoToStatus(errno, StrCat("cannot create TensorBoard event file '", path.string(), "'"));
    std::FILE* file = ::fdopen(fd, "wb");
    if (file == nullptr) {
      const int error = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return absl::ErrnoToStatus(error, StrCat("cannot open TensorBoard event file '", path.string(), "'"));
    }
    std::unique_ptr<EventFileWriter> writer(new EventFileWriter(std::move(path), file, options));
    // The version record goes out at once, flushed: a run that logs nothing
    // still leaves a file TensorBoard recognises, and a disk that cannot
    // take it fails here, at creation, not at the first scalar.
    absl::Status status = writer->WriteRecord(EncodeEvent(NowSeconds(), 0, kFileVersion, {}));
    if (status.ok()) status = writer->Flush();
    if (!status.ok()) {
      (void)writer->Close();
      ::unlink(writer->path().c_str());
      return status;
    }
    return writer;
  }
  return absl::AlreadyExistsError(StrCat("cannot create a TensorBoard event file in '", dir.string(), "': ", base,
                                         " and ", kMaxSuffix, " numbered variants exist"));
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status EventFileWriter::CheckWritable() const {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(StrCat("TensorBoard event file '", path_.string(), "' is closed"));
  }
  return failure_;
}

absl::Status EventFileWriter::WriteError(int error) const {
  // errno 0: stdio failed without a system call to blame; the message must
  // still name an error.
  return absl::ErrnoToStatus(error != 0 ? error : EIO, StrCat("writing TensorBoard events to '", path_.string(), "'"));
}

absl::Status EventFileWriter::WriteRecord(std::string_view data) {
  RETURN_IF_ERROR(CheckWritable());
  std::string record;
  record.reserve(data.size() + 16);
  PutLittleEndian(record, data.size(), 8);
  PutLittleEndian(record, MaskCrc32c(Crc32c(record)), 4);
  record.append(data);
  PutLittleEndian(record, MaskCrc32c(Crc32c(data)), 4);
  errno = 0;
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      (options_.flush_each_write && std::fflush(file_) != 0)) {
    failure_ = WriteError(errno);
  }
  return failure_;
}

absl::Status EventFileWriter::AddScalar(std::string_view tag, int64_t step, float value,
                                        std::optional<double> wall_time) {
  return AddScalars(step, {{std::string(tag), value}}, wall_time);
}

absl::Status EventFileWriter::AddScalars(int64_t step, const std::vector<std::pair<std::string, float>>& values,
                                         std::optional<double> wall_time) {
  RETURN_IF_ERROR(CheckWritable());
  if (values.empty()) return absl::InvalidArgumentError("TensorBoard event without scalars");
  for (const auto& [tag, value] : values) RETURN_IF_ERROR(CheckTag(tag));
  return WriteRecord(EncodeEvent(wall_time.value_or(NowSeconds()), step, {}, values));
}

absl::Status EventFileWriter::Flush() {
  RETURN_IF_ERROR(CheckWritable());
  errno = 0;
  if (std::fflush(file_) != 0) failure_ = WriteError(errno);
  return failure_;
}

absl::Status EventFileWriter::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  std::optional<int> error;  // errno of the first call that failed
  errno = 0;
  if (std::fflush(file_) != 0) error = errno;
  errno = 0;
  if (std::fclose(file_) != 0 && !error) error = errno;
  file_ = nullptr;
  if (!failure_.ok()) return failure_;
  return error ? WriteError(*error) : absl::OkStatus();
}

}  // namespace tessera
