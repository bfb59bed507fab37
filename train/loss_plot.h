#pragma once
// The loss curve of a run as an SVG image (DESIGN §11: the loss plot in
// train.output_dir): train loss and, when there is any, eval loss against
// the iteration, with axes, tick labels, a legend and a title.
//
// The file stands alone: no scripts, no external fonts or stylesheets (the
// generic `sans-serif` family), valid XML, so any browser or image viewer
// shows it and a test can parse it.
//
// Scaling. x spans the iterations of both series. y is logarithmic when
// every value is positive and the largest is at least ten times the
// smallest (a run whose loss falls over decades, where a linear axis would
// flatten all but the first iterations), linear otherwise; the range is the
// data's with 5% of margin, ticks at 1-2-5 steps. Points whose loss is NaN or
// infinite are left out (the line joins their neighbours); a series of one
// point is drawn as a dot, an empty one not at all.
//
// Down-sampling. A series of more than `max_points_per_series` points keeps
// its first and last point and, from each of (max - 2) / 2 equal runs of the
// points between, that run's lowest and highest point (in iteration order):
// the curve keeps its envelope, so spikes stay visible however long the run.
//
// For tests and tools the plot group carries its mapping as data-*
// attributes (SVG 2 allows them): data-x-min/-max, data-y-min/-max (the
// axis ranges, in data units), data-y-scale ("linear" or "log") and
// data-left/-right/-top/-bottom (the plot area, in pixels). Each series is a
// <polyline data-series="train|eval">.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tessera {

struct LossPoint {
  int64_t iteration = 0;
  double loss = 0;
};

struct LossPlotOptions {
  std::string title = "Loss";
  int width = 800;   // pixels; at least 200
  int height = 480;  // pixels; at least 150
  // Most points drawn per series (at least 4): beyond a few per pixel column
  // more points only make the file larger.
  size_t max_points_per_series = 2000;
};

// The SVG document. `train` and `eval` need not be sorted by iteration.
// Pure; TESSERA_CHECKs the option bounds above.
[[nodiscard]] std::string LossPlotSvg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& eval,
                                      const LossPlotOptions& options = {});

// Writes LossPlotSvg(...) to `path` through WriteFileDurably (a temporary
// name beside it, fsynced, renamed over it), so a reader (or a crash) never
// sees a half-written plot. Errors name `path`; the directory must exist.
[[nodiscard]] absl::Status WriteLossPlot(const std::filesystem::path& path, const std::vector<LossPoint>& train,
                                         const std::vector<LossPoint>& eval, const LossPlotOptions& options = {});

}  // namespace tessera
