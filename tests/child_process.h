#pragma once
// A child process for tests: runs `binary args...` with stdout and stderr
// to a file, and is SIGCONTed, SIGKILLed and reaped on destruction if it
// still runs (a failing test leaves nothing behind).
//
//   ChildProcess worker(TESSERA_BINARY, {"worker", "--master", address, "--devices", "cpu:2"}, dir / "w.out");
//   worker.Signal(SIGKILL);
//   EXPECT_EQ(worker.Wait(), 128 + SIGKILL);
//
// Construct, signal and wait on one thread.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::testing {

class ChildProcess {
 public:
  ChildProcess(const std::string& binary, const std::vector<std::string>& args, const std::filesystem::path& output)
      : output_(output) {
    // Everything exec needs is built before fork: the child only calls
    // async-signal-safe functions.
    std::vector<std::string> strings = {binary};
    strings.insert(strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string path = output.string();
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal) { kill(pid_, signal); }
  // Whether it still runs (not exited, not reaped).
  bool Running() const { return !reaped_ && pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  // The exit code (128 + signal when killed).
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string Output() const {
    std::ifstream in(output_);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::filesystem::path output_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace tessera::testing
