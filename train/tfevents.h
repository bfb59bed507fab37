#pragma once
// TensorBoard event files: scalar summaries (a tag, a step, a value) that
// `tensorboard --logdir DIR` plots, in TensorFlow's own format.
//
// A file is a sequence of TFRecords, each
//   u64 length (little-endian) | u32 masked CRC32C of those 8 bytes |
//   `length` bytes of data     | u32 masked CRC32C of the data
// (mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose data is a
// serialized tensorflow.Event:
//   Event   { double wall_time = 1; int64 step = 2;
//             string file_version = 3;  (the first record: "brain.Event:2")
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The protobuf wire format of these five fields is written by hand (see
// tfevents.cc): it is a few dozen lines, where libprotobuf would need a copy
// of TensorFlow's event.proto and summary.proto, a protoc step and a
// dependency of tessera_train on libprotobuf for nothing else. Readers see
// ordinary protobuf messages; tests/train/read_tfevents.py checks that with
// google.protobuf and its own CRC32C.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as iSCSI, ext4 and
// TFRecord use): Crc32c("123456789") == 0xE3069283. Debian 12's Abseil has
// no absl::crc32c, hence this one (a byte-wise table; event records are
// small). `crc` continues a checksum over data that came before.
[[nodiscard]] uint32_t Crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masking of a CRC stored next to the data it covers.
[[nodiscard]] uint32_t MaskCrc32c(uint32_t crc);

// Writes one event file. Not thread-safe: one owner (the training loop)
// calls it. The file is closed by the destructor; call Close() to see the
// error of the last flush.
//
// Errors name the file. After a failed write the writer is failed for good
// (every later call returns that error): a record cut short would hide every
// record after it from TensorBoard, so nothing more is appended.
class EventFileWriter {
 public:
  struct Options {
    // Flush (to the kernel, not fsync) after every Add* call, so TensorBoard
    // sees each value as soon as it is added; false: when the stdio buffer
    // fills, on Flush() and on Close().
    bool flush_each_write = true;
  };

  // Creates `dir` (and its parents) if missing, and in it a new file
  // events.out.tfevents.<unix seconds>.<hostname> (".1", ".2"... appended
  // when that name exists: an existing file is never touched) holding the
  // file_version record.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::filesystem::path& dir,
                                                                               Options options);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::filesystem::path& dir) {
    return Create(dir, Options{});
  }

  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  ~EventFileWriter();

  // Appends one event with one scalar. `tag` is non-empty UTF-8 (TensorBoard
  // groups tags by their prefix up to '/': "train/loss"); `wall_time` is in
  // seconds since the Unix epoch, now when absent.
  [[nodiscard]] absl::Status AddScalar(std::string_view tag, int64_t step, float value,
                                       std::optional<double> wall_time = std::nullopt);
  // Appends one event holding several scalars of the same step.
  [[nodiscard]] absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, float>>& values,
                                        std::optional<double> wall_time = std::nullopt);
  [[nodiscard]] absl::Status Flush();
  // Flushes and closes the file; later calls return FAILED_PRECONDITION
  // (Close() itself returns OK again).
  [[nodiscard]] absl::Status Close();

  const std::filesystem::path& path() const { return path_; }

 private:
  EventFileWriter(std::filesystem::path path, std::FILE* file, Options options)
      : path_(std::move(path)), file_(file), options_(options) {}
  absl::Status WriteRecord(std::string_view data);
  absl::Status CheckWritable() const;
  // The error of a failed write, from its errno.
  absl::Status WriteError(int error) const;

  std::filesystem::path path_;
  std::FILE* file_;  // owned; null once closed
  Options options_;
  absl::Status failure_;  // the first write error; sticky
};

// A resumed run's start: rewrites every events.out.tfevents.* file in `dir`
// without the events of steps past `step` (the earlier run's iterations
// the resume discards, which TensorBoard would otherwise plot as a dead
// branch beside the new ones), keeping every other record as it is (the
// file_version record too). A file's torn tail (a record cut short, or a
// length whose CRC does not match, as a killed writer leaves) goes as well,
// since TensorBoard stops reading there anyway; a whole record whose data's
// CRC does not match goes alone (with a warning). Files with nothing to drop are
// not touched, nor are links and files whose first record is not a valid
// TFRecord; a rewritten one replaces the old atomically. A negative `step`
// (a run starting afresh) drops every event, the version records too, and
// removes the files. Errors name the file.
[[nodiscard]] absl::Status KeepEventsUpTo(const std::filesystem::path& dir, int64_t step);

}  // namespace tessera
