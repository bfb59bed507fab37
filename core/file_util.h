#pragma once
// Durable file writes: what outputs and checkpoints use so that a crash or a
// kill -9 at any moment leaves either the old file or the complete new one,
// never a torn one (DESIGN §11).

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

// The whole of a file: NotFound naming it when it does not exist,
// InvalidArgument when it cannot be read (a directory, a device, a FIFO, no
// permission) or holds more than `max_bytes`.
[[nodiscard]] absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path,
                                                        std::uintmax_t max_bytes = std::uintmax_t{1} << 30);

// Writes `bytes` to a temporary file beside `path` ("<path>.tmp-<pid>"),
// fsyncs it, renames it over `path` and fsyncs the directory. Errors name
// the file and the failing step; the temporary file is removed on error.
[[nodiscard]] absl::Status WriteFileDurably(const std::filesystem::path& path, std::string_view bytes);
// The same for a file made of several parts written back to back (no copy
// into one buffer: a checkpoint shard's header, then each tensor's bytes).
[[nodiscard]] absl::Status WriteFileDurably(const std::filesystem::path& path, std::span<const std::string_view> parts);

// Temporary files a Ctrl-C (SIGINT, SIGTERM, SIGHUP) should not leave
// behind: WriteFileDurably's and the dataset builder's (data/) register
// theirs while they exist. A command whose interruption has no other
// meaning (`tessera preprocess`, `export`) calls
// RemoveTemporariesOnSignals() first: the signal then unlinks every
// registered file (then removes every registered directory, empty by
// then) and ends the process as the signal would have.
// Registration is a no-op for the other commands (a `tessera train`'s
// Ctrl-C finishes its iteration and writes its checkpoint). At most 64 at
// once; more go unregistered. Thread-safe and async-signal-safe on the
// handler's side.
class TemporaryFile {
 public:
  // `directory`: an (emptied) directory, removed after the files.
  explicit TemporaryFile(const std::filesystem::path& path, bool directory = false);
  ~TemporaryFile();  // forgets it (it was renamed, or removed)
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

 private:
  int slot_ = -1;
};
void RemoveTemporariesOnSignals();
// While one lives, RemoveTemporariesOnSignals' handler holds a signal back
// and acts on it when the last one goes: a commit of several renames (a
// dataset's .bin, .idx and description) ends whole, never half done.
class DeferTemporarySignals {
 public:
  DeferTemporarySignals();
  ~DeferTemporarySignals();
  DeferTemporarySignals(const DeferTemporarySignals&) = delete;
  DeferTemporarySignals& operator=(const DeferTemporarySignals&) = delete;
};

// The newest checkpoint this process committed (a run's iter_* directory),
// for the line a second Ctrl-C writes from its signal handler.
// LastCommittedCheckpoint is async-signal-safe: "" before the first (and
// for a path of 4 KiB or more).
void NoteCommittedCheckpoint(const std::filesystem::path& path);
const char* LastCommittedCheckpoint();

// A process-wide request to stop what is being prepared: a `tessera
// train`'s Ctrl-C before its first iteration stops a dataset being built
// from text at its next chunk (there is no iteration to finish yet).
void RequestInterrupt();
bool InterruptRequested();

// The process's umask, read without changing it (/proc/self/status; 022
// where that is unreadable).
mode_t CurrentUmask();

// fsyncs a file or a directory (so a rename inside it is on disk).
[[nodiscard]] absl::Status SyncPath(const std::filesystem::path& path);

// Tessera's cache directory: $TESSERA_CACHE, else $XDG_CACHE_HOME/tessera,
// else ~/.cache/tessera (where the install script puts the default corpus
// and the GPT-2 vocabulary).
std::filesystem::path CacheDir();

// A path from a config: a leading "~" or "~/" is the home directory, "~user"
// or "~user/" that user's (from the password database; a user the system
// does not know leaves the path as it is, as a shell does), a leading
// "$TESSERA_CACHE/" is CacheDir(); anything else is taken as it is.
std::filesystem::path ExpandPath(std::string_view path);

// An exclusive claim on a directory for as long as the object lives: an
// advisory lock (flock) on the directory itself, so a second process, or a
// second claim in this one, on the same directory (however its path is
// spelled) is refused while the first holds it; a process that dies frees
// it. Two runs writing one train.output_dir would mix their checkpoints
// and metrics. (Or a shared claim: AcquireShared.)
class DirectoryClaim {
 public:
  // Creates the directory (and its parents) when missing. FailedPrecondition
  // when another claim holds it; InvalidArgument/PermissionDenied when it
  // cannot be made or opened. Where the file system has no such locks (some
  // network mounts), the claim is granted unlocked and `locked()` is false.
  // `made_before`: an earlier claim of the same run made it (a job claimed
  // again by a restarted master), so it goes when left empty.
  [[nodiscard]] static absl::StatusOr<DirectoryClaim> Acquire(const std::filesystem::path& dir,
                                                              bool made_before = false);
  // A shared claim: any number of them hold `dir` at once (a job's nodes,
  // each writing its part), none beside an exclusive one. Made when
  // missing, as Acquire's.
  [[nodiscard]] static absl::StatusOr<DirectoryClaim> AcquireShared(const std::filesystem::path& dir);
  // FailedPrecondition (Acquire's) when an exclusive claim holds `dir` now
  // (OK when it does not exist): to name that first among a run's other
  // objections to a directory.
  [[nodiscard]] static absl::Status CheckFree(const std::filesystem::path& dir);
  // FailedPrecondition when any claim, shared or exclusive, holds `dir`.
  [[nodiscard]] static absl::Status CheckUnclaimed(const std::filesystem::path& dir);
  DirectoryClaim() = default;
  DirectoryClaim(DirectoryClaim&& other) noexcept;
  DirectoryClaim& operator=(DirectoryClaim&& other) noexcept;
  DirectoryClaim(const DirectoryClaim&) = delete;
  DirectoryClaim& operator=(const DirectoryClaim&) = delete;
  ~DirectoryClaim();  // frees the lock, leaves the directory

  // Frees the lock, and removes the directory when Acquire created it and
  // it is still empty (a job that never wrote leaves nothing behind), and
  // no other claim holds it (a shared one); so the parents Acquire made
  // with it, while they are empty.
  void Release();
  bool held() const { return fd_ >= 0; }
  bool locked() const { return locked_; }
  bool made() const { return created_; }  // made by this claim (or made_before)

 private:
  static absl::StatusOr<DirectoryClaim> AcquireLocked(const std::filesystem::path& dir, bool made_before,
                                                      int operation);
  static absl::Status Probe(const std::filesystem::path& dir, int operation);
  int fd_ = -1;
  bool locked_ = false;
  bool created_ = false;
  std::filesystem::path dir_;
  std::filesystem::path outermost_made_;  // dir_ or the outermost parent made with it
};

}  // namespace tessera
