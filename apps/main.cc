// The `tessera` binary: parses the command line and calls into the
// libraries. Every verb has --help and exits 1 with a one-line reason on bad
// input; nothing an input can trigger (an exception from a library, an
// allocation sized by the user) escapes as a crash.

#include <execinfo.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_join.h"
#include "apps/cli_errors.h"
#include "apps/cluster_commands.h"
#include "apps/data_commands.h"
#include "cluster/engine_job.h"
#include "cluster/local_train.h"
#include "cluster/transport.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/schema.h"
#include "core/text.h"
#include "ops/describe.h"
#include "ops/registry.h"
#include "train/dataset_build.h"
#include "train/job_config.h"
#include "train/plan_view.h"
#include "train/trainer.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera: %s\n", tessera::OneLine(message).c_str());
  return 1;
}

int RunOps(const std::string& format) {
  const auto& registry = tessera::ops::BuiltinOps();
  if (format == "json") {
    std::printf("%s\n", tessera::ops::DescribeOpsJson(registry).dump(2).c_str());
  } else {
    std::printf("%s", tessera::ops::DescribeOpsText(registry).c_str());
  }
  return 0;
}

int RunConfig(const std::string& path, const std::vector<std::string>& overrides, bool schema) {
  if (schema) {
    if (!path.empty() || !overrides.empty()) return Fail("config --schema takes no CONFIG or overrides");
    std::printf("%s", tessera::config::SchemaMarkdown(tessera::JobSchema()).c_str());
    return 0;
  }
  if (path.empty()) return Fail("config: give a CONFIG file (or --schema for the reference of every key)");
  auto config = tessera::LoadJobConfig(path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  std::printf("%s\n", config->dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

// The signal that asked `tessera train` to stop (0: none yet). The handler
// only records it, so a watcher thread turns it into a graceful stop; a
// second one ends the process at once. The same interrupt delivered twice
// within kRepeatedSignalWindowMs counts once.
volatile std::sig_atomic_t g_stop_signal = 0;
std::atomic<int64_t> g_first_stop_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free);

extern "C" void OnStopSignal(int signal) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  int64_t first = 0;
  if (g_first_stop_ns.compare_exchange_strong(first, ns)) {
    g_stop_signal = signal;
    return;
  }
  if (ns - first < int64_t{tessera::kRepeatedSignalWindowMs} * 1'000'000) return;
  // Ended at once, as `tessera preprocess` is: the temporaries of a file
  // being written (a dataset built from text, a checkpoint's shard)
  // removed first; said on a line (it ended without a word).
  // (And which checkpoint a resume takes, where this run wrote one.)
  static constexpr char kLine[] = "\ntessera: stopped at once: no further checkpoint is written";
  (void)!::write(STDERR_FILENO, kLine, sizeof kLine - 1);
  if (const char* latest = tessera::LastCommittedCheckpoint(); latest[0] != '\0') {
    static constexpr char kLatest[] = " (the latest: ";
    (void)!::write(STDERR_FILENO, kLatest, sizeof kLatest - 1);
    (void)!::write(STDERR_FILENO, latest, std::strlen(latest));
    (void)!::write(STDERR_FILENO, ")", 1);
  }
  (void)!::write(STDERR_FILENO, "\n", 1);
  tessera::RemoveTemporariesOnSignals();
  ::raise(signal);
}

int RunTrain(const std::string& path, const std::vector<std::string>& overrides, bool fast_dev_run) {
  absl::StatusOr<std::vector<std::string>> all = overrides;
  if (fast_dev_run) all = tessera::FastDevRunOverrides(path, overrides);
  if (!all.ok()) return Fail(std::string(all.status().message()));
  auto config = tessera::LoadJobConfig(path, *all);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  // Ctrl-C / SIGTERM / SIGHUP: finish the iteration in flight, write a
  // checkpoint there, exit 130 / 143 / 129 (128 + the signal).
  auto stop = std::make_shared<tessera::cluster::GracefulStop>();
  std::atomic<bool> done = false;
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  // The terminal closed: the same (it killed the run without a checkpoint),
  // unless started ignoring it (`nohup`): the run goes on.
  const bool hangup = !tessera::SignalIgnored(SIGHUP);
  if (hangup) std::signal(SIGHUP, OnStopSignal);
  // The progress on stdout is a view of the run: a reader that goes (`|
  // head`) must not end it without a checkpoint (SIGPIPE killed it, exit
  // 141, no word). The writes fail instead, and the run ends as with a
  // full stdout: trained, checkpointed, then "cannot write to standard
  // output", exit 1.
  std::signal(SIGPIPE, SIG_IGN);
  std::thread watcher([&] {
    while (!done.load()) {
      if (g_stop_signal != 0 && !stop->requested()) {
        std::fprintf(stderr, "\ntessera: %s: %s (again to stop at once)\n", tessera::StopSignalVerb(g_stop_signal),
                     tessera::BuildingDatasetFromText() ? "stopping the dataset being built from dataloader.text_file"
                                                        : "stopping after this iteration and writing a checkpoint");
        stop->Request();
        tessera::RequestInterrupt();  // (a dataset being built stops too)
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  // (Joined however the run ends: an exception out of it, a bad_alloc,
  // destroyed the watcher joinable, and std::terminate ended the process
  // without a word of why.)
  absl::Cleanup join_watcher = [&] {
    done = true;
    watcher.join();
  };
  // The master and worker code of a cluster, in this process.
  const absl::Status trained = tessera::cluster::TrainOnThisMachine(*config, stdout, stop);
  std::move(join_watcher).Invoke();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (hangup) std::signal(SIGHUP, SIG_DFL);
  if (!trained.ok()) {
    const int signal = g_stop_signal;
    Fail(std::string(trained.message()));
    return trained.code() == absl::StatusCode::kCancelled && signal != 0 ? 128 + signal : 1;
  }
  // (Said at the end: one said at the start stood beside the error of a run
  // that never started.)
  if (fast_dev_run) {
    const bool evaluated = config->at("train").at("evaluation").at("enabled").get<bool>();
    std::printf("fast dev run passed: 20 iterations, checkpoints %s into %s\n",
                evaluated ? "and evaluations" : "(the job has no evaluation)",
                config->at("train").at("output_dir").get<std::string>().c_str());
  }
  return 0;
}

int RunPlan(const std::string& path, const std::vector<std::string>& overrides, const std::string& format) {
  auto config = tessera::LoadJobConfig(path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  auto text = tessera::DescribeTrainingPlan(*config, format);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  std::printf("%s", text->c_str());
  return 0;
}

// The flags that take an empty value as a value: an empty prompt starts
// a new document. Any other flag given "" (a path, an address, a token
// file: `--tls-ca=$CA` with CA unset) would silently act as not given.
bool TakesEmptyValue(const std::string_view flag) { return flag == "--prompt"; }

// Numbers on the command line are decimal: CLI11 reads "010" as octal and
// "0x10" as hex (strtoll's base 0), and "-1" for an unsigned option as
// 2^64 - 1. A check ahead of every other on each integer and float option
// (so "abc" is "not a number", not "not in range"); and no empty value for
// a flag that does not take one.
void CheckOptionValues(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.starts_with("TEXT") && !option->get_lnames().empty()) {
      const bool empty_allowed = TakesEmptyValue("--" + option->get_lnames().front());
      option->transform(CLI::Validator(
          [empty_allowed](std::string& value) -> std::string {
            if (value.empty() && !empty_allowed) return "an empty value: give one, or leave the flag out";
            // A flag given no value takes the next argument, an option
            // ("--output --no-eod" wrote --no-eod.bin, and the flag meant
            // was lost).
            if (value.size() > 2 && value.starts_with("--") && std::isalpha(static_cast<unsigned char>(value[2]))) {
              return tessera::StrCat("'", value, "' is an option, not this flag's value (give the value first; a ",
                                     "name that starts with '--' as ./", value, ")");
            }
            return std::string();
          },
          "", "non-empty"));
      continue;
    }
    const bool is_unsigned = type.starts_with("UINT");
    const bool is_integer = is_unsigned || type.starts_with("INT");
    if (!is_integer && !type.starts_with("FLOAT")) continue;
    option->transform(CLI::Validator(
        [is_integer, is_unsigned](std::string& value) -> std::string {
          const std::string_view digits =
              std::string_view(value).substr(!value.empty() && (value[0] == '-' || value[0] == '+') ? 1 : 0);
          if (is_integer) {
            const bool decimal = !digits.empty() &&
                                 std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
            if (!decimal || (is_unsigned && value[0] == '-' && digits.find_first_not_of('0') != std::string::npos)) {
              return tessera::StrCat("'", value, "' is not a", is_unsigned ? " non-negative" : "n",
                                     " integer (decimal digits)");
            }
            // (Leading zeros are decimal too: "010" is 10; "-0" is 0.)
            const size_t nonzero = std::min(digits.find_first_not_of('0'), digits.size() - 1);
            const std::string_view magnitude = digits.substr(nonzero);
            value = tessera::StrCat(value[0] == '-' && magnitude != "0" ? "-" : "", magnitude);
            return std::string();
          }
          // strtod's numbers, less its hexadecimal ones, NaN and the
          // infinities (a range check lets NaN through).
          char* end = nullptr;
          const double number = std::strtod(value.c_str(), &end);
          if (value.empty() || end != value.c_str() + value.size() ||
              std::isspace(static_cast<unsigned char>(value[0])) || digits.starts_with("0x") ||
              digits.starts_with("0X")) {
            return tessera::StrCat("'", value, "' is not a number");
          }
          if (!std::isfinite(number)) return tessera::StrCat("'", value, "' is not a finite number");
          return std::string();
        },
        "", "decimal"));
  }
  for (CLI::App* sub : app.get_subcommands({})) CheckOptionValues(*sub);
}

// `value` without the marker Main puts on a "[...]" argument.
void Unmark(std::string& value) {
  if (value.size() >= 3 && value.back() == tessera::kBracketMarker && value[value.size() - 2] == ']') value.pop_back();
}

// Takes the marker off the arguments Main marked "[...]" (below), ahead of
// every other check of every option and positional: CLI11 reads such an
// argument given to a list as the list's elements ("[in.txt]" read
// in.txt; "[a=1,b=2]" applied two overrides), and a marked one is no list.
void UnmarkBracketedValues(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    // (Transforms run before checks, the last added first.)
    option->transform(CLI::Validator(
        [](std::string& value) -> std::string {
          Unmark(value);
          return std::string();
        },
        "", ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) UnmarkBracketedValues(*sub);
}

int Main(int argc, char** argv) {
  CLI::App app{"Tessera: train large neural networks on many devices from a program written for one."};
  app.set_version_flag("--version", "tessera 0.1.0");
  app.require_subcommand(1);
  // --log-level after the verb too (`tessera train --log-level info ...`).
  app.fallthrough();
  std::string log_level = "warn";
  // Applied as it is parsed: the daemons (master, worker) run inside their
  // verb's callback, which CLI11 calls before parse() returns (they logged
  // at info, on stdout, whatever the flag said).
  (void)tessera::SetLogLevel(log_level);
  app.add_option("--log-level", log_level,
                 "Log lines on stderr: trace, debug, info (compile, plan and run timings), warn, error or off")
      ->capture_default_str()
      ->trigger_on_parse()
      ->check(CLI::Validator(
          [](const std::string& level) -> std::string {
            const absl::Status status = tessera::SetLogLevel(level);
            return status.ok() ? std::string() : std::string(status.message());
          },
          "LEVEL"));

  std::string ops_format = "text";
  CLI::App* ops = app.add_subcommand("ops", "List registered ops: kernels per device, gradient, SBP signatures");
  ops->add_option("--format", ops_format, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  std::string config_path;
  std::vector<std::string> overrides;
  bool schema = false;
  CLI::App* config = app.add_subcommand(
      "config",
      "Print the resolved config (after _base_ merges, overrides and defaults; every key checked, the job as a whole "
      "by `tessera plan`), or the schema of every key");
  config->add_option("CONFIG", config_path, "Config file (JSON, comments allowed)");
  config->add_option("overrides", overrides, "key.path=value overrides");
  config->add_flag("--schema", schema, "Print the reference of every config key (Markdown, as docs/config.md)");

  std::string train_config;
  std::vector<std::string> train_overrides;
  CLI::App* train = app.add_subcommand("train", "Train the model of a config through the actor runtime");
  train->add_option("CONFIG", train_config, "Config file (JSON, comments allowed)")->required();
  train->add_option("overrides", train_overrides, "key.path=value overrides");
  bool train_resume = false;
  train->add_flag("--resume", train_resume,
                  "Continue from the latest checkpoint in train.output_dir/checkpoints (sets train.resume=true)");
  bool train_eval_only = false;
  train->add_flag("--eval-only", train_eval_only,
                  "Train nothing: evaluate train.load_weight's weights, or else the latest checkpoint's in "
                  "train.output_dir/checkpoints, once, writing nothing (sets train.eval_only=true)");
  bool train_fast_dev_run = false;
  train->add_flag("--fast-dev-run", train_fast_dev_run,
                  "Check a config end to end: 20 iterations from scratch with evaluations (2 batches) and "
                  "checkpoints at 10 and 20, into train.output_dir/fast_dev_run");

  std::string plan_config;
  std::vector<std::string> plan_overrides;
  std::string plan_format = "text";
  CLI::App* plan = app.add_subcommand("plan", "Print the physical plan of a config: actors, registers, memory per device");
  plan->add_option("CONFIG", plan_config, "Config file (JSON, comments allowed)")->required();
  plan->add_option("overrides", plan_overrides, "key.path=value overrides");
  plan->add_option("--format", plan_format, "Output format (memory: only the memory per device)")
      ->check(CLI::IsMember({"text", "memory", "dot", "json"}))
      ->capture_default_str();
  bool plan_resume = false;
  plan->add_flag("--resume", plan_resume,
                 "The plan of the run `tessera train --resume` would make: the latest checkpoint's iteration, global "
                 "batch and index (every tensor's name, type and shape against the plan) are checked (the tensors' "
                 "data only train reads) (sets train.resume=true)");

  // master, worker, submit, status, logs, cancel: the daemons and their
  // client, with the engine behind the master's compiler and the worker's runner.
  // preprocess, tokenize: text into datasets, and the tool to check a vocabulary.
  tessera::AddDataCommands(app);

  tessera::AddClusterCommands(
      app, {.make_compiler = tessera::cluster::MakeEngineJobCompiler,
            .make_runner = tessera::cluster::MakeEnginePlanRunnerFactory(),
            .fast_dev_run_overrides = [](const std::string& config, const std::vector<std::string>& overrides) {
              return tessera::FastDevRunOverrides(config, overrides);
            }});

  CheckOptionValues(app);
  UnmarkBracketedValues(app);

  // "--prompt=" is an empty value, passed on as "--prompt" "": CLI11 would
  // take the next argument as its value ("--output= --no-eod" wrote
  // "--no-eod.bin"); for any other flag it is refused (TakesEmptyValue).
  // Arguments after "--" are left as they are.
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      for (; i < argc; ++i) args.emplace_back(argv[i]);
      break;
    }
    if (i > 0 && arg.size() > 3 && arg.starts_with("--") && arg.find('=') == arg.size() - 1) {
      const std::string_view flag = arg.substr(0, arg.size() - 1);
      if (!TakesEmptyValue(flag)) {
        return Fail(tessera::StrCat(flag, "=: an empty value: give one, or leave ", flag, " out"));
      }
      args.emplace_back(flag);
      args.emplace_back();
      continue;
    }
    args.emplace_back(arg);
  }
  // CLI11 reads an argument "[...]" given to a list as the list's elements
  // (`tessera tokenize "[x]"` tokenised "x", `preprocess --input "[a.txt]"`
  // read a.txt, `train C "[a=1,b=2]"` applied two overrides): every such
  // argument after the verb carries a marker past its ']', which a
  // transform of every option takes off (UnmarkBracketedValues).
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].starts_with("-") || args[i - 1] == "--log-level") continue;  // tessera's own options
    for (size_t k = i + 1; k < args.size(); ++k) {
      if (args[k].size() >= 2 && args[k].front() == '[' && args[k].back() == ']') args[k] += tessera::kBracketMarker;
    }
    break;
  }
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  argc = static_cast<int>(pointers.size());
  argv = pointers.data();

  // CLI11 reads an unknown verb as a stray argument and says only "A
  // subcommand is required".
  // The verb is the first argument that is neither an option of tessera's
  // own nor the value of --log-level.
  int verb = 1;
  while (verb < argc && argv[verb][0] == '-') {
    const std::string_view option = argv[verb];
    if (option == "--log-level") {
      verb += 2;
      continue;
    }
    if (option != "-h" && option != "--help" && option != "--version" && !option.starts_with("--log-level=")) {
      return Fail(tessera::StrCat("unknown option '", option, "' (see tessera --help)"));
    }
    ++verb;
  }
  // Errors in a verb's arguments point at that verb's help.
  std::string help = "tessera --help";
  if (verb < argc) {
    const CLI::App* known = nullptr;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(argv[verb])) known = sub;
    }
    if (known == nullptr) return Fail(tessera::StrCat("unknown command '", argv[verb], "' (see tessera --help)"));
    help = tessera::StrCat("tessera ", known->get_name(), " --help");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a cluster verb that failed: its reason
    Fail(e.what());
    return e.get_exit_code() > 1 ? e.get_exit_code() : 1;  // (130: interrupted)
  } catch (const CLI::ParseError& e) {
    // One line and exit code 1, like every other bad input. An argument the
    // verb does not take is named before a missing one (CLI11 checks the
    // required ones first: `tessera logs -x` said only "JOB is required"),
    // in the order given.
    const std::vector<std::string> extras = app.remaining(true);
    if (!extras.empty() && (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
                            dynamic_cast<const CLI::RequiredError*>(&e) != nullptr)) {
      std::vector<std::string> options;
      std::vector<std::string> others;
      for (std::string extra : extras) {
        Unmark(extra);  // (no transform ran on an argument the verb did not take)
        (extra.starts_with("-") && extra.size() > 1 ? options : others).push_back(tessera::StrCat("'", extra, "'"));
      }
      const std::string what =
          !options.empty() ? tessera::StrCat(options.size() > 1 ? "unknown options " : "unknown option ",
                                             absl::StrJoin(options, ", "))
                           : tessera::StrCat(others.size() > 1 ? "unexpected arguments " : "unexpected argument ",
                                             absl::StrJoin(others, ", "));
      return Fail(tessera::StrCat(what, " (see ", help, ")"));
    }
    // (--log-level is tessera's, wherever it stands: its verb's help does
    // not list it.)
    if (std::string_view(e.what()).starts_with("--log-level")) help = "tessera --help";
    return Fail(tessera::StrCat(e.what(), " (see ", help, ")"));
  }

  if (*ops) return RunOps(ops_format);
  if (*config) return RunConfig(config_path, overrides, schema);
  if (*train) {
    if (auto error = tessera::AddFlagOverrides(train_overrides, train_resume, train_eval_only)) return Fail(*error);
    return RunTrain(train_config, train_overrides, train_fast_dev_run);
  }
  if (*plan) {
    if (auto error = tessera::AddFlagOverrides(plan_overrides, plan_resume, false)) return Fail(*error);
    return RunPlan(plan_config, plan_overrides, plan_format);
  }
  return Fail("no command given (see --help)");
}

// The verb's out-of-memory line (the hint is for the verbs that run or plan
// a job), set before anything runs: the terminate handler cannot allocate.
const char* g_out_of_memory = "out of memory (an allocation failed)";

const char* OutOfMemoryMessage() { return g_out_of_memory; }

void SetOutOfMemoryMessage(int argc, char** argv) {
  std::string_view verb;
  for (int i = 1; i < argc && verb.empty(); ++i) {
    if (std::string_view(argv[i]) == "--log-level") {
      ++i;  // (its value)
    } else if (argv[i][0] != '-') {
      verb = argv[i];
    }
  }
  if (verb == "train" || verb == "plan" || verb == "worker" || verb == "master") {
    g_out_of_memory = "out of memory (an allocation failed; see `tessera plan` for what the job needs)";
  }
}

// An exception no thread caught (std::bad_alloc on a worker's or a gRPC
// handler's thread under `ulimit -v`): one line instead of "terminate
// called after throwing ..." and an abort. Out of memory exits 1 (the
// line is written without allocating); anything else is a bug: said, then
// aborted for its core.
[[noreturn]] void OnUncaughtException() {
  // One thread says it (two at once wrote "tessera: tessera: out of
  // memory"); another one waits for the process to end.
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    for (;;) ::pause();
  }
  bool out_of_memory = false;
  const char* what = "std::terminate was called without an exception";
  if (const std::exception_ptr thrown = std::current_exception()) {
    what = "an exception that is no std::exception";
    try {
      std::rethrow_exception(thrown);
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  const auto say = [](const char* text) { (void)!::write(STDERR_FILENO, text, std::strlen(text)); };
  say("tessera: ");
  say(out_of_memory ? g_out_of_memory : "internal error: ");
  if (!out_of_memory) say(what);
  say("\n");
  if (out_of_memory) ::_exit(1);
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  SetOutOfMemoryMessage(argc, argv);
  std::set_terminate(OnUncaughtException);
  // glibc loads libgcc_s for a thread's unwinding (pthread_exit, a
  // cancellation) the first time one needs it; without memory left then
  // (ulimit -v) it aborted: "libgcc_s.so.1 must be installed for unwinding
  // to work". backtrace() loads it now, while there is.
  std::array<void*, 1> frame{};
  (void)::backtrace(frame.data(), static_cast<int>(frame.size()));
  // Under an address-space limit (ulimit -v) what counts is what a thread
  // reserves, not what it uses: glibc gives threads malloc arenas of 64 MiB
  // each (up to 8 per core) and stacks of RLIMIT_STACK (8 MiB), so a run
  // that needed a few hundred MiB more failed wherever the next thread or
  // arena came, often inside a library that aborts on it (gRPC's server
  // threads, oneDNN's first use). With a limit, two arenas and 2 MiB
  // stacks (no thread of Tessera's recurses deeply: configs nest at most
  // kMaxNestingDepth) leave that room to the job.
  if (rlimit limit{}; ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    ::mallopt(M_ARENA_MAX, 2);
    pthread_attr_t attributes;
    if (::pthread_attr_init(&attributes) == 0) {
      if (::pthread_attr_setstacksize(&attributes, std::size_t{2} << 20) == 0) {
        (void)::pthread_setattr_default_np(&attributes);
      }
      ::pthread_attr_destroy(&attributes);
    }
  }
  // The libraries return errors as Status values; this is the last line of
  // defence for anything that throws anyway, so it ends in one line, not an
  // abort.
  tessera::cluster::RouteGrpcLogs();
  // A write past the file-size limit (`ulimit -f`) fails with EFBIG, which
  // every writer reports naming its file and cleans up after; SIGXFSZ's
  // default action killed the process instead (exit 153, no word, its
  // temporary files left).
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    const int code = Main(argc, argv);
    // What a command printed must have reached its stdout (a full disk, a
    // closed pipe): `tessera config x.json > resolved.json` is not a
    // success when resolved.json came out short.
    errno = 0;
    if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && code == 0) {
      return Fail(tessera::StrCat("cannot write to standard output", errno != 0 ? ": " : "",
                                  errno != 0 ? std::strerror(errno) : ""));
    }
    return code;
  } catch (const std::bad_alloc&) {
    return Fail(OutOfMemoryMessage());
  } catch (const std::exception& e) {
    return Fail(std::string("internal error: ") + e.what());
  }
}
