#include "train/progress.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>

#include "core/status.h"
#include "fmt/format.h"

namespace tessera {
namespace {

// ANSI "erase from the cursor to the end of the line": what a shorter
// redraw leaves of a longer one.
constexpr std::string_view kEraseToEndOfLine = "\x1b[K";

// The fields after "iter i/n" (or after the bar), shared by both modes so
// that they never disagree. `loss_decimals`: the bar has less room.
std::string Fields(const IterationStats& stats, const ProgressTiming& timing, int loss_decimals) {
  std::string out = fmt::format("loss {:.{}f}  lr {:.4g}", stats.loss, loss_decimals, stats.lr);
  auto it = std::back_inserter(out);
  if (stats.grad_norm) fmt::format_to(it, "  grad_norm {:.4g}", *stats.grad_norm);
  if (stats.tokens_per_s) fmt::format_to(it, "  tokens/s {:.0f}", *stats.tokens_per_s);
  if (stats.samples_per_s) fmt::format_to(it, "  samples/s {:.0f}", *stats.samples_per_s);
  fmt::format_to(it, "  eta {}  elapsed {}", timing.eta_s ? FormatHms(*timing.eta_s) : FormatHms(-1),
                 FormatHms(timing.elapsed_s));
  return out;
}

}  // namespace

std::string FormatHms(double seconds) {
  if (!(seconds >= 0 && seconds <= 1e9)) return "-:--:--";
  const auto total = static_cast<int64_t>(seconds);
  return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
}

std::string FormatProgressLogLine(const IterationStats& stats, const ProgressTiming& timing) {
  return fmt::format("iter {}/{}  {}", stats.iteration, stats.total, Fields(stats, timing, 6));
}

std::string FormatProgressBar(const IterationStats& stats, const ProgressTiming& timing, int columns, int bar_width) {
  TESSERA_CHECK(bar_width >= 1, "progress bar of ", bar_width, " cells");
  const double fraction =
      stats.total > 0 ? std::clamp(static_cast<double>(stats.iteration) / static_cast<double>(stats.total), 0.0, 1.0)
                      : 0.0;
  const int filled = static_cast<int>(std::floor(fraction * bar_width));
  std::string bar(static_cast<size_t>(filled), '=');
  // The arrow marks the cell in progress; a full bar has none.
  if (filled < bar_width) bar += '>';
  bar.resize(static_cast<size_t>(bar_width), ' ');
  std::string line = fmt::format("[{}] {:3.0f}%  {}/{}  {}", bar, std::floor(fraction * 100), stats.iteration,
                                 stats.total, Fields(stats, timing, 4));
  // The last column too would make some terminals wrap before the "\r".
  if (columns > 0 && line.size() >= static_cast<size_t>(columns)) line.resize(static_cast<size_t>(columns - 1));
  return line;
}

std::string FormatEvalLine(int64_t iteration, int64_t total,
                           const std::vector<std::pair<std::string, double>>& metrics) {
  // (Weights of no training iteration: Hugging Face's, by train.load_weight;
  // "iteration 0" read as untrained ones.)
  std::string out = total > 0       ? fmt::format("eval iter {}/{}", iteration, total)
                    : iteration > 0 ? fmt::format("eval (weights of iteration {})", iteration)
                                    : std::string("eval (the weights of train.load_weight)");
  for (const auto& [name, value] : metrics) fmt::format_to(std::back_inserter(out), "  {} {:.6f}", name, value);
  return out;
}

int TerminalColumns(std::FILE* out) {
  winsize size{};
  if (out == nullptr || ::ioctl(::fileno(out), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

// ---------------------------------------------------------------- EtaEstimator

EtaEstimator::EtaEstimator(int64_t total, double start_s, int64_t start_iteration, double smoothing)
    : total_(total), smoothing_(smoothing), last_iteration_(start_iteration), last_s_(start_s) {
  TESSERA_CHECK(smoothing >= 0 && smoothing < 1, "smoothing ", smoothing);
}

void EtaEstimator::Update(int64_t iteration, double now_s) {
  if (iteration <= last_iteration_ || !(now_s > last_s_)) return;
  const double iterations = static_cast<double>(iteration - last_iteration_);
  const double sample = (now_s - last_s_) / iterations;
  // `iterations` steps of the per-iteration average, all with this sample.
  const double keep = std::pow(smoothing_, iterations);
  average_ = keep * average_ + (1 - keep) * sample;
  weight_ = keep * weight_ + (1 - keep);
  last_iteration_ = iteration;
  last_s_ = now_s;
}

std::optional<double> EtaEstimator::SecondsPerIteration() const {
  if (weight_ <= 0) return std::nullopt;
  return average_ / weight_;
}

std::optional<double> EtaEstimator::RemainingSeconds() const {
  const std::optional<double> per_iteration = SecondsPerIteration();
  if (!per_iteration) return std::nullopt;
  return *per_iteration * static_cast<double>(std::max<int64_t>(0, total_ - last_iteration_));
}

// ---------------------------------------------------------------- ProgressDisplay

ProgressDisplay::ProgressDisplay(std::FILE* out, bool is_tty, Options options)
    : out_(out),
      is_tty_(is_tty),
      options_(std::move(options)),
      start_s_(Now()),
      eta_(options_.total_iterations, start_s_, options_.start_iteration) {
  TESSERA_CHECK(options_.total_iterations >= 1 && options_.log_period >= 1 && options_.start_iteration >= 0,
                "progress of ", options_.total_iterations, " iterations from ", options_.start_iteration,
                ", log period ", options_.log_period);
}

double ProgressDisplay::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressDisplay::Write(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

void ProgressDisplay::Redraw() {
  if (!last_) return;
  const double now = Now();
  const ProgressTiming timing{.elapsed_s = now - start_s_, .eta_s = eta_.RemainingSeconds()};
  Write(StrCat("\r", FormatProgressBar(*last_, timing, options_.columns), kEraseToEndOfLine));
  bar_on_screen_ = true;
  last_draw_s_ = now;
}

void ProgressDisplay::Update(const IterationStats& stats) {
  TESSERA_CHECK(stats.total == options_.total_iterations, "progress of iteration ", stats.iteration, "/", stats.total,
                " in a display of ", options_.total_iterations);
  const double now = Now();
  eta_.Update(stats.iteration, now);
  const bool last = stats.iteration >= options_.total_iterations;
  if (!is_tty_) {
    if (stats.iteration % options_.log_period != 0 && !last) return;
    const ProgressTiming timing{.elapsed_s = now - start_s_, .eta_s = eta_.RemainingSeconds()};
    Write(StrCat(FormatProgressLogLine(stats, timing), "\n"));
    return;
  }
  last_ = stats;
  if (last || !last_draw_s_ || now - *last_draw_s_ >= options_.min_redraw_interval_s) Redraw();
}

void ProgressDisplay::Line(std::string_view text) {
  if (!is_tty_) {
    Write(StrCat(text, "\n"));
    return;
  }
  // Over the bar, then the bar again below.
  Write(StrCat(bar_on_screen_ ? StrCat("\r", kEraseToEndOfLine) : std::string(), text, "\n"));
  bar_on_screen_ = false;
  Redraw();
}

void ProgressDisplay::Eval(int64_t iteration, const std::vector<std::pair<std::string, double>>& metrics) {
  Line(FormatEvalLine(iteration, options_.eval_only ? 0 : options_.total_iterations, metrics));
}

void ProgressDisplay::Finish() {
  if (!is_tty_ || !bar_on_screen_) return;
  Redraw();
  Write("\n");
  bar_on_screen_ = false;
  last_.reset();
}

}  // namespace tessera
