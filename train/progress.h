#pragma once
// What `tessera train` shows while it trains.
//
// On a terminal, one line redrawn in place ("\r", then ANSI erase to the end
// of the line):
//   [=========>          ]  45%  450/1000  loss 3.2100  lr 0.0003  grad_norm 0.87  tokens/s 51234  eta 0:01:02  elapsed
//   0:00:51
// Anywhere else (a pipe, a file, CI), where "\r" would pile up into one
// unreadable line, plain lines, one per logged iteration, in a format meant
// to be parsed (double-space separated "key value" fields, the optional
// ones left out when absent):
//   iter 450/1000  loss 3.210000  lr 0.0003  grad_norm 0.87  tokens/s 51234  eta 0:01:02  elapsed 0:00:51
// Evaluation results are lines of their own in both modes ("eval iter
// 450/1000  loss 3.300000"), the bar redrawn below them.
//
// The formatting is pure functions (tested alone); ProgressDisplay does the
// I/O and the timing. Whether the output is a terminal is the caller's call
// (isatty(fileno(out)) at the call site), so tests drive both modes.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

// One trained iteration, as the training loop measured it.
struct IterationStats {
  int64_t iteration = 0;  // iterations done so far: 1..total
  int64_t total = 0;      // train.train_iter
  double loss = 0;
  double lr = 0;
  std::optional<double> grad_norm = std::nullopt;     // where the plan fetches it
  std::optional<double> tokens_per_s = std::nullopt;  // models with tokens
  std::optional<double> samples_per_s = std::nullopt;
};

struct ProgressTiming {
  double elapsed_s = 0;
  std::optional<double> eta_s = std::nullopt;  // absent until there is a rate
};

// "h:mm:ss" ("0:01:02", "27:46:40"); "-:--:--" for a negative, non-finite
// or absurd (over 10^9 s) duration.
[[nodiscard]] std::string FormatHms(double seconds);

// The plain line, without the newline.
[[nodiscard]] std::string FormatProgressLogLine(const IterationStats& stats, const ProgressTiming& timing);

// The terminal line, without "\r" or escapes: a bar of `bar_width` (≥ 1) cells,
// the percentage, then the fields. Cut to `columns` characters when that is
// > 0 (a line longer than the terminal wraps, and "\r" would then redraw
// only its last part).
[[nodiscard]] std::string FormatProgressBar(const IterationStats& stats, const ProgressTiming& timing, int columns,
                                            int bar_width = 20);

// "eval iter 450/1000  loss 3.300000  accuracy 0.412000", without the
// newline; metrics in the order given. `total` 0: an evaluation of saved
// weights alone (--eval-only), "eval (weights of iteration 450)  loss ...".
[[nodiscard]] std::string FormatEvalLine(int64_t iteration, int64_t total,
                                         const std::vector<std::pair<std::string, double>>& metrics);

// The width of the terminal behind `out`, or 0 when it is not one or does
// not say.
[[nodiscard]] int TerminalColumns(std::FILE* out);

// Remaining time from a smoothed time per iteration: an exponential moving
// average over iterations (factor `smoothing` per iteration, so it does not
// matter how many iterations one Update covers), bias-corrected as Adam's
// moments so the first updates are not pulled towards zero. The interval
// before the first Update counts too (it holds the first iteration, and
// whatever setup the caller's start time includes), and fades as the run
// goes on. Not thread-safe; a plain value.
class EtaEstimator {
 public:
  // `start_iteration` iterations were done at `start_s` (non-zero when a
  // run resumes from a checkpoint: the time before counts nothing).
  EtaEstimator(int64_t total, double start_s, int64_t start_iteration = 0, double smoothing = 0.98);
  // `iteration` iterations are done at time `now_s` (seconds, monotonic).
  // Calls with no new iteration or no elapsed time change nothing.
  void Update(int64_t iteration, double now_s);
  // Absent before a rate is known.
  std::optional<double> SecondsPerIteration() const;
  std::optional<double> RemainingSeconds() const;

 private:
  int64_t total_;
  double smoothing_;
  int64_t last_iteration_;
  double last_s_;
  double average_ = 0;  // biased EMA of seconds per iteration
  double weight_ = 0;   // its bias: 1 − smoothing^(iterations seen)
};

// Draws the progress of one run on `out`. Not thread-safe: the training
// loop's thread calls it. Borrows `out`. Output is best-effort: a failed
// write (a closed terminal) is ignored, never a reason to stop training.
//
// Terminal mode: every Update redraws the bar, at most once per
// `min_redraw_interval_s` (the last iteration always), and Finish() ends the
// line. Plain mode: Update prints a line when the iteration is a multiple of
// `log_period` or the last one.
class ProgressDisplay {
 public:
  struct Options {
    int64_t total_iterations = 1;
    // Iterations already trained when the display starts (a resumed run).
    int64_t start_iteration = 0;
    int64_t log_period = 1;
    int columns = 0;  // terminal width; 0: no limit
    // --eval-only: the evaluation of saved weights, no training iterations.
    bool eval_only = false;
    double min_redraw_interval_s = 0.1;
    // Monotonic seconds; empty: std::chrono::steady_clock. Tests pass a fake.
    std::function<double()> clock = {};
  };

  // The elapsed time and the ETA count from now.
  ProgressDisplay(std::FILE* out, bool is_tty, Options options);
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  // `stats.total` is `total_iterations` (TESSERA_CHECKed).
  void Update(const IterationStats& stats);
  void Eval(int64_t iteration, const std::vector<std::pair<std::string, double>>& metrics);
  // Any other line (a warning, a checkpoint saved) above the bar.
  void Line(std::string_view text);
  // Leaves the final bar on its own line (terminal mode). Idempotent.
  void Finish();

 private:
  double Now() const;
  void Redraw();
  void Write(std::string_view text);

  std::FILE* out_;
  bool is_tty_;
  Options options_;
  double start_s_;
  EtaEstimator eta_;
  std::optional<IterationStats> last_;  // the stats the bar shows
  std::optional<double> last_draw_s_;
  bool bar_on_screen_ = false;  // the cursor is on the bar's line
};

}  // namespace tessera
