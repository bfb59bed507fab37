// The trainer's outputs and schedules: TensorBoard event files (decoded by
// tests/train/read_tfevents.py with google.protobuf and its own CRC-32C),
// the SVG loss plot (parsed by tests/train/read_svg.py with Python's XML
// parser), the progress display, and the learning-rate schedules (against
// formulas written out here).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numbers>
#include <regex>
#include <string>
#include <vector>

#include "core/schema.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "train/job_config.h"
#include "train/loss_plot.h"
#include "train/lr_schedule.h"
#include "train/progress.h"
#include "train/tfevents.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path TempDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / StrCat("tessera_train_outputs_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct ScriptResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a Python script of tests/train on `file`.
ScriptResult RunScript(const std::string& script, const fs::path& file) {
  const std::string cmd = StrCat("timeout 60 /usr/bin/python3 ", TESSERA_SOURCE_DIR, "/tests/train/", script, " '",
                                 file.string(), "' 2>&1");
  ScriptResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// read_tfevents.py exits 77 when google.protobuf is not installed.
constexpr int kScriptSkip = 77;

// ============================================================ CRC-32C

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (const int v : values) out.push_back(static_cast<char>(v));
  return out;
}

TEST(Crc32c, StandardVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // RFC 3720, appendix B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  const std::string read_pdu =
      Bytes({0x01, 0xc0, 0, 0,    0, 0, 0, 0,    0,    0, 0, 0, 0, 0, 0, 0, 0x14, 0, 0, 0, 0, 0, 0x04, 0,
             0,    0,    0, 0x14, 0, 0, 0, 0x18, 0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0,    0});
  ASSERT_EQ(read_pdu.size(), 48u);
  EXPECT_EQ(Crc32c(read_pdu), 0xD9963A56u);
}

TEST(Crc32c, ContinuesOverPieces) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  for (size_t cut = 0; cut <= text.size(); cut += 7) {
    EXPECT_EQ(Crc32c(text.substr(cut), Crc32c(text.substr(0, cut))), Crc32c(text)) << cut;
  }
}

TEST(Crc32c, Mask) {
  for (const uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu}) {
    const uint32_t rotated = (crc >> 15) | (crc << 17);
    EXPECT_EQ(MaskCrc32c(crc), static_cast<uint32_t>(rotated + 0xa282ead8u)) << crc;
  }
}

// ============================================================ Event files

struct DecodedScalar {
  int64_t step;
  double wall_time;
  float value;
  std::string tag;
};

struct DecodedFile {
  std::vector<std::string> versions;
  std::vector<DecodedScalar> scalars;
};

// The lines of read_tfevents.py, parsed.
DecodedFile Decode(const fs::path& file) {
  const ScriptResult r = RunScript("read_tfevents.py", file);
  if (r.exit_code == kScriptSkip) {
    ADD_FAILURE() << "cannot decode: " << r.out;
    return {};
  }
  EXPECT_EQ(r.exit_code, 0) << r.out;
  DecodedFile decoded;
  for (const std::string_view line : Split(r.out, '\n')) {
    if (line.empty()) continue;
    const std::vector<std::string_view> f = Split(line, '\t');
    if (f[0] == "version" && f.size() == 3) {
      decoded.versions.push_back(std::string(f[1]));
      continue;
    }
    if (f[0] != "scalar" || f.size() != 5) {
      ADD_FAILURE() << "unexpected line: " << line;
      continue;
    }
    DecodedScalar s;
    EXPECT_TRUE(ParseInteger(f[1], &s.step)) << line;
    s.wall_time = std::strtod(std::string(f[2]).c_str(), nullptr);
    s.value = static_cast<float>(std::strtod(std::string(f[3]).c_str(), nullptr));
    s.tag = std::string(f[4]);
    decoded.scalars.push_back(s);
  }
  return decoded;
}

bool HavePythonProtobuf() { return std::system("/usr/bin/python3 -c 'import google.protobuf' >/dev/null 2>&1") == 0; }

#define SKIP_WITHOUT_PYTHON_PROTOBUF()                                    \
  if (!HavePythonProtobuf())                                              \
  GTEST_SKIP() << "python3-protobuf is not installed: cannot decode the " \
                  "event file independently (apt-get install python3-protobuf)"

TEST(EventFileWriter, FileIsReadByProtobuf) {
  SKIP_WITHOUT_PYTHON_PROTOBUF();
  const fs::path dir = TempDir("tfevents") / "run" / "tb";  // created by the writer
  auto writer = EventFileWriter::Create(dir);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const fs::path path = (*writer)->path();
  EXPECT_EQ(path.parent_path(), dir);
  std::array<char, 256> host{};
  ASSERT_EQ(::gethostname(host.data(), host.size() - 1), 0);
  EXPECT_TRUE(std::regex_match(path.filename().string(),
                               std::regex(StrCat("events\\.out\\.tfevents\\.[0-9]{10,}\\.", host.data()))))
      << path;

  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<DecodedScalar> written = {
      {0, 1700000000.25, 10.8125f, "train/loss"},
      {1, 1700000001.5, 3.14159274f, "train/loss"},
      {1, 1700000001.5, 3e-4f, "train/lr"},
      {999, 1700000002.0, -2.5e-30f, "train/größe ∑"},  // UTF-8 tags
      {int64_t{1} << 40, 1700000003.0, inf, "eval/loss"},
      {int64_t{1} << 40, 1700000003.0, nan, "eval/nan"},
      {-7, 1700000004.0, 65504.0f, "negative/step"},  // a 10-byte varint
  };
  for (const DecodedScalar& s : written) {
    ASSERT_TRUE((*writer)->AddScalar(s.tag, s.step, s.value, s.wall_time).ok());
  }
  // Several values in one event.
  ASSERT_TRUE((*writer)->AddScalars(5, {{"a", 1.0f}, {"b", 2.0f}}, 1700000005.0).ok());
  const double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE((*writer)->AddScalar("now", 6, 1.0f).ok());

  // Flushed per call by default: the file is complete before Close.
  DecodedFile decoded = Decode(path);
  ASSERT_EQ(decoded.versions, std::vector<std::string>{"brain.Event:2"});
  ASSERT_EQ(decoded.scalars.size(), written.size() + 3);
  for (size_t i = 0; i < written.size(); ++i) {
    SCOPED_TRACE(written[i].tag);
    EXPECT_EQ(decoded.scalars[i].tag, written[i].tag);
    EXPECT_EQ(decoded.scalars[i].step, written[i].step);
    EXPECT_EQ(decoded.scalars[i].wall_time, written[i].wall_time);
    if (std::isnan(written[i].value)) {
      EXPECT_TRUE(std::isnan(decoded.scalars[i].value));
    } else {
      EXPECT_EQ(decoded.scalars[i].value, written[i].value);
    }
  }
  EXPECT_EQ(decoded.scalars[7].tag, "a");
  EXPECT_EQ(decoded.scalars[8].tag, "b");
  EXPECT_EQ(decoded.scalars[8].value, 2.0f);
  EXPECT_EQ(decoded.scalars[8].step, 5);
  EXPECT_GE(decoded.scalars[9].wall_time, before - 1);
  EXPECT_LE(decoded.scalars[9].wall_time, before + 60);

  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->AddScalar("late", 1, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
  fs::remove_all(dir.parent_path().parent_path());
}

TEST(EventFileWriter, BufferedUntilFlush) {
  SKIP_WITHOUT_PYTHON_PROTOBUF();
  const fs::path dir = TempDir("tfevents_buffered");
  auto writer = EventFileWriter::Create(dir, {.flush_each_write = false});
  ASSERT_TRUE(writer.ok()) << writer.status();
  const uintmax_t size = fs::file_size((*writer)->path());
  EXPECT_GT(size, 0u);  // the version record is always written at once
  ASSERT_TRUE((*writer)->AddScalar("loss", 1, 2.0f).ok());
  EXPECT_EQ(fs::file_size((*writer)->path()), size);
  ASSERT_TRUE((*writer)->Flush().ok());
  EXPECT_GT(fs::file_size((*writer)->path()), size);
  EXPECT_EQ(Decode((*writer)->path()).scalars.size(), 1u);
  fs::remove_all(dir);
}

// A resume drops the earlier run's events past the iteration it resumes
// from (read back independently): the rest stay, a torn tail goes, a file
// with nothing to drop is left as it was, and a second pass changes nothing;
// a run from scratch removes the event files; files of that name that are
// not event files, and links, are never touched.
TEST(EventFileWriter, KeepEventsUpToDropsLaterStepsAndATornTail) {
  SKIP_WITHOUT_PYTHON_PROTOBUF();
  const fs::path dir = TempDir("tfevents_keep");
  fs::path first, second;
  {
    auto writer = EventFileWriter::Create(dir);
    ASSERT_TRUE(writer.ok()) << writer.status();
    first = (*writer)->path();
    for (int step = 1; step <= 10; ++step) {
      ASSERT_TRUE((*writer)->AddScalars(step, {{"loss", static_cast<float>(step)}, {"lr", 0.5f}}).ok());
    }
    ASSERT_TRUE((*writer)->Close().ok());
  }
  {
    auto writer = EventFileWriter::Create(dir);
    ASSERT_TRUE(writer.ok()) << writer.status();
    second = (*writer)->path();
    ASSERT_TRUE((*writer)->AddScalar("loss", 2, 2.0f).ok());
    ASSERT_TRUE((*writer)->Close().ok());
  }
  {
    std::ofstream torn(first, std::ios::binary | std::ios::app);
    torn << std::string("\x05\x00\x00", 3);
  }
  const auto untouched = fs::last_write_time(second);
  ASSERT_TRUE(KeepEventsUpTo(dir, 4).ok());
  const DecodedFile kept = Decode(first);
  EXPECT_EQ(kept.versions, std::vector<std::string>{"brain.Event:2"});
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const DecodedScalar& s : kept.scalars) steps.emplace_back(s.step, s.tag);
  EXPECT_EQ(steps,
            (std::vector<std::pair<int64_t, std::string>>{
                {1, "loss"}, {1, "lr"}, {2, "loss"}, {2, "lr"}, {3, "loss"}, {3, "lr"}, {4, "loss"}, {4, "lr"}}));
  EXPECT_EQ(fs::last_write_time(second), untouched);
  EXPECT_EQ(Decode(second).scalars.size(), 1u);
  const uintmax_t size = fs::file_size(first);
  ASSERT_TRUE(KeepEventsUpTo(dir, 4).ok());
  EXPECT_EQ(fs::file_size(first), size);
  // Not ours to cut: a file of that name that is no event file, and a link.
  const std::string garbage(1000, '\x7f');
  std::ofstream(dir / "events.out.tfevents.garbage", std::ios::binary) << garbage;
  fs::create_symlink(first, dir / "events.out.tfevents.link");
  // A run from scratch: every event file goes, the others stay as they were.
  ASSERT_TRUE(KeepEventsUpTo(dir, -1).ok());
  EXPECT_FALSE(fs::exists(first));
  EXPECT_FALSE(fs::exists(second));
  EXPECT_EQ(fs::file_size(dir / "events.out.tfevents.garbage"), garbage.size());
  EXPECT_TRUE(fs::is_symlink(dir / "events.out.tfevents.link"));
  fs::remove_all(dir);
}

// A record damaged in the middle of a file (its framing whole, its data's
// CRC wrong) goes alone: the valid events after it stay (they were cut with
// it, as a torn tail, though they came before the checkpoint).
TEST(EventFileWriter, KeepEventsUpToDropsADamagedRecordAlone) {
  SKIP_WITHOUT_PYTHON_PROTOBUF();
  const fs::path dir = TempDir("tfevents_damaged");
  fs::path path;
  {
    auto writer = EventFileWriter::Create(dir);
    ASSERT_TRUE(writer.ok()) << writer.status();
    path = (*writer)->path();
    for (int step = 1; step <= 8; ++step) ASSERT_TRUE((*writer)->AddScalar("loss", step, step).ok());
    ASSERT_TRUE((*writer)->Close().ok());
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Records: the version, then steps 1, 2, ...: one byte of step 2's data.
  size_t at = 0;
  for (int record = 0; record < 2; ++record) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    at += 16 + length;
  }
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + at, 8);
  bytes[at + 12 + length / 2] ^= 0x5a;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  ASSERT_TRUE(KeepEventsUpTo(dir, 6).ok());
  std::vector<int64_t> steps;
  for (const DecodedScalar& s : Decode(path).scalars) steps.push_back(s.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 4, 5, 6}));
  fs::remove_all(dir);
}

TEST(EventFileWriter, NeverReusesAFile) {
  const fs::path dir = TempDir("tfevents_twice");
  // Created within the same second, so under the same base name.
  auto first = EventFileWriter::Create(dir);
  auto second = EventFileWriter::Create(dir);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE((*first)->path(), (*second)->path());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
  fs::remove_all(dir);
}

TEST(EventFileWriter, BadTagsAreRefused) {
  const fs::path dir = TempDir("tfevents_tags");
  auto writer = EventFileWriter::Create(dir);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->AddScalar("", 1, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->AddScalar("bad\xff", 1, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->AddScalars(1, {}).code(), absl::StatusCode::kInvalidArgument);
  // A refused call leaves the writer usable.
  EXPECT_TRUE((*writer)->AddScalar("ok", 1, 1.0f).ok());
  fs::remove_all(dir);
}

TEST(EventFileWriter, UnwritableDirectoryIsNamed) {
  const fs::path dir = TempDir("tfevents_file");
  const fs::path not_a_dir = dir / "file";
  std::ofstream(not_a_dir) << "x";
  auto writer = EventFileWriter::Create(not_a_dir / "tb");
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.status().message().find(not_a_dir.string()), std::string::npos) << writer.status();
  fs::remove_all(dir);
}

// Sets RLIMIT_FSIZE for its lifetime, so writes past `bytes` fail (EFBIG)
// the way a full disk would; SIGXFSZ, which would kill the process, is
// ignored meanwhile.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    saved_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, saved_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t saved_handler_;
};

TEST(EventFileWriter, FailedWriteNamesTheFileAndSticks) {
  const fs::path dir = TempDir("tfevents_full");
  auto writer = EventFileWriter::Create(dir);
  ASSERT_TRUE(writer.ok());
  absl::Status failed, again;
  {
    const FileSizeLimit limit(4096);
    failed = (*writer)->AddScalar(std::string(10000, 't'), 1, 1.0f);
    again = (*writer)->AddScalar("small", 2, 1.0f);
  }
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find((*writer)->path().string()), std::string::npos) << failed;
  // The limit is gone, yet nothing more is appended after a cut record.
  EXPECT_EQ(again, failed);
  EXPECT_EQ((*writer)->AddScalar("small", 3, 1.0f), failed);
  EXPECT_EQ((*writer)->Close(), failed);
  fs::remove_all(dir);
}

// ============================================================ Loss plot

struct PlotMapping {
  double x_min, x_max, y_min, y_max, left, right, top, bottom;
  bool log;
  double X(double iteration) const { return left + (iteration - x_min) / (x_max - x_min) * (right - left); }
  double Y(double loss) const {
    const auto t = [this](double v) { return log ? std::log10(v) : v; };
    return bottom - (t(loss) - t(y_min)) / (t(y_max) - t(y_min)) * (bottom - top);
  }
};

json ReadSvg(const fs::path& file) {
  const ScriptResult r = RunScript("read_svg.py", file);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  if (r.exit_code != 0) return json::object();
  return json::parse(r.out);
}

PlotMapping Mapping(const json& svg) {
  const json& g = svg.at("plot");
  const auto number = [&](const char* key) { return std::stod(g.at(key).get<std::string>()); };
  return {number("data-x-min"), number("data-x-max"),  number("data-y-min"),
          number("data-y-max"), number("data-left"),   number("data-right"),
          number("data-top"),   number("data-bottom"), g.at("data-y-scale") == "log"};
}

const json* Polyline(const json& svg, const std::string& series) {
  for (const json& p : svg.at("polylines")) {
    if (p.at("series") == series) return &p;
  }
  return nullptr;
}

// Every point of `polyline` is the pixel of the corresponding data point.
void ExpectPointsAre(const json& polyline, const std::vector<LossPoint>& data, const PlotMapping& m) {
  const json& points = polyline.at("points");
  ASSERT_EQ(points.size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_NEAR(points[i][0].get<double>(), m.X(static_cast<double>(data[i].iteration)), 0.006) << i;
    EXPECT_NEAR(points[i][1].get<double>(), m.Y(data[i].loss), 0.006) << i;
  }
}

TEST(LossPlot, CurvesMatchTheData) {
  const fs::path dir = TempDir("plot");
  std::vector<LossPoint> train, eval;
  for (int i = 1; i <= 200; ++i) train.push_back({i, 10.0 * std::exp(-i / 50.0) + 2.0});
  for (int i = 20; i <= 200; i += 20) eval.push_back({i, 10.0 * std::exp(-i / 50.0) + 2.3});
  const fs::path path = dir / "loss.svg";
  ASSERT_TRUE(WriteLossPlot(path, train, eval, {.title = "gpt2 <nano> & co"}).ok());
  const json svg = ReadSvg(path);
  ASSERT_FALSE(svg.empty());
  EXPECT_EQ(svg.at("root"), "{http://www.w3.org/2000/svg}svg");
  EXPECT_EQ(svg.at("scripts"), 0);
  const PlotMapping m = Mapping(svg);
  EXPECT_FALSE(m.log);  // 12 down to 2.2: less than a decade
  EXPECT_EQ(m.x_min, 1);
  EXPECT_EQ(m.x_max, 200);
  const json* train_line = Polyline(svg, "train");
  const json* eval_line = Polyline(svg, "eval");
  ASSERT_TRUE(train_line != nullptr && eval_line != nullptr);
  ExpectPointsAre(*train_line, train, m);
  ExpectPointsAre(*eval_line, eval, m);
  // Title, legend, axis titles and tick labels.
  const std::vector<std::string> texts = svg.at("texts").get<std::vector<std::string>>();
  for (const std::string wanted : {"gpt2 <nano> & co", "train", "eval", "iteration", "loss", "100", "200"}) {
    EXPECT_NE(std::find(texts.begin(), texts.end(), wanted), texts.end()) << wanted;
  }
  // Only the file: the temporary was renamed.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

TEST(LossPlot, UnsortedInputIsDrawnInIterationOrder) {
  const fs::path dir = TempDir("plot_unsorted");
  const std::vector<LossPoint> train = {{3, 2.0}, {1, 4.0}, {2, 3.0}};
  ASSERT_TRUE(WriteLossPlot(dir / "loss.svg", train, {}).ok());
  const json svg = ReadSvg(dir / "loss.svg");
  ASSERT_FALSE(svg.empty());
  ExpectPointsAre(*Polyline(svg, "train"), {{1, 4.0}, {2, 3.0}, {3, 2.0}}, Mapping(svg));
  fs::remove_all(dir);
}

TEST(LossPlot, LogScaleOverDecades) {
  const fs::path dir = TempDir("plot_log");
  std::vector<LossPoint> train;
  for (int i = 0; i < 100; ++i) train.push_back({i, 2.3 * std::pow(0.95, i)});  // 2.3 down to 0.014
  ASSERT_TRUE(WriteLossPlot(dir / "loss.svg", train, {}).ok());
  const json svg = ReadSvg(dir / "loss.svg");
  ASSERT_FALSE(svg.empty());
  const PlotMapping m = Mapping(svg);
  EXPECT_TRUE(m.log);
  EXPECT_LT(m.y_min, train.back().loss);
  EXPECT_GT(m.y_max, train.front().loss);
  ExpectPointsAre(*Polyline(svg, "train"), train, m);
  const std::vector<std::string> texts = svg.at("texts").get<std::vector<std::string>>();
  for (const std::string wanted : {"0.1", "1", "loss (log scale)"}) {
    EXPECT_NE(std::find(texts.begin(), texts.end(), wanted), texts.end()) << wanted;
  }
  fs::remove_all(dir);
}

TEST(LossPlot, NonFiniteLossesAreSkipped) {
  const fs::path dir = TempDir("plot_nan");
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<LossPoint> train = {{1, 5.0}, {2, nan}, {3, 4.0}, {4, inf}, {5, -inf}, {6, 3.5}};
  ASSERT_TRUE(WriteLossPlot(dir / "loss.svg", train, {{2, nan}}).ok());
  const json svg = ReadSvg(dir / "loss.svg");
  ASSERT_FALSE(svg.empty());
  const PlotMapping m = Mapping(svg);
  ExpectPointsAre(*Polyline(svg, "train"), {{1, 5.0}, {3, 4.0}, {6, 3.5}}, m);
  EXPECT_EQ(Polyline(svg, "eval"), nullptr);  // no finite point: no curve
  EXPECT_TRUE(std::isfinite(m.y_min) && std::isfinite(m.y_max));
  fs::remove_all(dir);
}

TEST(LossPlot, OnePointOrNone) {
  const fs::path dir = TempDir("plot_small");
  ASSERT_TRUE(WriteLossPlot(dir / "one.svg", {{7, 2.5}}, {}).ok());
  const json one = ReadSvg(dir / "one.svg");
  ASSERT_FALSE(one.empty());
  const PlotMapping m = Mapping(one);
  EXPECT_LT(m.x_min, 7);
  EXPECT_GT(m.x_max, 7);
  EXPECT_LT(m.y_min, 2.5);
  EXPECT_GT(m.y_max, 2.5);
  ExpectPointsAre(*Polyline(one, "train"), {{7, 2.5}}, m);
  EXPECT_EQ(one.at("circles"), 1);  // a one-point line draws nothing by itself

  ASSERT_TRUE(WriteLossPlot(dir / "none.svg", {}, {}).ok());
  const json none = ReadSvg(dir / "none.svg");
  ASSERT_FALSE(none.empty());
  EXPECT_TRUE(none.at("polylines").empty());
  EXPECT_TRUE(none.at("plot").is_null());
  fs::remove_all(dir);
}

// Extremes a worker could report end (the tick loops never did past 2^53
// iterations or with a log axis from the smallest double): a plot, and
// no hang.
TEST(LossPlot, ExtremeIterationsAndLossesEnd) {
  const int64_t past = (int64_t{1} << 53) + 1;
  EXPECT_FALSE(LossPlotSvg({{past, 1.0}, {past + 1, 2.0}}, {}).empty());
  EXPECT_FALSE(LossPlotSvg({{INT64_MAX - 1, 1.0}, {INT64_MAX, 2.0}}, {}).empty());
  EXPECT_FALSE(LossPlotSvg({{1, 5e-324}, {2, 1e300}}, {}).empty());
  EXPECT_FALSE(LossPlotSvg({{1, 5e-324}, {2, 1e-323}}, {}).empty());
}

TEST(LossPlot, ManyPointsAreDownSampledKeepingTheEnvelope) {
  const fs::path dir = TempDir("plot_many");
  std::vector<LossPoint> train;
  for (int i = 0; i < 100000; ++i) {
    // A decaying loss with deterministic noise and one spike.
    const double noise = 0.05 * std::sin(i * 12.9898);
    train.push_back({i, i == 61234 ? 9.0 : 5.0 * std::exp(-i / 30000.0) + 1.0 + noise});
  }
  constexpr size_t kMax = 500;
  ASSERT_TRUE(WriteLossPlot(dir / "loss.svg", train, {}, {.max_points_per_series = kMax}).ok());
  EXPECT_LT(fs::file_size(dir / "loss.svg"), 64u << 10);
  const json svg = ReadSvg(dir / "loss.svg");
  ASSERT_FALSE(svg.empty());
  const PlotMapping m = Mapping(svg);
  const json& points = Polyline(svg, "train")->at("points");
  EXPECT_LE(points.size(), kMax);
  EXPECT_GE(points.size(), kMax - 2);
  // Each drawn point is a data point (its iteration read back from x), in
  // iteration order; the ends and the spike are kept.
  double last_x = -1;
  bool spike = false;
  for (const json& p : points) {
    const double x = p[0].get<double>(), y = p[1].get<double>();
    EXPECT_GE(x, last_x);
    last_x = x;
    const double iteration = m.x_min + (x - m.left) / (m.right - m.left) * (m.x_max - m.x_min);
    // 0.005 px of rounding is ~0.7 iterations at this width: the data point
    // is one of the two nearest, and its y must match.
    const auto lo = static_cast<size_t>(std::clamp(std::floor(iteration), 0.0, 99999.0));
    const size_t hi = std::min<size_t>(lo + 1, 99999);
    EXPECT_TRUE(std::abs(m.Y(train[lo].loss) - y) < 0.006 || std::abs(m.Y(train[hi].loss) - y) < 0.006)
        << "x " << x << " y " << y;
    spike = spike || std::abs(y - m.Y(9.0)) < 0.006;
  }
  EXPECT_TRUE(spike);
  EXPECT_NEAR(points.front()[0].get<double>(), m.X(0), 0.006);
  EXPECT_NEAR(points.back()[0].get<double>(), m.X(99999), 0.006);
  fs::remove_all(dir);
}

TEST(LossPlot, ReplacesAtomicallyAndNamesTheFileOnError) {
  const fs::path dir = TempDir("plot_replace");
  const fs::path path = dir / "loss.svg";
  std::ofstream(path) << "old";
  ASSERT_TRUE(WriteLossPlot(path, {{1, 2.0}, {2, 1.0}}, {}).ok());
  EXPECT_FALSE(ReadSvg(path).empty());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  const fs::path missing = dir / "no_such_dir" / "loss.svg";
  const absl::Status status = WriteLossPlot(missing, {{1, 2.0}}, {});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(missing.string()), std::string::npos) << status;
  EXPECT_FALSE(fs::exists(dir / "no_such_dir"));
  fs::remove_all(dir);
}

// ============================================================ Progress

IterationStats Stats(int64_t iteration, int64_t total) {
  return {.iteration = iteration,
          .total = total,
          .loss = 5.123456,
          .lr = 0.0003,
          .grad_norm = 0.87,
          .tokens_per_s = 1234,
          .samples_per_s = std::nullopt};
}

TEST(Progress, Hms) {
  EXPECT_EQ(FormatHms(0), "0:00:00");
  EXPECT_EQ(FormatHms(62), "0:01:02");
  EXPECT_EQ(FormatHms(62.9), "0:01:02");
  EXPECT_EQ(FormatHms(27 * 3600 + 46 * 60 + 40), "27:46:40");
  EXPECT_EQ(FormatHms(-1), "-:--:--");
  EXPECT_EQ(FormatHms(std::numeric_limits<double>::quiet_NaN()), "-:--:--");
  EXPECT_EQ(FormatHms(std::numeric_limits<double>::infinity()), "-:--:--");
}

TEST(Progress, LogLineIsParseable) {
  const std::string line = FormatProgressLogLine(Stats(3, 10), {.elapsed_s = 5, .eta_s = 62});
  EXPECT_EQ(line, "iter 3/10  loss 5.123456  lr 0.0003  grad_norm 0.87  tokens/s 1234  eta 0:01:02  elapsed 0:00:05");
  // "key value" fields, double-space separated, each value without spaces.
  std::vector<std::string> keys;
  size_t start = 0;
  while (start < line.size()) {
    const size_t end = std::min(line.find("  ", start), line.size());
    const std::vector<std::string_view> kv = Split(std::string_view(line).substr(start, end - start), ' ');
    ASSERT_EQ(kv.size(), 2u) << line.substr(start, end - start);
    keys.emplace_back(kv[0]);
    start = end + 2;
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"iter", "loss", "lr", "grad_norm", "tokens/s", "eta", "elapsed"}));

  IterationStats bare = Stats(1, 10);
  bare.grad_norm.reset();
  bare.tokens_per_s.reset();
  bare.samples_per_s = 160;
  EXPECT_EQ(FormatProgressLogLine(bare, {.elapsed_s = 0}),
            "iter 1/10  loss 5.123456  lr 0.0003  samples/s 160  eta -:--:--  elapsed 0:00:00");
}

TEST(Progress, Bar) {
  const ProgressTiming timing{.elapsed_s = 51, .eta_s = 62};
  EXPECT_EQ(FormatProgressBar(Stats(45, 100), timing, 0, 20),
            "[=========>          ]  45%  45/100  loss 5.1235  lr 0.0003  grad_norm 0.87  tokens/s 1234  eta 0:01:02  "
            "elapsed 0:00:51");
  EXPECT_EQ(FormatProgressBar(Stats(0, 100), timing, 0, 4).substr(0, 12), "[>   ]   0% ");
  EXPECT_EQ(FormatProgressBar(Stats(100, 100), timing, 0, 4).substr(0, 12), "[====] 100% ");
  // Cut short of the last column.
  EXPECT_EQ(FormatProgressBar(Stats(45, 100), timing, 40, 20).size(), 39u);
}

TEST(Progress, EvalLine) {
  EXPECT_EQ(FormatEvalLine(450, 1000, {{"loss", 3.3}, {"accuracy", 0.412}}),
            "eval iter 450/1000  loss 3.300000  accuracy 0.412000");
  // --eval-only: saved weights evaluated, no training iterations to count.
  EXPECT_EQ(FormatEvalLine(450, 0, {{"loss", 3.3}}), "eval (weights of iteration 450)  loss 3.300000");
  // Hugging Face weights (train.load_weight) are of no iteration.
  EXPECT_EQ(FormatEvalLine(0, 0, {{"loss", 3.3}}), "eval (the weights of train.load_weight)  loss 3.300000");
}

TEST(Progress, EtaIsSmoothedAndIndependentOfUpdateGranularity) {
  EtaEstimator none(100, 0);
  EXPECT_FALSE(none.SecondsPerIteration());
  EXPECT_FALSE(none.RemainingSeconds());

  // A steady 2 s per iteration gives exactly that from the first update on
  // (the bias correction), whatever the smoothing.
  EtaEstimator steady(100, 10);
  steady.Update(1, 12);
  EXPECT_NEAR(*steady.SecondsPerIteration(), 2, 1e-12);
  EXPECT_NEAR(*steady.RemainingSeconds(), 198, 1e-9);

  // 10 iterations at 1 s, then 10 at 3 s: updated every iteration or every
  // 5, the estimate is the same, and between the two rates.
  EtaEstimator fine(100, 0), coarse(100, 0);
  double t = 0;
  for (int i = 1; i <= 20; ++i) {
    t += i <= 10 ? 1 : 3;
    fine.Update(i, t);
    if (i % 5 == 0) coarse.Update(i, t);
  }
  EXPECT_NEAR(*fine.SecondsPerIteration(), *coarse.SecondsPerIteration(), 1e-9);
  const double expected = [] {  // the bias-corrected EMA written out
    double average = 0, weight = 0;
    for (int i = 1; i <= 20; ++i) {
      average = 0.98 * average + 0.02 * (i <= 10 ? 1 : 3);
      weight = 0.98 * weight + 0.02;
    }
    return average / weight;
  }();
  EXPECT_NEAR(*fine.SecondsPerIteration(), expected, 1e-9);
  EXPECT_GT(expected, 2);
  EXPECT_LT(expected, 3);
  EXPECT_NEAR(*fine.RemainingSeconds(), 80 * expected, 1e-6);

  // A resumed run: only the iterations trained since the start count.
  EtaEstimator resumed(110, 50, /*start_iteration=*/100);
  resumed.Update(101, 52);
  EXPECT_NEAR(*resumed.SecondsPerIteration(), 2, 1e-12);
  EXPECT_NEAR(*resumed.RemainingSeconds(), 18, 1e-9);

  // No new iteration or no time: nothing changes.
  fine.Update(20, t + 5);
  fine.Update(21, t);
  EXPECT_NEAR(*fine.SecondsPerIteration(), expected, 1e-9);
}

// What a display wrote to a memory stream.
class Captured {
 public:
  Captured() : file_(::open_memstream(&data_, &size_)) {}
  ~Captured() {
    std::fclose(file_);
    std::free(data_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

TEST(Progress, PlainModeLogsOneLinePerLoggedIteration) {
  Captured out;
  double now = 100;
  ProgressDisplay display(out.file(), /*is_tty=*/false,
                          {.total_iterations = 5, .log_period = 2, .clock = [&] { return now; }});
  for (int i = 1; i <= 5; ++i) {
    now += 2;
    display.Update(Stats(i, 5));
    if (i == 4) display.Eval(4, {{"loss", 4.5}});
  }
  display.Finish();
  EXPECT_EQ(out.text(),
            "iter 2/5  loss 5.123456  lr 0.0003  grad_norm 0.87  tokens/s 1234  eta 0:00:06  elapsed 0:00:04\n"
            "iter 4/5  loss 5.123456  lr 0.0003  grad_norm 0.87  tokens/s 1234  eta 0:00:02  elapsed 0:00:08\n"
            "eval iter 4/5  loss 4.500000\n"
            "iter 5/5  loss 5.123456  lr 0.0003  grad_norm 0.87  tokens/s 1234  eta 0:00:00  elapsed 0:00:10\n");
}

TEST(Progress, TerminalModeRedrawsInPlace) {
  Captured out;
  double now = 0;
  ProgressDisplay display(out.file(), /*is_tty=*/true,
                          {.total_iterations = 4, .columns = 200, .clock = [&] { return now; }});
  now = 1;
  display.Update(Stats(1, 4));  // drawn: the first
  display.Update(Stats(2, 4));  // not drawn: same instant
  display.Eval(2, {{"loss", 4.5}});
  now = 2;
  display.Update(Stats(3, 4));
  display.Update(Stats(4, 4));  // drawn: the last, however soon
  display.Finish();
  display.Finish();
  const std::string text = out.text();
  const auto bar = [](int i) { return StrCat("\r", FormatProgressBar(Stats(i, 4), {}, 200).substr(0, 32)); };
  const auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(bar(1)), 1) << text;
  EXPECT_EQ(count(bar(2)), 1) << text;  // only the redraw after the eval line
  // The eval line replaces the bar's line, then the bar (iteration 2) is
  // drawn again below it.
  const size_t eval = text.find("\r\x1b[Keval iter 2/4  loss 4.500000\n");
  ASSERT_NE(eval, std::string::npos) << text;
  EXPECT_EQ(text.find(bar(2)), eval + std::string("\r\x1b[Keval iter 2/4  loss 4.500000\n").size());
  EXPECT_NE(text.find(bar(3)), std::string::npos);
  EXPECT_NE(text.find(bar(4)), std::string::npos);
  // Every draw erases what a longer one left; one final newline.
  EXPECT_NE(text.find("\x1b[K"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
}

// ============================================================ LR schedules

json ResolveSchedule(const json& node) {
  auto resolved = config::Resolve(LrSchedulerSection(), node, {}, "lr_scheduler");
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *resolved : json();
}

LrSchedule Schedule(const json& node, double base, int64_t iters, double warmup_ratio) {
  auto s = MakeLrSchedule(ResolveSchedule(node), base, iters, warmup_ratio);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// LiBai's warmup of iteration i < W written out from its definition:
// `factor` × base, or for a linear one from there to `decayed_at_end` (the
// decay's value at W) in W steps.
double Warmup(int64_t i, int64_t warmup, double factor, bool linear, double base, double decayed_at_end) {
  if (!linear) return base * factor;
  return base * (factor + (decayed_at_end / base - factor) * static_cast<double>(i) / static_cast<double>(warmup));
}

// LiBai's schedules value for value: OneFlow's WarmUpLR (warmup_prefix
// false) around its decay schedules, the decay counted from iteration 0 and
// the linear warmup ramping to the decay's value at its end, over
// ceil(warmup_ratio × train_iter) iterations. The expected values come from
// a Python transcription of OneFlow's LinearLR / ConstantLR /
// CosineDecayLR / PolynomialLR / MultiStepLR under WarmUpLR; the second
// row is WarmUpLR's docstring example (0.000689 at 2, 0.000410 at 3).
TEST(LrSchedule, FollowsLiBaisCurves) {
  struct Case {
    json node;
    double base;
    int64_t train_iter;
    double warmup_ratio;
    std::vector<std::pair<int64_t, double>> expected;
  };
  const auto linear = [](json node) {
    node["warmup_method"] = "linear";
    return node;
  };
  const std::vector<Case> cases = {
      {linear({{"_target_", "WarmupCosineLR"}, {"warmup_factor", 0.001}, {"alpha", 0.01}}),
       1.0,
       110,
       10.0 / 110,
       {{0, 0.001},
        {5, 0.4904745109695881},
        {9, 0.8820541197452586},
        {10, 0.9799490219391762},
        {60, 0.4345541550547239},
        {109, 0.010201864550046331},
        {110, 0.01},
        {200, 0.01}}},
      {linear({{"_target_", "WarmupCosineLR"}, {"warmup_factor", 0.5}, {"alpha", 0.1}}),
       0.001,
       5,
       0.4,
       {{0, 0.0005},
        {1, 0.0005945288237343631},
        {2, 0.0006890576474687264},
        {3, 0.0004109423525312738},
        {4, 0.00018594235253127373},
        {5, 0.0001}}},
      {{{"_target_", "WarmupCosineLR"}, {"warmup_factor", 0.5}, {"alpha", 0.01}, {"warmup_method", "constant"}},
       0.003,
       20,
       0.12,  // ceil(2.4): 3 iterations of warmup
       {{0, 0.0015}, {2, 0.0015}, {3, 0.002838144688419726}, {9, 0.001747305180584743}}},
      {linear({{"_target_", "WarmupCosineLR"}, {"warmup_factor", 0.001}, {"alpha", 0.01}}),
       0.003,
       3,
       0.05,
       {{0, 3e-06}, {1, 0.0022575}, {2, 0.0007725000000000004}}},  // ceil(0.15): one iteration
      {linear(
           {{"_target_", "WarmupPolynomialLR"}, {"warmup_factor", 0.001}, {"end_learning_rate", 1e-4}, {"power", 2.0}}),
       0.003,
       20,
       0.2,
       {{0, 3e-06},
        {1, 0.00049125},
        {3, 0.00146775},
        {4, 0.0019560000000000003},
        {10, 0.0008250000000000001},
        {19, 0.00010725000000000002},
        {20, 0.0001},
        {30, 0.0001}}},
      {linear({{"_target_", "WarmupMultiStepLR"}, {"warmup_factor", 0.001}, {"milestones", {2, 10}}, {"gamma", 0.5}}),
       0.001,
       20,
       0.2,
       {{0, 1e-06},
        {1, 0.00012575},
        {2, 0.0002505},
        {3, 0.00037525},
        {4, 0.0005},
        {9, 0.0005},
        {10, 0.00025},
        {19, 0.00025}}},
      {linear({{"_target_", "WarmupLinearLR"}, {"warmup_factor", 0.1}, {"alpha", 0.0}}),
       1.0,
       10,
       0.3,
       {{0, 0.1}, {1, 0.3}, {2, 0.5}, {3, 0.7}, {9, 0.09999999999999998}, {10, 0.0}, {11, 0.0}}},
      {linear({{"_target_", "WarmupLinearLR"}, {"warmup_factor", 0.0}, {"alpha", 0.5}}),
       1.0,
       100,
       0.07,
       {{0, 0.0}, {7, 0.84}, {8, 0.96}, {50, 0.75}}},  // 0.07 × 100 = 7.000000000000001: 8 iterations
      {{{"_target_", "ConstantLR"}}, 0.5, 10, 0.5, {{0, 0.5}, {9, 0.5}, {20, 0.5}}},
  };
  for (const Case& c : cases) {
    auto made = MakeLrSchedule(c.node, c.base, c.train_iter, c.warmup_ratio);
    ASSERT_TRUE(made.ok()) << made.status();
    for (const auto& [iteration, lr] : c.expected) {
      EXPECT_NEAR(made->At(iteration), lr, 1e-15 * std::max(1.0, std::abs(lr)))
          << c.node.dump() << " train_iter " << c.train_iter << " iteration " << iteration;
    }
  }
}

TEST(LrSchedule, SectionMatchesTheJobSchema) {
  const config::Section section = LrSchedulerSection();
  EXPECT_EQ(section.default_target(), "WarmupCosineLR");
  EXPECT_EQ(section.TargetNames(), (std::vector<std::string>{"WarmupCosineLR", "WarmupLinearLR", "WarmupMultiStepLR",
                                                             "WarmupPolynomialLR", "ConstantLR"}));
  // Configs saved with the job schema's lr_scheduler resolve the same.
  const config::Section* job = JobSchema().FindSub("lr_scheduler");
  ASSERT_NE(job, nullptr);
  for (const json& node : {json::object(), json{{"_target_", "ConstantLR"}},
                           json{{"_target_", "WarmupCosineLR"}, {"alpha", 0.5}, {"warmup_method", "constant"}}}) {
    auto old_resolved = config::Resolve(*job, node);
    ASSERT_TRUE(old_resolved.ok());
    EXPECT_EQ(ResolveSchedule(node), *old_resolved) << node;
  }
}

TEST(LrSchedule, CosineAtKeyIterations) {
  const double base = 0.1;
  const LrSchedule s =
      Schedule({{"_target_", "WarmupCosineLR"}, {"warmup_factor", 0.01}, {"alpha", 0.1}}, base, 1000, 0.1);
  EXPECT_EQ(s.warmup_iters(), 100);
  // The decay runs from iteration 0, the warmup's iterations included.
  const auto decayed = [&](int64_t i) {
    return base * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi * std::min(1.0, i / 1000.0))) / 2);
  };
  EXPECT_DOUBLE_EQ(s.At(0), base * 0.01);
  EXPECT_DOUBLE_EQ(s.At(50), base * 0.01 + (decayed(100) - base * 0.01) * 0.5);
  EXPECT_DOUBLE_EQ(s.At(100), decayed(100));
  EXPECT_LT(s.At(100), base);                             // a warmed-up schedule never reaches the peak
  EXPECT_DOUBLE_EQ(s.At(500), base * (0.1 + 0.9 * 0.5));  // half way: cos = 0
  EXPECT_NEAR(s.At(999), base * 0.1, 1e-6);
  EXPECT_DOUBLE_EQ(s.At(1000), base * 0.1);
  EXPECT_DOUBLE_EQ(s.At(5000), base * 0.1);
  for (int64_t i = 0; i <= 1100; ++i) {
    const double expected = i < 100 ? Warmup(i, 100, 0.01, true, base, decayed(100)) : decayed(i);
    ASSERT_NEAR(s.At(i), expected, 1e-15) << i;
  }
}

TEST(LrSchedule, LinearDecay) {
  const double base = 2e-3;
  const LrSchedule s =
      Schedule({{"_target_", "WarmupLinearLR"}, {"alpha", 0.2}, {"warmup_method", "constant"}}, base, 200, 0.25);
  EXPECT_EQ(s.warmup_iters(), 50);
  EXPECT_DOUBLE_EQ(s.At(0), base * 0.001);
  EXPECT_DOUBLE_EQ(s.At(49), base * 0.001);
  EXPECT_DOUBLE_EQ(s.At(50), base * 0.8);
  EXPECT_DOUBLE_EQ(s.At(100), base * 0.6);
  EXPECT_DOUBLE_EQ(s.At(200), base * 0.2);
  EXPECT_DOUBLE_EQ(s.At(1000), base * 0.2);
  for (int64_t i = 50; i <= 200; ++i) {
    ASSERT_NEAR(s.At(i), base * (0.2 + 0.8 * (1 - i / 200.0)), 1e-17) << i;
  }
  // The default alpha decays to zero; linear warmup by default.
  const LrSchedule to_zero = Schedule({{"_target_", "WarmupLinearLR"}}, 1.0, 10, 0.2);
  EXPECT_DOUBLE_EQ(to_zero.At(1), Warmup(1, 2, 0.001, true, 1.0, 0.8));
  EXPECT_DOUBLE_EQ(to_zero.At(2), 0.8);
  EXPECT_DOUBLE_EQ(to_zero.At(6), 0.4);
  EXPECT_EQ(to_zero.At(10), 0.0);
}

TEST(LrSchedule, MultiStep) {
  const double base = 0.5;
  const LrSchedule s =
      Schedule({{"_target_", "WarmupMultiStepLR"}, {"milestones", {3, 6, 10}}, {"gamma", 0.5}}, base, 11, 0.0);
  EXPECT_EQ(s.warmup_iters(), 0);
  const std::vector<double> expected = {0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.0625, 0.0625};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(s.At(static_cast<int64_t>(i)), expected[i]) << i;

  // A milestone inside the warmup: the warmup ramps to the step's value at
  // its end (base × gamma^k(W)), as OneFlow's WarmUpLR does.
  const LrSchedule warm =
      Schedule({{"_target_", "WarmupMultiStepLR"}, {"milestones", {2, 8}}, {"gamma", 0.1}, {"warmup_factor", 0.2}},
               base, 10, 0.4);
  EXPECT_EQ(warm.warmup_iters(), 4);
  for (int64_t i = 0; i < 12; ++i) {
    const int passed = (i >= 2) + (i >= 8);
    const double expected = i < 4 ? Warmup(i, 4, 0.2, true, base, base * 0.1) : base * std::pow(0.1, passed);
    EXPECT_NEAR(warm.At(i), expected, 1e-15) << i;
  }
  // No milestones (the default): base after the warmup.
  const LrSchedule flat = Schedule({{"_target_", "WarmupMultiStepLR"}}, base, 10, 0.0);
  EXPECT_EQ(flat.At(0), base);
  EXPECT_EQ(flat.At(9), base);
}

// LiBai's WarmupPolynomialLR: (lr - end) (1 - p)^power + end, p = i / T
// from iteration 0, the warmup ramping to its value at W; the defaults are
// LiBai's (end 1e-4, power 1: linear to end). An end above lr is a one-line
// error.
TEST(LrSchedule, PolynomialDecay) {
  const double base = 0.01, end = 0.001;
  const LrSchedule s =
      Schedule({{"_target_", "WarmupPolynomialLR"}, {"end_learning_rate", end}, {"power", 2.0}, {"warmup_factor", 0.1}},
               base, 100, 0.2);
  EXPECT_EQ(s.kind(), LrSchedule::Kind::kWarmupPolynomial);
  EXPECT_EQ(s.warmup_iters(), 20);
  const auto decayed = [&](int64_t i) {
    const double p = std::min(1.0, i / 100.0);
    return end + (base - end) * (1 - p) * (1 - p);
  };
  for (int64_t i = 0; i <= 150; ++i) {
    const double expected = i < 20 ? Warmup(i, 20, 0.1, true, base, decayed(20)) : decayed(i);
    ASSERT_NEAR(s.At(i), expected, 1e-15) << i;
  }
  EXPECT_DOUBLE_EQ(s.At(20), end + (base - end) * 0.64);
  EXPECT_DOUBLE_EQ(s.At(60), end + (base - end) * 0.16);
  EXPECT_DOUBLE_EQ(s.At(100), end);
  EXPECT_DOUBLE_EQ(s.At(1000), end);
  const LrSchedule linear = Schedule({{"_target_", "WarmupPolynomialLR"}}, 1e-3, 11, 0.0);
  EXPECT_DOUBLE_EQ(linear.At(0), 1e-3);
  EXPECT_NEAR(linear.At(1), 1e-4 + 9e-4 * 10 / 11.0, 1e-18);
  EXPECT_DOUBLE_EQ(linear.At(11), 1e-4);
  const absl::Status above =
      MakeLrSchedule(ResolveSchedule({{"_target_", "WarmupPolynomialLR"}, {"end_learning_rate", 0.5}}), 0.1, 10, 0.0)
          .status();
  EXPECT_EQ(above.message(), "lr_scheduler.end_learning_rate 0.5 is above the learning rate 0.1 it decays from");
}

TEST(LrSchedule, ConstantIgnoresWarmup) {
  const LrSchedule s = Schedule({{"_target_", "ConstantLR"}}, 0.01, 100, 0.5);
  EXPECT_EQ(s.kind(), LrSchedule::Kind::kConstant);
  EXPECT_EQ(s.warmup_iters(), 0);
  for (const int64_t i : {0, 1, 49, 50, 99, 100, 1000}) EXPECT_EQ(s.At(i), 0.01) << i;
}

TEST(LrSchedule, DefaultIsLibaisWarmupCosine) {
  const LrSchedule s = Schedule(json::object(), 1.0, 100, 0.1);
  EXPECT_EQ(s.kind(), LrSchedule::Kind::kWarmupCosine);
  EXPECT_DOUBLE_EQ(s.At(0), 0.001);
  EXPECT_DOUBLE_EQ(s.At(100), 0.01);
}

// One line, naming `key`.
void ExpectError(const absl::Status& status, const std::string& key) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(key), std::string::npos) << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status;
}

TEST(LrSchedule, BadMilestonesAreNamed) {
  const auto make = [](const json& milestones, int64_t iters) {
    return MakeLrSchedule(ResolveSchedule({{"_target_", "WarmupMultiStepLR"}, {"milestones", milestones}}), 1.0, iters,
                          0.0)
        .status();
  };
  ExpectError(make({5, 3}, 100), "lr_scheduler.milestones");
  ExpectError(make({5, 5}, 100), "lr_scheduler.milestones");
  ExpectError(make({5, 101}, 100), "lr_scheduler.milestones[1] = 101 is never reached");
  ExpectError(
      make({5, 100}, 100),
      "lr_scheduler.milestones[1] = 100 is never reached: the run's iterations are 0 to train.train_iter - 1 = 99");
  EXPECT_TRUE(make({5, 99}, 100).ok());
}

TEST(LrSchedule, SchemaRefusesBadKeys) {
  const config::Section section = LrSchedulerSection();
  const auto resolve = [&](const json& node) { return config::Resolve(section, node, {}, "lr_scheduler").status(); };
  EXPECT_NE(resolve({{"_target_", "WarmupMultiStepLR"}, {"gamma", 0}}).message().find("gamma"), std::string::npos);
  EXPECT_NE(resolve({{"_target_", "WarmupMultiStepLR"}, {"milestones", {0}}}).message().find("milestones"),
            std::string::npos);
  EXPECT_NE(resolve({{"_target_", "WarmupCosineLR"}, {"warmup_method", "cosine"}}).message().find("warmup_method"),
            std::string::npos);
  EXPECT_NE(resolve({{"_target_", "WarmupLinearLR"}, {"alpha", 1.5}}).message().find("alpha"), std::string::npos);
  EXPECT_NE(resolve({{"_target_", "WarmupCosineLR"}, {"milestones", {1}}}).message().find("milestones"),
            std::string::npos);
  EXPECT_NE(resolve({{"_target_", "PolynomialLR"}}).message().find("PolynomialLR"), std::string::npos);
  EXPECT_FALSE(resolve({{"_target_", "ConstantLR"}, {"alpha", 0.1}}).ok());
}

TEST(LrSchedule, ArgumentsOutOfRange) {
  const json node = ResolveSchedule(json::object());
  EXPECT_EQ(MakeLrSchedule(node, 0, 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLrSchedule(node, std::nan(""), 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLrSchedule(node, 1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLrSchedule(node, 1, 10, 1.5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLrSchedule(json::object(), 1, 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLrSchedule({{"_target_", "Nope"}}, 1, 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // A resolved node of a known target with a key of the wrong type.
  json bad = ResolveSchedule({{"_target_", "WarmupCosineLR"}});
  bad["alpha"] = "x";
  EXPECT_FALSE(MakeLrSchedule(bad, 1, 10, 0).ok());
}

}  // namespace
}  // namespace tessera
