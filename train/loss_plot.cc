#include "train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <string_view>

#include "core/file_util.h"
#include "core/status.h"
#include "fmt/format.h"

namespace tessera {
namespace {

constexpr std::string_view kTrainColor = "#1f77b4";
constexpr std::string_view kEvalColor = "#ff7f0e";
// Plot-area margins, in pixels: room for the title above, the tick labels
// and axis titles to the left and below.
constexpr double kMarginLeft = 72, kMarginRight = 20, kMarginTop = 36, kMarginBottom = 48;

std::string EscapeXml(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 allows no control characters but tab, newline and return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

// The finite points in iteration order.
std::vector<LossPoint> Plottable(const std::vector<LossPoint>& points) {
  std::vector<LossPoint> out;
  std::copy_if(points.begin(), points.end(), std::back_inserter(out),
               [](const LossPoint& p) { return std::isfinite(p.loss); });
  std::stable_sort(out.begin(), out.end(),
                   [](const LossPoint& a, const LossPoint& b) { return a.iteration < b.iteration; });
  return out;
}

// First, last, and the min and max of each equal run of the points between
// (see the header).
std::vector<LossPoint> DownSample(const std::vector<LossPoint>& points, size_t max_points) {
  if (points.size() <= max_points) return points;
  const size_t inner = points.size() - 2;
  const size_t buckets = (max_points - 2) / 2;
  std::vector<LossPoint> out;
  out.reserve(max_points);
  out.push_back(points.front());
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = 1 + b * inner / buckets, end = 1 + (b + 1) * inner / buckets;
    if (begin == end) continue;
    const auto less = [](const LossPoint& a, const LossPoint& c) { return a.loss < c.loss; };
    const auto [lo, hi] = std::minmax_element(points.begin() + begin, points.begin() + end, less);
    const auto first = std::min(lo, hi), second = std::max(lo, hi);
    out.push_back(*first);
    if (second != first) out.push_back(*second);
  }
  out.push_back(points.back());
  return out;
}

// 1, 2 or 5 × 10^k: the smallest such step ≥ `rough`.
double NiceStep(double rough) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= rough * (1 - 1e-9)) return m * magnitude;
  }
  return 10 * magnitude;
}

// One axis: its range in data units and the mapping onto [pixel_lo, pixel_hi].
struct Axis {
  double min = 0, max = 1;
  bool log = false;
  double pixel_lo = 0, pixel_hi = 1;  // pixels of `min` and `max`

  double Transform(double v) const { return log ? std::log10(v) : v; }
  double ToPixel(double v) const {
    const double t = (Transform(v) - Transform(min)) / (Transform(max) - Transform(min));
    return pixel_lo + t * (pixel_hi - pixel_lo);
  }
};

struct Tick {
  double value;
  std::string label;
};

std::vector<Tick> LinearTicks(double min, double max, int target_count, bool integers) {
  double step = NiceStep((max - min) / target_count);
  if (integers) step = std::max(1.0, std::ceil(step));
  const int decimals = integers ? 0 : std::max(0, -static_cast<int>(std::floor(std::log10(step))));
  std::vector<Tick> ticks;
  // (Bounded: where the step is below the doubles' spacing at that size,
  // 2^53 and past, ++k stopped changing k and the loop never ended.)
  for (double k = std::ceil(min / step);
       k * step <= max + step * 1e-9 && ticks.size() < 4 * static_cast<size_t>(target_count) + 4; ++k) {
    const double v = k * step;
    if (!ticks.empty() && v <= ticks.back().value) break;
    // -0.000 reads oddly; a tick at zero is "0".
    ticks.push_back({v, fmt::format("{:.{}f}", std::abs(v) < step * 1e-9 ? 0.0 : v, decimals)});
  }
  return ticks;
}

std::vector<Tick> LogTicks(double min, double max) {
  // (A bound that rounds to 0 or past the doubles: its logarithm is not a
  // decade to count from.)
  if (!(min > 0) || !std::isfinite(max) || !std::isfinite(std::log10(min)) || !(max > min)) {
    return {{min, fmt::format("{:.3g}", min)}, {max, fmt::format("{:.3g}", max)}};
  }
  const double decades = std::log10(max / min);
  // Over a few decades 2 and 5 crowd the axis; over many, skip decades too.
  const std::vector<double> mantissas = decades <= 3 ? std::vector<double>{1, 2, 5} : std::vector<double>{1};
  const int decade_step = std::max(1, static_cast<int>(std::ceil(decades / 8)));
  std::vector<Tick> ticks;
  for (int e = static_cast<int>(std::floor(std::log10(min))); e <= static_cast<int>(std::ceil(std::log10(max)));
       e += decade_step) {
    for (const double m : mantissas) {
      const double v = m * std::pow(10.0, e);
      if (v >= min * (1 - 1e-12) && v <= max * (1 + 1e-12)) ticks.push_back({v, fmt::format("{:g}", v)});
    }
  }
  // A narrow range may hold no 1-2-5 value: label its ends instead.
  if (ticks.size() < 2) {
    ticks = {{min, fmt::format("{:.3g}", min)}, {max, fmt::format("{:.3g}", max)}};
  }
  return ticks;
}

// "x1,y1 x2,y2 ..." in pixels.
std::string Points(const std::vector<LossPoint>& points, const Axis& x, const Axis& y) {
  std::string out;
  for (const LossPoint& p : points) {
    if (!out.empty()) out += ' ';
    fmt::format_to(std::back_inserter(out), "{:.2f},{:.2f}", x.ToPixel(static_cast<double>(p.iteration)),
                   y.ToPixel(p.loss));
  }
  return out;
}

}  // namespace

std::string LossPlotSvg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& eval,
                        const LossPlotOptions& options) {
  TESSERA_CHECK(options.width >= 200 && options.height >= 150, "loss plot of ", options.width, "x", options.height);
  TESSERA_CHECK(options.max_points_per_series >= 4, "max_points_per_series ", options.max_points_per_series);
  const double width = options.width, height = options.height;
  const double left = kMarginLeft, right = width - kMarginRight, top = kMarginTop, bottom = height - kMarginBottom;

  struct Series {
    std::string_view name;
    std::string_view color;
    std::vector<LossPoint> points;  // finite, sorted, down-sampled
  };
  std::vector<Series> series;
  const auto add = [&](std::string_view name, std::string_view color, const std::vector<LossPoint>& data) {
    std::vector<LossPoint> points = DownSample(Plottable(data), options.max_points_per_series);
    if (!points.empty()) series.push_back({name, color, std::move(points)});
  };
  add("train", kTrainColor, train);
  add("eval", kEvalColor, eval);

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2:.2f}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      options.width, options.height, width / 2, EscapeXml(options.title));
  if (series.empty()) {
    fmt::format_to(
        std::back_inserter(svg),
        "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" stroke=\"black\"/>\n"
        "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" fill=\"gray\">no finite loss to plot</text>\n"
        "</svg>\n",
        left, top, right - left, bottom - top, (left + right) / 2, (top + bottom) / 2);
    return svg;
  }

  // ---- Ranges.
  double x_min = static_cast<double>(series[0].points.front().iteration), x_max = x_min;
  double y_min = series[0].points.front().loss, y_max = y_min;
  for (const Series& s : series) {
    x_min = std::min(x_min, static_cast<double>(s.points.front().iteration));
    x_max = std::max(x_max, static_cast<double>(s.points.back().iteration));
    for (const LossPoint& p : s.points) {
      y_min = std::min(y_min, p.loss);
      y_max = std::max(y_max, p.loss);
    }
  }
  if (x_min == x_max) {
    x_min -= 1;
    x_max += 1;
  }
  Axis x{.min = x_min, .max = x_max, .log = false, .pixel_lo = left, .pixel_hi = right};
  Axis y{.log = y_min > 0 && y_max >= 10 * y_min, .pixel_lo = bottom, .pixel_hi = top};
  if (y.log) {
    const double margin = 0.05 * std::log10(y_max / y_min);
    y.min = y_min / std::pow(10.0, margin);
    y.max = y_max * std::pow(10.0, margin);
  } else {
    const double span = y_max - y_min;
    const double margin = span > 0 ? 0.05 * span : std::max(std::abs(y_max) * 0.1, 1e-3);
    y.min = y_min - margin;
    y.max = y_max + margin;
  }
  const std::vector<Tick> x_ticks = LinearTicks(x.min, x.max, 6, /*integers=*/true);
  const std::vector<Tick> y_ticks = y.log ? LogTicks(y.min, y.max) : LinearTicks(y.min, y.max, 5, false);

  // ---- Grid, ticks, frame, axis titles.
  auto out = std::back_inserter(svg);
  svg += "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (const Tick& t : x_ticks) {
    fmt::format_to(out, "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\"/>\n", x.ToPixel(t.value),
                   top, bottom);
  }
  for (const Tick& t : y_ticks) {
    fmt::format_to(out, "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{2:.2f}\" y2=\"{1:.2f}\"/>\n", left,
                   y.ToPixel(t.value), right);
  }
  svg += "</g>\n<g text-anchor=\"middle\">\n";
  for (const Tick& t : x_ticks) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n", x.ToPixel(t.value), bottom + 16, t.label);
  }
  svg += "</g>\n<g text-anchor=\"end\">\n";
  for (const Tick& t : y_ticks) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n", left - 6, y.ToPixel(t.value) + 4, t.label);
  }
  svg += "</g>\n";
  fmt::format_to(out,
                 "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" stroke=\"black\"/>\n"
                 "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">iteration</text>\n"
                 "<text x=\"16\" y=\"{:.2f}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.2f})\">{}</text>\n",
                 left, top, right - left, bottom - top, (left + right) / 2, height - 10, (top + bottom) / 2,
                 (top + bottom) / 2, y.log ? "loss (log scale)" : "loss");

  // ---- The curves, clipped to the plot area (the margins keep them inside;
  // the clip only matters for a dot's edge).
  fmt::format_to(out,
                 "<clipPath id=\"plot-area\"><rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\"/>"
                 "</clipPath>\n"
                 "<g id=\"plot\" clip-path=\"url(#plot-area)\" data-x-min=\"{:.17g}\" data-x-max=\"{:.17g}\" "
                 "data-y-min=\"{:.17g}\" data-y-max=\"{:.17g}\" data-y-scale=\"{}\" data-left=\"{:.17g}\" "
                 "data-right=\"{:.17g}\" data-top=\"{:.17g}\" data-bottom=\"{:.17g}\">\n",
                 left, top, right - left, bottom - top, x.min, x.max, y.min, y.max, y.log ? "log" : "linear", left,
                 right, top, bottom);
  for (const Series& s : series) {
    fmt::format_to(out,
                   "<polyline data-series=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
                   "stroke-linejoin=\"round\" points=\"{}\"/>\n",
                   s.name, s.color, Points(s.points, x, y));
    if (s.points.size() == 1) {
      fmt::format_to(out, "<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n",
                     x.ToPixel(static_cast<double>(s.points[0].iteration)), y.ToPixel(s.points[0].loss), s.color);
    }
  }
  svg += "</g>\n";

  // ---- Legend, top right inside the plot area.
  const double legend_width = 70, row = 18;
  const double legend_x = right - legend_width - 8, legend_y = top + 8;
  fmt::format_to(out,
                 "<g id=\"legend\"><rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"white\" "
                 "fill-opacity=\"0.85\" stroke=\"#999999\"/>\n",
                 legend_x, legend_y, legend_width, row * static_cast<double>(series.size()) + 8);
  for (size_t i = 0; i < series.size(); ++i) {
    const double row_y = legend_y + 4 + row * (static_cast<double>(i) + 0.5);
    fmt::format_to(out,
                   "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" stroke-width=\"2\"/>"
                   "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n",
                   legend_x + 8, row_y, legend_x + 28, row_y, series[i].color, legend_x + 34, row_y + 4,
                   series[i].name);
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

absl::Status WriteLossPlot(const std::filesystem::path& path, const std::vector<LossPoint>& train,
                           const std::vector<LossPoint>& eval, const LossPlotOptions& options) {
  return WriteFileDurably(path, LossPlotSvg(train, eval, options));
}

}  // namespace tessera
