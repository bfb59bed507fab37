#include "core/file_util.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/text.h"

namespace tessera {
namespace {

absl::Status Errno(std::string_view what, const std::filesystem::path& path) {
  return absl::InternalError(StrCat(what, " ", path.string(), ": ", std::strerror(errno)));
}

}  // namespace

mode_t CurrentUmask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("Umask:")) return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  }
  return 022;
}

absl::Status SyncPath(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const int synced = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (synced != 0) return Errno("cannot fsync", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path, std::uintmax_t max_bytes) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  // (A symbolic link loop, or a directory that may not be searched, was
  // called "no such file".)
  if (error && error != std::errc::no_such_file_or_directory && error != std::errc::not_a_directory) {
    return absl::InvalidArgumentError(StrCat(path.string(), ": cannot read: ", error.message()));
  }
  if (!std::filesystem::exists(status)) return absl::NotFoundError(StrCat(path.string(), ": no such file"));
  if (std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(StrCat(path.string(), ": is a directory, not a file"));
  }
  // (A device or a FIFO never ends, or blocks.)
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(StrCat(path.string(), ": not a regular file"));
  }
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > max_bytes) {
    return absl::InvalidArgumentError(
        StrCat(path.string(), ": ", size, " bytes, more than the ", max_bytes, " this file may have"));
  }
  // (POSIX reads, for the reason of a failure: /proc/self/mem said only
  // "cannot read".)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InvalidArgumentError(StrCat(path.string(), ": cannot open: ", std::strerror(errno)));
  std::string contents;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      return absl::InvalidArgumentError(StrCat(path.string(), ": cannot read: ", std::strerror(error)));
    }
    if (got == 0) break;
    contents.append(chunk, static_cast<size_t>(got));
    // (The file may grow while it is read.)
    if (contents.size() > max_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          StrCat(path.string(), ": more than the ", max_bytes, " bytes this file may have"));
    }
  }
  ::close(fd);
  return contents;
}

absl::Status WriteFileDurably(const std::filesystem::path& path, std::string_view bytes) {
  const std::string_view parts[] = {bytes};
  return WriteFileDurably(path, parts);
}

namespace {

constexpr int kTemporarySlots = 64;
constexpr size_t kTemporaryPathBytes = 4096;
// A slot is taken (1), written, then published (2: a file, 3: a directory)
// for the handler; freed (0) once the path is forgotten.
std::atomic<int> temporary_state[kTemporarySlots];
char temporary_paths[kTemporarySlots][kTemporaryPathBytes];

// DeferTemporarySignals: how many are alive, and the signal one held back.
std::atomic<int> deferring{0};
std::atomic<int> deferred_signal{0};

void RemoveTemporariesAndReraise(int signal) {
  if (deferring.load(std::memory_order_acquire) > 0) {
    deferred_signal.store(signal, std::memory_order_release);
    return;
  }
  for (int k = 0; k < kTemporarySlots; ++k) {
    if (temporary_state[k].load(std::memory_order_acquire) == 2) ::unlink(temporary_paths[k]);
  }
  for (int k = 0; k < kTemporarySlots; ++k) {
    if (temporary_state[k].load(std::memory_order_acquire) == 3) ::rmdir(temporary_paths[k]);
  }
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

TemporaryFile::TemporaryFile(const std::filesystem::path& path, bool directory) {
  const std::string& text = path.native();
  if (text.size() >= kTemporaryPathBytes) return;
  for (int k = 0; k < kTemporarySlots; ++k) {
    int free_slot = 0;
    if (temporary_state[k].compare_exchange_strong(free_slot, 1, std::memory_order_acq_rel)) {
      std::memcpy(temporary_paths[k], text.c_str(), text.size() + 1);
      temporary_state[k].store(directory ? 3 : 2, std::memory_order_release);
      slot_ = k;
      return;
    }
  }
}

TemporaryFile::~TemporaryFile() {
  if (slot_ >= 0) temporary_state[slot_].store(0, std::memory_order_release);
}

DeferTemporarySignals::DeferTemporarySignals() { deferring.fetch_add(1, std::memory_order_acq_rel); }

DeferTemporarySignals::~DeferTemporarySignals() {
  if (deferring.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (const int signal = deferred_signal.exchange(0, std::memory_order_acq_rel); signal != 0) {
    RemoveTemporariesAndReraise(signal);
  }
}

namespace {
std::atomic<bool> interrupt_requested{false};
// Two buffers: a note is written into the one a handler is not reading
// (the other), then made the current one.
char committed_checkpoints[2][4096];
std::atomic<int> committed_checkpoint{-1};
absl::Mutex committed_checkpoint_mu;

}  // namespace

void NoteCommittedCheckpoint(const std::filesystem::path& path) {
  const std::string text = path.string();
  absl::MutexLock lock(&committed_checkpoint_mu);
  const int next = committed_checkpoint.load(std::memory_order_relaxed) == 0 ? 1 : 0;
  const size_t size = text.size() < sizeof committed_checkpoints[next] ? text.size() : 0;
  std::memcpy(committed_checkpoints[next], text.data(), size);
  committed_checkpoints[next][size] = '\0';
  committed_checkpoint.store(next, std::memory_order_release);
}

const char* LastCommittedCheckpoint() {
  const int current = committed_checkpoint.load(std::memory_order_acquire);
  return current < 0 ? "" : committed_checkpoints[current];
}

void RequestInterrupt() { interrupt_requested.store(true, std::memory_order_release); }
bool InterruptRequested() { return interrupt_requested.load(std::memory_order_acquire); }

void RemoveTemporariesOnSignals() {
  struct sigaction action {};
  action.sa_handler = RemoveTemporariesAndReraise;
  action.sa_flags = SA_RESTART;  // (a deferred signal returns to the commit)
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal, &action, nullptr);
}

absl::Status WriteFileDurably(const std::filesystem::path& path, std::span<const std::string_view> parts) {
  const std::filesystem::path temp = path.string() + StrCat(".tmp-", ::getpid());
  const TemporaryFile registered(temp);
  // 0666 less the umask, as any file the user makes (0644 under 022).
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    // The usual cause named: the file's directory (not the temporary's name).
    const int error = errno;
    std::error_code ec;
    const std::filesystem::path dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
    if (error == ENOENT && !std::filesystem::exists(dir, ec)) {
      return absl::NotFoundError(
          StrCat("cannot write ", path.string(), ": its directory '", dir.string(), "' does not exist"));
    }
    errno = error;
    return Errno("cannot create", temp);
  }
  absl::Status status;
  for (const std::string_view bytes : parts) {
    for (size_t done = 0; done < bytes.size() && status.ok();) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = Errno("cannot write", temp);
      } else {
        done += static_cast<size_t>(n);
      }
    }
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", temp);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", temp);
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) status = Errno("cannot rename into", path);
  if (!status.ok()) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    return status;
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  return SyncPath(dir);
}

namespace {
std::filesystem::path Home() {
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return home;
  // Without $HOME (a service's environment), the user's own, as a shell
  // takes it; "/" only where the system has none.
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && *found->pw_dir != '\0') {
    return found->pw_dir;
  }
  return "/";
}
}  // namespace

std::filesystem::path CacheDir() {
  if (const char* cache = std::getenv("TESSERA_CACHE"); cache != nullptr && *cache != '\0') return cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / "tessera";
  }
  return Home() / ".cache" / "tessera";
}

namespace {
// The home directory of a named user from the password database, as a
// shell expands "~user"; nullopt for no such user.
std::optional<std::filesystem::path> HomeOf(const std::string& user) {
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwnam_r(user.c_str(), &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && *found->pw_dir != '\0') {
    return std::filesystem::path(found->pw_dir);
  }
  return std::nullopt;
}
}  // namespace

std::filesystem::path ExpandPath(std::string_view path) {
  constexpr std::string_view kCache = "$TESSERA_CACHE/";
  if (path == "~") return Home();
  if (path.starts_with("~/")) return Home() / std::string(path.substr(2));
  if (path.starts_with("~")) {
    // "~user" or "~user/rest"; a user the system does not know leaves the
    // path as it is (as a shell does).
    const size_t slash = path.find('/');
    const std::string user(path.substr(1, slash == std::string_view::npos ? std::string_view::npos : slash - 1));
    if (!user.empty()) {
      if (std::optional<std::filesystem::path> home = HomeOf(user)) {
        return slash == std::string_view::npos ? *home : *home / std::string(path.substr(slash + 1));
      }
    }
  }
  if (path.starts_with(kCache)) return CacheDir() / std::string(path.substr(kCache.size()));
  return std::filesystem::path(std::string(path));
}

namespace {

absl::Status InUseError(const std::filesystem::path& dir) {
  return absl::FailedPreconditionError(
      StrCat("directory '", dir.string(), "' is in use by another run (a `tessera train`, or a master's job)"));
}

}  // namespace

absl::StatusOr<DirectoryClaim> DirectoryClaim::Acquire(const std::filesystem::path& dir, bool made_before) {
  return AcquireLocked(dir, made_before, LOCK_EX);
}

absl::StatusOr<DirectoryClaim> DirectoryClaim::AcquireShared(const std::filesystem::path& dir) {
  return AcquireLocked(dir, /*made_before=*/false, LOCK_SH);
}

absl::StatusOr<DirectoryClaim> DirectoryClaim::AcquireLocked(const std::filesystem::path& dir, bool made_before,
                                                             int operation) {
  // A claim whose holder removed the (empty) directory it created just as
  // this one locked it is retried on the directory made anew.
  for (int attempt = 0;; ++attempt) {
    DirectoryClaim claim;
    std::error_code ec;
    // The outermost of the directories about to be made: they go with it
    // (an output_dir of a/b/c left a/b behind).
    std::filesystem::path outermost = dir;
    for (std::filesystem::path up = dir.parent_path();
         !up.empty() && up != up.root_path() && !std::filesystem::exists(up, ec) && !ec; up = up.parent_path()) {
      outermost = up;
    }
    ec.clear();
    claim.created_ = std::filesystem::create_directories(dir, ec) || made_before;
    claim.outermost_made_ = claim.created_ && !made_before ? outermost : dir;
    if (ec) {
      // A symbolic link to nothing reads as "File exists": named as what it is.
      std::error_code link_ec;
      if (std::filesystem::is_symlink(std::filesystem::symlink_status(dir, link_ec)) &&
          !std::filesystem::exists(dir, link_ec)) {
        return absl::InvalidArgumentError(
            StrCat("cannot create directory '", dir.string(), "': it is a symbolic link to '",
                   std::filesystem::read_symlink(dir, link_ec).string(), "', which does not exist"));
      }
      return absl::InvalidArgumentError(StrCat("cannot create directory '", dir.string(), "': ", ec.message()));
    }
    claim.dir_ = dir;
    claim.fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (claim.fd_ < 0) {
      const int error = errno;
      claim.Release();
      const std::string message = StrCat("cannot open directory '", dir.string(), "': ", std::strerror(error));
      return error == EACCES ? absl::PermissionDeniedError(message) : absl::InvalidArgumentError(message);
    }
    // (A few tries: a probe holds it for an instant.)
    int locked = ::flock(claim.fd_, operation | LOCK_NB);
    for (int retry = 0; locked != 0 && errno == EWOULDBLOCK && retry < 3; ++retry) {
      ::usleep(20'000);
      locked = ::flock(claim.fd_, operation | LOCK_NB);
    }
    if (locked != 0) {
      if (errno == EWOULDBLOCK) {
        claim.created_ = false;
        return InUseError(dir);
      }
      return claim;  // a file system without flock: the claim stands unlocked
    }
    claim.locked_ = true;
    struct stat held {
    }, named{};
    if (::fstat(claim.fd_, &held) == 0 && ::stat(dir.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      return claim;
    }
    claim.created_ = false;
    if (attempt == 10) {
      return absl::FailedPreconditionError(StrCat("directory '", dir.string(), "' keeps being removed and made anew"));
    }
  }
}

absl::Status DirectoryClaim::CheckFree(const std::filesystem::path& dir) { return Probe(dir, LOCK_SH); }

absl::Status DirectoryClaim::CheckUnclaimed(const std::filesystem::path& dir) { return Probe(dir, LOCK_EX); }

absl::Status DirectoryClaim::Probe(const std::filesystem::path& dir, int operation) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::OkStatus();
  const bool held = ::flock(fd, operation | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // (frees the lock it took)
  return held ? InUseError(dir) : absl::OkStatus();
}

DirectoryClaim::DirectoryClaim(DirectoryClaim&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      locked_(std::exchange(other.locked_, false)),
      created_(std::exchange(other.created_, false)),
      dir_(std::move(other.dir_)),
      outermost_made_(std::move(other.outermost_made_)) {}

DirectoryClaim& DirectoryClaim::operator=(DirectoryClaim&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    locked_ = std::exchange(other.locked_, false);
    created_ = std::exchange(other.created_, false);
    dir_ = std::move(other.dir_);
    outermost_made_ = std::move(other.outermost_made_);
  }
  return *this;
}

DirectoryClaim::~DirectoryClaim() {
  if (fd_ >= 0) ::close(fd_);
}

void DirectoryClaim::Release() {
  // Removed while still locked, so no other claim sees it half gone; not
  // while another shared claim holds it (taking it exclusively fails).
  if (created_ && (!locked_ || ::flock(fd_, LOCK_EX | LOCK_NB) == 0)) {
    std::error_code ec;
    if (std::filesystem::is_empty(dir_, ec) && !ec && std::filesystem::remove(dir_, ec) && dir_ != outermost_made_) {
      // Its parents made with it, while they are empty.
      for (std::filesystem::path up = dir_.parent_path(); !up.empty(); up = up.parent_path()) {
        if (!std::filesystem::is_empty(up, ec) || ec || !std::filesystem::remove(up, ec)) break;
        if (up == outermost_made_) break;
      }
    }
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  locked_ = false;
  created_ = false;
}

}  // namespace tessera
