// Checkpoints (train/checkpoint.h, train/safetensors.h): the file format
// against corrupt input, resharding between layouts, the atomic commit, and
// end to end through `tessera train`: a resume continues bit-exactly, a
// checkpoint saved under one layout continues under another, and kill -9 in
// the middle of a write leaves the previous checkpoint loadable.

#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/checksum.h"
#include "core/file_util.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "train/safetensors.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::RunTessera;
using ::tessera::testing::SourcePath;

fs::path TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_checkpoint_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

Tensor Iota(const Shape& shape, float start = 0) {
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + static_cast<float>(i);
  return Tensor::FromVector(shape, values);
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const fs::path dir = TempDir("roundtrip");
  const Tensor a = Iota(Shape{2, 3});
  const Tensor b = Tensor::FromVector(Shape{4}, std::vector<int64_t>{-1, 0, 7, 1LL << 40});
  const Tensor scalar = Tensor::FromVector(Shape{}, std::vector<float>{2.5f});
  ASSERT_TRUE(WriteSafetensors(dir / "x.safetensors", {{"a", a}, {"b", b}, {"s", scalar}}, {{"k", "v"}}).ok());
  auto file = SafetensorsFile::Open(dir / "x.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("k"), "v");
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->Load("a")->ToVector<float>(), a.ToVector<float>());
  EXPECT_EQ((*file)->Load("b")->ToVector<int64_t>(), b.ToVector<int64_t>());
  EXPECT_EQ((*file)->Load("s")->ToVector<float>(), std::vector<float>{2.5f});
  EXPECT_EQ((*file)->Find("a")->shape, (Shape{2, 3}));
  // The header is 8-byte aligned, as the format's writers do.
  const std::string bytes = ReadFile(dir / "x.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((n + 8) % 8, 0u);
  EXPECT_FALSE(WriteSafetensors(dir / "y.safetensors", {{"a", a}, {"a", a}}).ok());
  fs::remove_all(dir);
}

TEST(Safetensors, CorruptFilesAreErrorsNamingTheFile) {
  const fs::path dir = TempDir("corrupt");
  ASSERT_TRUE(WriteSafetensors(dir / "good.safetensors", {{"w", Iota(Shape{4, 4})}}).ok());
  const std::string good = ReadFile(dir / "good.safetensors");
  auto header = [](const std::string& json) {
    std::string out(8, '\0');
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
    return out + json;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"short", good.substr(0, 5)},
      {"huge header size", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"},
      {"truncated data", good.substr(0, good.size() - 4)},
      {"not json", header("{not json")},
      {"not an object", header("[1,2]")},
      {"bad dtype", header(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})") + std::string(4, '\0')},
      {"negative dim", header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})") + std::string(4, '\0')},
      {"offsets past the end",
       header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + std::string(4, '\0')},
      {"size mismatch", header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})") + std::string(8, '\0')},
      {"overlap",
       header(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") +
           std::string(12, '\0')},
      {"metadata not strings", header(R"({"__metadata__":{"k":1}})")},
      {"bytes after the data", good + "tail"},
      {"a gap between tensors",
       header(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})") +
           std::string(12, '\0')},
  };
  for (const auto& [name, bytes] : cases) {
    const fs::path path = dir / "bad.safetensors";
    WriteFile(path, bytes);
    auto file = SafetensorsFile::Open(path);
    EXPECT_FALSE(file.ok()) << name;
    if (!file.ok()) {
      EXPECT_NE(file.status().message().find(path.string()), std::string::npos) << name << ": " << file.status();
    }
  }
  EXPECT_EQ(SafetensorsFile::Open(dir / "missing.safetensors").status().code(), absl::StatusCode::kNotFound);
  // Bytes no tensor holds are named (a rank file appended to loaded, its
  // checksums passing).
  WriteFile(dir / "bad.safetensors", good + "tail");
  EXPECT_NE(
      SafetensorsFile::Open(dir / "bad.safetensors").status().message().find("4 bytes after the last tensor's data"),
      std::string::npos);
  fs::remove_all(dir);
}

// Writes a rank file as WriteCheckpointShards does: each tensor's slice and
// checksum in the metadata.
absl::Status WriteRankFile(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                           const nlohmann::json& slices) {
  nlohmann::json checksums = nlohmann::json::object();
  for (const auto& [name, t] : tensors) {
    checksums[name] = Checksum({static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.NumBytes())});
  }
  return WriteSafetensors(path, tensors, {{"tessera.slices", slices.dump()}, {"tessera.checksums", checksums.dump()}});
}

// Writes the shards of a (4, 6) tensor `w` split by rows over two rank files
// and a replicated scalar `s`, then commits them.
fs::path WriteRowSplitCheckpoint(const fs::path& root, const Tensor& whole) {
  const fs::path temp = root / ".iter_0000005.tmp-test";
  fs::create_directories(temp);
  const std::vector<float> all = whole.ToVector<float>();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> half(all.begin() + rank * 12, all.begin() + (rank + 1) * 12);
    nlohmann::json slices = {{"w", {{"logical_shape", {4, 6}}, {"offset", {2 * rank, 0}}}}};
    std::vector<std::pair<std::string, Tensor>> tensors = {{"w", Tensor::FromVector(Shape{2, 6}, half)}};
    if (rank == 0) {
      tensors.emplace_back("s", Tensor::FromVector(Shape{}, std::vector<float>{3.0f}));
      slices["s"] = {{"logical_shape", nlohmann::json::array()}, {"offset", nlohmann::json::array()}};
    }
    EXPECT_TRUE(WriteRankFile(temp / ("rank_0000" + std::to_string(rank) + ".safetensors"), tensors, slices).ok());
  }
  const fs::path final_dir = root / "iter_0000005";
  const absl::Status committed =
      CommitCheckpoint(temp, final_dir, {.iteration = 5, .global_batch = 8, .config = {}, .best = {}});
  EXPECT_TRUE(committed.ok()) << committed;
  return final_dir;
}

// A checkpoint committed under a name that exists (a rerun's iteration,
// the best one) replaces it in one step: nothing else is left. A
// replacement interrupted between its two renames (file systems without
// the swap) left the old one aside and the name missing: the next run's
// RemoveCheckpointTemps puts it back (the best checkpoint was lost so);
// one aside beside its original is a leftover and goes.
TEST(Checkpoint, AReplacementIsOneStepAndAnInterruptedOneIsUndone) {
  const fs::path out = TempDir("replace");
  const fs::path dir = CheckpointsDir(out);
  const auto read_w = [&](const fs::path& checkpoint) {
    auto reader = CheckpointReader::Open(checkpoint);
    EXPECT_TRUE(reader.ok()) << reader.status();
    Tensor w = *Tensor::Zeros(Shape{4, 6}, DType::kF32);
    EXPECT_TRUE((*reader)->Read("w", TensorSlice::Whole(Shape{4, 6}), w).ok());
    return w.ToVector<float>();
  };
  const auto entries = [&] {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
    return names;
  };
  WriteRowSplitCheckpoint(dir, Iota(Shape{4, 6}, 1));
  const fs::path checkpoint = WriteRowSplitCheckpoint(dir, Iota(Shape{4, 6}, 100));
  EXPECT_EQ(entries(), (std::set<std::string>{"iter_0000005"}));
  EXPECT_EQ(read_w(checkpoint), Iota(Shape{4, 6}, 100).ToVector<float>());

  fs::rename(checkpoint, dir / ".iter_0000005.old-.iter_0000005.tmp-test");
  fs::create_directories(dir / ".iter_0000005.tmp-test");
  ASSERT_TRUE(RemoveCheckpointTemps(out).ok());
  EXPECT_EQ(entries(), (std::set<std::string>{"iter_0000005"}));
  EXPECT_EQ(read_w(checkpoint), Iota(Shape{4, 6}, 100).ToVector<float>());

  fs::create_directories(dir / "best");
  fs::create_directories(dir / ".best.old-.iter_0000009.tmp-job-1-best");
  ASSERT_TRUE(RemoveCheckpointTemps(out).ok());
  EXPECT_EQ(entries(), (std::set<std::string>{"best", "iter_0000005"}));
  fs::remove_all(out);
}

TEST(Checkpoint, ReadsAnySliceFromShardsOfAnotherLayout) {
  const fs::path dir = TempDir("reshard");
  const Tensor whole = Iota(Shape{4, 6}, 1);
  const fs::path checkpoint = WriteRowSplitCheckpoint(dir, whole);
  EXPECT_FALSE(fs::exists(dir / ".iter_0000005.tmp-test"));
  auto reader = CheckpointReader::Open(checkpoint);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->iteration(), 5);
  // Column halves (tensor parallel), a block straddling both row shards, the whole.
  for (const auto& [offset, local] : std::vector<std::pair<std::vector<int64_t>, Shape>>{
           {{0, 0}, Shape{4, 3}}, {{0, 3}, Shape{4, 3}}, {{1, 2}, Shape{2, 3}}, {{0, 0}, Shape{4, 6}}}) {
    Tensor out = *Tensor::Zeros(local, DType::kF32);
    ASSERT_TRUE((*reader)->Read("w", TensorSlice{Shape{4, 6}, offset, local}, out).ok());
    const std::vector<float> got = out.ToVector<float>();
    for (int64_t r = 0; r < local.dims()[0]; ++r) {
      for (int64_t c = 0; c < local.dims()[1]; ++c) {
        EXPECT_EQ(got[static_cast<size_t>(r * local.dims()[1] + c)],
                  whole.ToVector<float>()[static_cast<size_t>((offset[0] + r) * 6 + offset[1] + c)]);
      }
    }
  }
  Tensor scalar = *Tensor::Zeros(Shape{}, DType::kF32);
  ASSERT_TRUE((*reader)->Read("s", TensorSlice::Whole(Shape{}), scalar).ok());
  EXPECT_EQ(scalar.ToVector<float>()[0], 3.0f);
  // Wrong shape, wrong dtype, unknown name: errors naming the tensor.
  Tensor wrong = *Tensor::Zeros(Shape{4, 5}, DType::kF32);
  auto status = (*reader)->Read("w", TensorSlice::Whole(Shape{4, 5}), wrong);
  EXPECT_NE(status.message().find("'w'"), std::string::npos) << status;
  Tensor ints = *Tensor::Zeros(Shape{4, 6}, DType::kI64);
  EXPECT_FALSE((*reader)->Read("w", TensorSlice::Whole(Shape{4, 6}), ints).ok());
  EXPECT_EQ((*reader)->Meta("nope").status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

// A path that names nothing is a one-line error, control characters
// escaped.
TEST(Checkpoint, AMissingPathIsAOneLineError) {
  auto reader = CheckpointReader::Open(TempDir("missing") / "a\nb");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(reader.status().message()).find('\n'), std::string::npos) << reader.status();
  EXPECT_NE(reader.status().message().find("a\\nb: no such directory"), std::string::npos) << reader.status();
}

// Hugging Face weights open as a checkpoint: "transformer." dropped, a
// stored shape filling a model shape whose trailing axes merge to it (and
// no other), f64 converted to f32, a slice read as from a shard; an lm_head
// that is not wte and a name held twice are errors naming the file.
TEST(Checkpoint, ReadsHuggingFaceWeights) {
  const fs::path dir = TempDir("hf");
  const fs::path file = dir / "model.safetensors";
  const Tensor w = Iota(Shape{2, 6}, 1);
  const Tensor b = Tensor::FromVector(Shape{6}, std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5});
  ASSERT_TRUE(WriteSafetensors(file, {{"transformer.w", w}, {"transformer.b", b}, {"wte.weight", w}}).ok());
  for (const fs::path& path : {file, dir}) {  // the file, or a directory holding model.safetensors
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_TRUE((*reader)->huggingface());
    EXPECT_EQ((*reader)->iteration(), 0);
  }
  auto reader = CheckpointReader::Open(file);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CheckpointReader& r = **reader;
  EXPECT_TRUE(r.CheckMeta("w", {DType::kF32, Shape{2, 6}}).ok());
  EXPECT_TRUE(r.CheckMeta("w", {DType::kF32, Shape{2, 3, 2}}).ok());
  EXPECT_FALSE(r.CheckMeta("w", {DType::kF32, Shape{6, 2}}).ok());  // same count, another layout
  EXPECT_FALSE(r.CheckMeta("w", {DType::kF32, Shape{4, 3}}).ok());
  EXPECT_FALSE(r.CheckMeta("w", {DType::kI64, Shape{2, 6}}).ok());
  EXPECT_EQ(r.CheckMeta("transformer.w", {DType::kF32, Shape{2, 6}}).code(), absl::StatusCode::kNotFound);
  // Row 1 of w as (2, 3, 2), columns [2, 4) of the middle axis' slice.
  Tensor out = *Tensor::Zeros(Shape{1, 2, 2}, DType::kF32);
  ASSERT_TRUE(r.Read("w", TensorSlice{Shape{2, 3, 2}, {1, 1, 0}, Shape{1, 2, 2}}, out).ok());
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{9, 10, 11, 12}));
  Tensor bias = *Tensor::Zeros(Shape{2, 3}, DType::kF32);
  ASSERT_TRUE(r.Read("b", TensorSlice::Whole(Shape{2, 3}), bias).ok());
  EXPECT_EQ(bias.ToVector<float>(), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}));

  // Read through a model's layout: the file's tensors the layout leaves
  // unread are listed (a model config smaller than the weights'), but for
  // transformers' buffers.
  ASSERT_TRUE(WriteSafetensors(file, {{"transformer.w", w},
                                      {"transformer.h.5.mlp.c_fc.weight", w},
                                      {"transformer.h.0.attn.bias", w},
                                      {"transformer.h.0.attn.masked_bias", w}})
                  .ok());
  auto through_layout = CheckpointReader::Open(file, {models::Model::HfTensor::Of("w", "w", Shape{2, 6})});
  ASSERT_TRUE(through_layout.ok()) << through_layout.status();
  EXPECT_EQ((*through_layout)->unused_tensors(), std::vector<std::string>{"transformer.h.5.mlp.c_fc.weight"});

  ASSERT_TRUE(WriteSafetensors(file, {{"wte.weight", w}, {"lm_head.weight", Iota(Shape{2, 6}, 2)}}).ok());
  auto untied = CheckpointReader::Open(file);
  ASSERT_FALSE(untied.ok());
  EXPECT_NE(untied.status().message().find("lm_head.weight is not wte.weight"), std::string::npos) << untied.status();
  EXPECT_NE(untied.status().message().find(file.string()), std::string::npos) << untied.status();
  ASSERT_TRUE(WriteSafetensors(file, {{"transformer.w", w}, {"w", w}}).ok());
  auto twice = CheckpointReader::Open(file);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("holds 'w' twice"), std::string::npos) << twice.status();
  fs::remove_all(dir);
}

TEST(Checkpoint, CommitRefusesShardsThatDoNotTileTheTensor) {
  const fs::path dir = TempDir("tiles");
  const fs::path temp = dir / ".iter_0000001.tmp-x";
  fs::create_directories(temp);
  nlohmann::json slices = {{"w", {{"logical_shape", {4, 6}}, {"offset", {0, 0}}}}};
  ASSERT_TRUE(WriteRankFile(temp / "rank_00000.safetensors", {{"w", Iota(Shape{2, 6})}}, slices).ok());
  const absl::Status missing =
      CommitCheckpoint(temp, dir / "iter_0000001", {.iteration = 1, .global_batch = 1, .config = {}, .best = {}});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cover"), std::string::npos) << missing;
  EXPECT_FALSE(fs::exists(dir / "iter_0000001"));
  // Overlapping shards.
  ASSERT_TRUE(WriteRankFile(temp / "rank_00001.safetensors", {{"w", Iota(Shape{3, 6})}},
                            {{"w", {{"logical_shape", {4, 6}}, {"offset", {1, 0}}}}})
                  .ok());
  const absl::Status overlap =
      CommitCheckpoint(temp, dir / "iter_0000001", {.iteration = 1, .global_batch = 1, .config = {}, .best = {}});
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap;
  // A rank file without its tensors' checksums is not one this code wrote.
  ASSERT_TRUE(WriteSafetensors(
                  temp / "rank_00001.safetensors", {{"w", Iota(Shape{2, 6})}},
                  {{"tessera.slices", nlohmann::json({{"w", {{"logical_shape", {4, 6}}, {"offset", {2, 0}}}}}).dump()}})
                  .ok());
  const absl::Status unchecked =
      CommitCheckpoint(temp, dir / "iter_0000001", {.iteration = 1, .global_batch = 1, .config = {}, .best = {}});
  EXPECT_NE(unchecked.message().find("rank_00001.safetensors: no checksum for 'w'"), std::string::npos) << unchecked;
  EXPECT_FALSE(fs::exists(dir / "iter_0000001"));
  fs::remove_all(dir);
}

// A flipped bit in a rank file's data is an error naming the file and the
// tensor when the file is first read, never other weights loaded silently;
// a checkpoint written before the checksums (none in index.json) loads
// unchecked, and an index naming another algorithm is refused.
TEST(Checkpoint, DamagedDataIsAnErrorNamingTheFileAndTheTensor) {
  const fs::path dir = TempDir("checksum");
  const Tensor whole = Iota(Shape{4, 6}, 1);
  const fs::path checkpoint = WriteRowSplitCheckpoint(dir, whole);
  const std::string index = ReadFile(checkpoint / "index.json");
  EXPECT_EQ(nlohmann::json::parse(index).at("checksums"), "xxh3_64");
  const fs::path rank1 = checkpoint / "rank_00001.safetensors";
  const std::string good = ReadFile(rank1);
  std::string damaged = good;
  damaged[damaged.size() - 5] = static_cast<char>(damaged[damaged.size() - 5] ^ 0x01);  // one bit of w's last row
  WriteFile(rank1, damaged);
  const auto read_w = [&](const fs::path& path, const TensorSlice& slice) {
    auto reader = CheckpointReader::Open(path);
    if (!reader.ok()) return reader.status();
    Tensor out = *Tensor::Zeros(slice.local, DType::kF32);
    return (*reader)->Read("w", slice, out);
  };
  const absl::Status status = read_w(checkpoint, TensorSlice::Whole(Shape{4, 6}));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find(checkpoint.string() +
                                  ": rank_00001.safetensors: the data of 'w' does not match its checksum"),
            std::string::npos)
      << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
  // The rows held by the undamaged file still read.
  EXPECT_TRUE(read_w(checkpoint, TensorSlice{Shape{4, 6}, {0, 0}, Shape{2, 6}}).ok());
  // A rank file whose checksums were stripped, under an index that lists them.
  ASSERT_TRUE(WriteSafetensors(
                  rank1, {{"w", Iota(Shape{2, 6}, 13)}},
                  {{"tessera.slices", nlohmann::json({{"w", {{"logical_shape", {4, 6}}, {"offset", {2, 0}}}}}).dump()}})
                  .ok());
  EXPECT_NE(read_w(checkpoint, TensorSlice::Whole(Shape{4, 6})).message().find("no tessera.checksums"),
            std::string::npos);
  // An older checkpoint (no checksums in its index or its files) loads as
  // it is; files that carry checksums are checked whatever the index says.
  nlohmann::json old = nlohmann::json::parse(index);
  old.erase("checksums");
  WriteFile(checkpoint / "index.json", old.dump());
  EXPECT_TRUE(read_w(checkpoint, TensorSlice::Whole(Shape{4, 6})).ok());
  WriteFile(rank1, damaged);
  EXPECT_EQ(read_w(checkpoint, TensorSlice::Whole(Shape{4, 6})).code(), absl::StatusCode::kDataLoss);
  old["checksums"] = "md5";
  WriteFile(checkpoint / "index.json", old.dump());
  EXPECT_NE(
      CheckpointReader::Open(checkpoint).status().message().find(R"(index.json's checksums "md5" is not xxh3_64)"),
      std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptIndexIsAnErrorNamingTheCheckpoint) {
  const fs::path dir = TempDir("index");
  const fs::path checkpoint = WriteRowSplitCheckpoint(dir, Iota(Shape{4, 6}));
  const std::string good = ReadFile(checkpoint / "index.json");
  nlohmann::json escape = nlohmann::json::parse(good);
  escape["tensors"]["w"]["shards"][0]["file"] = "../../etc/passwd";
  nlohmann::json outside = nlohmann::json::parse(good);
  outside["tensors"]["w"]["shards"][0]["offset"] = {3, 0};
  for (const std::string& bad :
       {std::string("{"), std::string("[]"), std::string(R"({"format":"x"})"), escape.dump(), outside.dump()}) {
    WriteFile(checkpoint / "index.json", bad);
    auto reader = CheckpointReader::Open(checkpoint);
    EXPECT_FALSE(reader.ok()) << bad;
    if (!reader.ok()) {
      EXPECT_NE(reader.status().message().find(checkpoint.string()), std::string::npos);
    }
  }
  // Cut short: not valid JSON (it said "not a JSON object").
  WriteFile(checkpoint / "index.json", good.substr(0, good.size() / 2));
  EXPECT_NE(
      CheckpointReader::Open(checkpoint).status().message().find("index.json is not valid JSON (cut short or damaged)"),
      std::string::npos);
  // An iteration out of range is named as such (it read "has no iteration").
  for (const char* iteration : {"-1", "9223372036854775808", "\"2\"", "1.5"}) {
    nlohmann::json index = nlohmann::json::parse(good);
    index["iteration"] = nlohmann::json::parse(iteration);
    WriteFile(checkpoint / "index.json", index.dump());
    const absl::Status status = CheckpointReader::Open(checkpoint).status();
    EXPECT_NE(
        status.message().find(std::string("index.json's iteration ") + iteration + " is not an integer in [0, 2^63)"),
        std::string::npos)
        << status;
  }
  // A train_state.best or evaluation_pending it cannot read (a resume took
  // it for none, and its save_best replaced the best checkpoint).
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"best", {{"metric", "eval_loss"}, {"mode", "min"}, {"value", "1"}}},
           {"best", {{"metric", "eval_loss"}, {"mode", "least"}, {"value", 1}}},
           {"best", "x"},
           {"evaluation_pending", "yes"}}) {
    nlohmann::json index = nlohmann::json::parse(good);
    index["train_state"][key] = value;
    WriteFile(checkpoint / "index.json", index.dump());
    const absl::Status status = CheckpointReader::Open(checkpoint).status();
    EXPECT_NE(status.message().find("index.json's train_state." + key + " "), std::string::npos) << status;
  }
  {
    nlohmann::json index = nlohmann::json::parse(good);
    index["train_state"]["best"] = {{"metric", "eval_loss"}, {"mode", "max"}, {"value", 1.5}};
    index["train_state"]["evaluation_pending"] = true;
    WriteFile(checkpoint / "index.json", index.dump());
    EXPECT_TRUE(CheckpointReader::Open(checkpoint).ok());
  }
  // A shape of more elements than an int64 holds (export aborted on it),
  // and a shape of another rank than its shards'.
  for (const auto& [shape, error] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{int64_t{1} << 62, int64_t{1} << 62},
            "index.json: tensor 'w': f32 tensor: shape (4611686018427387904, 4611686018427387904) has more than 2^50 "
            "elements"},
           {nlohmann::json::array(),
            "index.json: tensor 'w': a shard's offset and shape must each list 0 sizes (the tensor's rank)"}}) {
    nlohmann::json index = nlohmann::json::parse(good);
    index["tensors"]["w"]["shape"] = shape;
    WriteFile(checkpoint / "index.json", index.dump());
    const absl::Status status = CheckpointReader::Open(checkpoint).status();
    EXPECT_NE(status.message().find(error), std::string::npos) << status;
  }
  WriteFile(checkpoint / "index.json", good);
  // A shard's list of a wrong value says so (it said the list must list 2
  // sizes, which it did).
  {
    nlohmann::json index = nlohmann::json::parse(good);
    for (auto& shard : index["tensors"]["w"]["shards"]) shard["offset"][0] = -1;
    WriteFile(checkpoint / "index.json", index.dump());
    const absl::Status status = CheckpointReader::Open(checkpoint).status();
    EXPECT_NE(status.message().find("index.json: tensor 'w': a shard's offset is not a list of non-negative integers: "
                                    "[-1,"),
              std::string::npos)
        << status;
  }
  WriteFile(checkpoint / "index.json", good);
  // One rank's file of it is not Hugging Face weights (it loaded as such).
  int rank_files = 0;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    if (entry.path().extension() != ".safetensors") continue;
    ++rank_files;
    const absl::Status status = CheckpointReader::Open(entry.path()).status();
    EXPECT_NE(status.message().find("is one rank's file of a Tessera checkpoint, not Hugging Face weights"),
              std::string::npos)
        << status;
  }
  EXPECT_GE(rank_files, 2);
  fs::remove(checkpoint / "index.json");
  EXPECT_EQ(CheckpointReader::Open(checkpoint).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

// Files of two checkpoints put together: each checks out by itself, so
// the index binds its rank files (their checksums), its directory's name
// (the iteration) and its own train_state; a FIFO in a rank file's place
// is refused, not waited on; an index.json given for its checkpoint names
// the directory.
TEST(Checkpoint, FilesOfTwoCheckpointsTogetherAreRefused) {
  const fs::path dir = TempDir("mixed");
  const fs::path a = WriteRowSplitCheckpoint(dir / "a", Iota(Shape{4, 6}, 1));
  const fs::path b = WriteRowSplitCheckpoint(dir / "b", Iota(Shape{4, 6}, 100));
  const auto read_w = [&](const fs::path& path) {
    auto reader = CheckpointReader::Open(path);
    if (!reader.ok()) return reader.status();
    Tensor out = *Tensor::Zeros(Shape{4, 6}, DType::kF32);
    return (*reader)->Read("w", TensorSlice::Whole(Shape{4, 6}), out);
  };
  ASSERT_TRUE(read_w(a).ok());
  fs::copy_file(b / "rank_00001.safetensors", a / "rank_00001.safetensors", fs::copy_options::overwrite_existing);
  absl::Status status = read_w(a);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(status.message(), "checkpoint " + a.string() +
                                  ": rank_00001.safetensors is not the rank file its index.json was written with ('w' "
                                  "differs): files of two checkpoints mixed?");
  // An index of iteration 5 in a directory named for iteration 7.
  fs::copy(b, dir / "iter_0000007");
  status = CheckpointReader::Open(dir / "iter_0000007").status();
  EXPECT_NE(status.message().find("index.json is iteration 5's, the directory iter_0000007's name another's"),
            std::string::npos)
      << status;
  EXPECT_NE(CheckpointReader::Open(dir / "iter_0000007" / "").status().message().find("iter_0000007's name"),
            std::string::npos);
  // 41 samples in 5 iterations.
  nlohmann::json index = nlohmann::json::parse(ReadFile(b / "index.json"));
  index["train_state"]["consumed_samples"] = 41;
  WriteFile(b / "index.json", index.dump());
  EXPECT_NE(CheckpointReader::Open(b).status().message().find(
                "index.json's train_state is inconsistent: 41 samples in 5 iterations"),
            std::string::npos);
  index["train_state"]["consumed_samples"] = 0;  // (a global batch of 0)
  WriteFile(b / "index.json", index.dump());
  EXPECT_NE(CheckpointReader::Open(b).status().message().find("inconsistent: 0 samples in 5 iterations"),
            std::string::npos);
  index["train_state"]["consumed_samples"] = 40;
  index["train_state"]["iteration"] = 4;
  WriteFile(b / "index.json", index.dump());
  EXPECT_NE(CheckpointReader::Open(b).status().message().find("inconsistent: iteration 4 beside iteration 5"),
            std::string::npos);
  index["train_state"]["iteration"] = 5;
  nlohmann::json unbound = index;
  unbound["tensors"]["w"]["shards"][1].erase("checksum");
  WriteFile(b / "index.json", unbound.dump());
  EXPECT_NE(CheckpointReader::Open(b).status().message().find("lists the checksums of 2 of its 3 shards"),
            std::string::npos);
  WriteFile(b / "index.json", index.dump());
  ASSERT_TRUE(read_w(b).ok());
  // A FIFO for a rank file: refused at once (opening it blocked).
  fs::remove(b / "rank_00000.safetensors");
  ASSERT_EQ(::mkfifo((b / "rank_00000.safetensors").c_str(), 0600), 0);
  status = read_w(b);
  EXPECT_NE(status.message().find("rank_00000.safetensors: not a regular file"), std::string::npos) << status;
  status = CheckpointReader::Open(b / "index.json").status();
  EXPECT_EQ(status.message(), "checkpoint " + (b / "index.json").string() +
                                  ": the index of a checkpoint; give its directory, " + b.string());
  fs::remove_all(dir);
}

// An index.json whose shard offsets were edited: shards that overlap or
// leave a gap are refused when it is opened (a whole-tensor read, export's
// and generate's, took one shard's values twice and left zeros); shards that
// tile the tensor but are not where their rank files say they were written
// (two offsets swapped) are refused when the file is read (the weights were
// read transposed into other places, on every path).
TEST(Checkpoint, ShardsThatAreNotWhereTheirFilesSayAreRefused) {
  const fs::path dir = TempDir("moved");
  const fs::path checkpoint = WriteRowSplitCheckpoint(dir, Iota(Shape{4, 6}, 1));
  const nlohmann::json good = nlohmann::json::parse(ReadFile(checkpoint / "index.json"));
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json index = good;
    edit(index["tensors"]["w"]["shards"]);
    WriteFile(checkpoint / "index.json", index.dump());
  };
  const auto read_w = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(checkpoint));
    Tensor out = *Tensor::Zeros(Shape{4, 6}, DType::kF32);
    return reader->Read("w", TensorSlice::Whole(Shape{4, 6}), out);
  };
  ASSERT_EQ(good["tensors"]["w"]["shards"][1]["offset"], nlohmann::json({2, 0}));
  with([](nlohmann::json& shards) { shards[1]["offset"] = {1, 0}; });
  EXPECT_EQ(read_w().message(), "checkpoint " + checkpoint.string() +
                                    ": index.json: tensor 'w': two of its shards overlap (rank_00000.safetensors and "
                                    "rank_00001.safetensors)");
  with([](nlohmann::json& shards) { shards[1]["shape"] = {1, 6}; });
  EXPECT_EQ(read_w().message(),
            "checkpoint " + checkpoint.string() + ": index.json: tensor 'w': its shards cover 18 of its 24 elements");
  with([](nlohmann::json& shards) { std::swap(shards[0]["offset"], shards[1]["offset"]); });
  const absl::Status swapped = read_w();
  EXPECT_EQ(swapped.code(), absl::StatusCode::kDataLoss) << swapped;
  EXPECT_EQ(swapped.message(), "checkpoint " + checkpoint.string() +
                                   ": rank_00000.safetensors: its shard of 'w' is not where index.json puts it "
                                   "(offset [2,0] of [4,6]; the file says {\"logical_shape\":[4,6],\"offset\":[0,0]}): "
                                   "index.json edited or damaged?");
  // A rank file holds one slice of a tensor, and the index names only the
  // checkpoint's files (200,000 shards of one file took minutes to check).
  with([](nlohmann::json& shards) {
    nlohmann::json empty = shards[0];
    empty["offset"] = {0, 0};
    empty["shape"] = {0, 6};
    for (int i = 0; i < 200000; ++i) shards.push_back(empty);
  });
  const auto started = absl::Now();
  EXPECT_EQ(read_w().message(),
            "checkpoint " + checkpoint.string() + ": index.json: tensor 'w': two shards in rank_00000.safetensors");
  EXPECT_LT(absl::Now() - started, absl::Seconds(10));
  with([](nlohmann::json& shards) { shards[1]["file"] = "rank_00002.safetensors"; });
  EXPECT_EQ(read_w().message(), "checkpoint " + checkpoint.string() +
                                    ": index.json: tensor 'w': its shard file rank_00002.safetensors is not in the "
                                    "checkpoint (a rank file is missing)");
  // Bytes after a NUL (a damaged tail) were not read at all.
  WriteFile(checkpoint / "index.json", good.dump() + std::string("\0{{ damaged", 11));
  EXPECT_EQ(read_w().message(), "checkpoint " + checkpoint.string() + ": index.json holds a NUL byte (damaged)");
  WriteFile(checkpoint / "index.json", good.dump());
  EXPECT_TRUE(read_w().ok());
  fs::remove_all(dir);
}

// A path that cannot be resolved says why: an empty one, and a file that is
// a symbolic link loop (it was "no such file").
TEST(Checkpoint, AnEmptyPathAndALinkLoopSayWhat) {
  EXPECT_EQ(ResolveCheckpoint("").status().message(), "the checkpoint's path is empty");
  const fs::path dir = TempDir("loop");
  fs::create_symlink("loop.json", dir / "loop.json");
  const absl::Status looped = ReadWholeFile(dir / "loop.json").status();
  EXPECT_EQ(looped.code(), absl::StatusCode::kInvalidArgument) << looped;
  EXPECT_NE(looped.message().find("symbolic links"), std::string::npos) << looped;
  fs::remove_all(dir);
}

TEST(Checkpoint, LatestAndPrune) {
  const fs::path out = TempDir("prune");
  for (int64_t it : {3, 10, 7})
    fs::create_directories(CheckpointPath(out, it)), WriteFile(CheckpointPath(out, it) / "index.json", "{}");
  fs::create_directories(CheckpointTempPath(out, 11, "other-run"));
  fs::create_directories(CheckpointTempPath(out, 12, "this-run"));
  // A newest iter_* that is not a whole checkpoint (a commit renames one
  // into place with its index.json) was damaged: an error naming it, not a
  // silent start from an older one or from scratch.
  fs::create_directories(CheckpointPath(out, 20));  // no index.json
  auto damaged = LatestCheckpoint(out);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find(CheckpointPath(out, 20).string() + " is the newest checkpoint but not a "
                                                                               "complete one (no index.json)"),
            std::string::npos)
      << damaged.status();
  fs::remove_all(CheckpointPath(out, 20));
  WriteFile(CheckpointPath(out, 30), "not a directory");
  damaged = LatestCheckpoint(out);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("(not a directory)"), std::string::npos) << damaged.status();
  fs::remove(CheckpointPath(out, 30));
  // One whose index.json cannot be read (a symlink loop here; permissions
  // elsewhere) is said so, not called incomplete (which advised moving a
  // good checkpoint away).
  fs::create_directories(CheckpointPath(out, 40));
  fs::create_symlink("index.json", CheckpointPath(out, 40) / "index.json");
  damaged = LatestCheckpoint(out);
  EXPECT_EQ(damaged.status(),
            absl::PermissionDeniedError("cannot read " + (CheckpointPath(out, 40) / "index.json").string() +
                                        ": Too many levels of symbolic links"));
  EXPECT_EQ(
      CheckpointReader::Open(CheckpointPath(out, 40)).status().message(),
      "checkpoint " + CheckpointPath(out, 40).string() + ": cannot read index.json: Too many levels of symbolic links");
  fs::remove_all(CheckpointPath(out, 40));
  auto latest = LatestCheckpoint(out);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, CheckpointPath(out, 10));
  // What a pruning killed midway left before pruned checkpoints were moved
  // aside first: an iter_* without index.json older than the newest.
  fs::create_directories(CheckpointPath(out, 5));
  ASSERT_TRUE(PruneCheckpoints(out, 2, "this-run").ok());
  EXPECT_FALSE(fs::exists(CheckpointPath(out, 3)));
  EXPECT_FALSE(fs::exists(CheckpointPath(out, 5)));
  for (const auto& entry : fs::directory_iterator(CheckpointsDir(out))) {
    EXPECT_EQ(entry.path().filename().string().find("pruned"), std::string::npos) << entry.path();
  }
  EXPECT_TRUE(fs::exists(CheckpointPath(out, 7)));
  EXPECT_TRUE(fs::exists(CheckpointPath(out, 10)));
  EXPECT_FALSE(fs::exists(CheckpointTempPath(out, 11, "other-run")));
  EXPECT_TRUE(fs::exists(CheckpointTempPath(out, 12, "this-run")));
  fs::remove_all(out);
}

// ---- end to end through `tessera train` ----

// iteration -> loss, from metrics.jsonl (log_period 1).
std::map<int64_t, double> Losses(const fs::path& output_dir) {
  std::map<int64_t, double> losses;
  std::ifstream in(output_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);  // a run may be writing the last line
    if (j.is_object() && j.contains("loss")) losses[j["iter"].get<int64_t>()] = j["loss"].get<double>();
  }
  return losses;
}

std::string Nano(const fs::path& out, const std::string& extra = "") {
  return "train " + SourcePath("configs/gpt2_nano.json") + " train.train_iter=8 train.log_period=1 " +
         "train.checkpointer.period=4 train.output_dir=" + out.string() + " " + extra;
}

// A fresh output directory `to` holding only `from`'s checkpoint of
// `iteration`, for a resume to start from.
void CopyCheckpoint(const fs::path& from, int64_t iteration, const fs::path& to) {
  fs::remove_all(to);
  fs::create_directories(to / "checkpoints");
  fs::copy(CheckpointPath(from, iteration), CheckpointPath(to, iteration), fs::copy_options::recursive);
}

TEST(CheckpointEndToEnd, ResumeContinuesBitExactlyUnderAnyLayout) {
  const fs::path root = TempDir("e2e");
  const fs::path straight = root / "straight";
  auto run = RunTessera(Nano(straight, "train.dist.tensor_parallel_size=2"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::map<int64_t, double> reference = Losses(straight);
  ASSERT_EQ(reference.size(), 8u);
  ASSERT_TRUE(fs::exists(CheckpointPath(straight, 4) / "index.json"));
  ASSERT_TRUE(fs::exists(CheckpointPath(straight, 8) / "index.json"));
  // Two rank files (tensor parallel), replicated tensors written once.
  EXPECT_TRUE(fs::exists(CheckpointPath(straight, 4) / "rank_00000.safetensors"));
  EXPECT_TRUE(fs::exists(CheckpointPath(straight, 4) / "rank_00001.safetensors"));

  // "4 + resume 4" under the same layout: the same losses, bit for bit.
  // The earlier run's metrics.jsonl ends in a row a kill cut short: it goes
  // (kept, it sat among the resumed rows), the rows up to 4 stay.
  const fs::path resumed = root / "resumed";
  CopyCheckpoint(straight, 4, resumed);
  {
    std::ifstream in(straight / "metrics.jsonl");
    std::ofstream out(resumed / "metrics.jsonl");
    std::string line;
    for (int k = 0; k < 6 && std::getline(in, line); ++k) out << line << "\n";
    out << R"({"grad_norm":0.9,"iter":7,"lo)";
  }
  run = RunTessera(Nano(resumed, "train.dist.tensor_parallel_size=2 --resume"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  std::map<int64_t, double> losses = Losses(resumed);
  ASSERT_EQ(losses.size(), 8u) << run.out;
  for (int64_t it = 1; it <= 8; ++it) EXPECT_EQ(losses[it], reference.at(it)) << "iteration " << it;
  {
    std::ifstream in(resumed / "metrics.jsonl");
    std::map<int64_t, double> rate;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      EXPECT_TRUE(row.is_object()) << line;
      if (row.is_object() && row.contains("samples_per_s")) rate[row["iter"]] = row["samples_per_s"];
    }
    // The first resumed row's rate counts the samples of its own iteration,
    // not all since iteration 0 (it read 5x too high).
    ASSERT_TRUE(rate.contains(5) && rate.contains(6) && rate.contains(7) && rate.contains(8));
    EXPECT_LT(rate[5], 3 * std::max({rate[6], rate[7], rate[8]}));
  }

  // The tensor-parallel checkpoint under data, pipeline and 2-D layouts:
  // the first iteration's loss (the loaded weights' forward) within 1e-5.
  // (The same global batch: micro-batch 8 on each of 2 data-parallel ranks.)
  for (const std::string layout :
       {"train.dist.data_parallel_size=2 train.train_micro_batch_size=8", "train.dist.pipeline_parallel_size=2",
        "train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2 train.train_micro_batch_size=8"}) {
    const fs::path other = root / "other";
    CopyCheckpoint(straight, 4, other);
    run = RunTessera(Nano(other, layout + " --resume"));
    ASSERT_EQ(run.exit_code, 0) << layout << ": " << run.out;
    losses = Losses(other);
    ASSERT_EQ(losses.size(), 4u) << layout;
    EXPECT_NEAR(losses[5], reference.at(5), 1e-5 * std::abs(reference.at(5))) << layout;
    for (int64_t it = 6; it <= 8; ++it)
      EXPECT_NEAR(losses[it], reference.at(it), 1e-4 * std::abs(reference.at(it))) << layout;
  }
  fs::remove_all(root);
}

// Another world size: a checkpoint of data_parallel_size=2 resumes at
// data_parallel_size=4 with the same global batch (16: micro-batch 8 on 2
// ranks, 4 on 4); the optimizer state and the data position reshard with it,
// and the losses stay the straight run's.
TEST(CheckpointEndToEnd, DataParallelTwoResumesAtFour) {
  const fs::path root = TempDir("dp");
  const fs::path straight = root / "straight";
  auto run = RunTessera(Nano(straight, "train.dist.data_parallel_size=2 train.train_micro_batch_size=8"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::map<int64_t, double> reference = Losses(straight);
  ASSERT_EQ(reference.size(), 8u);
  const fs::path wider = root / "wider";
  CopyCheckpoint(straight, 4, wider);
  run = RunTessera(Nano(wider, "train.dist.data_parallel_size=4 train.train_micro_batch_size=4 --resume"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::map<int64_t, double> losses = Losses(wider);
  ASSERT_EQ(losses.size(), 4u) << run.out;
  for (int64_t it = 5; it <= 8; ++it) {
    EXPECT_NEAR(losses.at(it), reference.at(it), 1e-5 * std::abs(reference.at(it))) << "iteration " << it;
  }
  // Resuming at a different global batch would change the data position's
  // meaning: refused, naming both.
  run = RunTessera(Nano(wider, "train.train_iter=12 train.dist.data_parallel_size=4 --resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("global batch"), std::string::npos) << run.out;
  fs::remove_all(root);
}

// SGD at momentum 0 keeps no momentum buffer, so its checkpoint holds none;
// resumed with momentum, the buffers start at zero (torch.optim.SGD starts a
// missing one as the gradient): the first resumed step is the momentum-free
// run's, bit for bit, and the next one differs.
TEST(CheckpointEndToEnd, SgdWithoutMomentumCheckpointsNoBufferAndResumesWithOne) {
  const fs::path root = TempDir("sgd");
  const fs::path straight = root / "straight";
  auto run = RunTessera(Nano(straight, "optim._target_=SGD optim.lr=0.5"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::map<int64_t, double> reference = Losses(straight);
  ASSERT_EQ(reference.size(), 8u);
  {
    std::ifstream in(CheckpointPath(straight, 4) / "index.json");
    const nlohmann::json index = nlohmann::json::parse(in);
    ASSERT_FALSE(index.at("tensors").empty());
    for (const auto& [name, tensor] : index.at("tensors").items()) EXPECT_FALSE(name.ends_with(".momentum")) << name;
  }
  const fs::path resumed = root / "resumed";
  CopyCheckpoint(straight, 4, resumed);
  run = RunTessera(Nano(resumed, "optim._target_=SGD optim.lr=0.5 optim.momentum=0.9 --resume"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::map<int64_t, double> losses = Losses(resumed);
  ASSERT_EQ(losses.size(), 4u) << run.out;
  EXPECT_EQ(losses.at(5), reference.at(5));
  EXPECT_EQ(losses.at(6), reference.at(6));
  EXPECT_NE(losses.at(7), reference.at(7));
  // Its checkpoint holds momentum buffers: resumed at momentum 0 they go
  // unused (it was refused as a tensor "this model does not have"), as
  // every momentum-0 checkpoint written before momentum 0 kept none.
  run = RunTessera(Nano(resumed, "optim._target_=SGD optim.lr=0.5 train.train_iter=10 --resume"));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(Losses(resumed).size(), 6u) << run.out;
  // One buffer missing where the others are there is a damaged checkpoint,
  // not one of momentum 0: an error naming it (it started at zero unsaid).
  {
    const fs::path index_path = CheckpointPath(resumed, 8) / "index.json";
    nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
    std::string dropped;
    for (const auto& [name, tensor] : index.at("tensors").items()) {
      if (name.ends_with(".momentum")) dropped = name;
    }
    ASSERT_FALSE(dropped.empty());
    index["tensors"].erase(dropped);
    std::ofstream(index_path) << index.dump(1);
    fs::remove_all(CheckpointPath(resumed, 10));
    run = RunTessera(Nano(resumed, "optim._target_=SGD optim.lr=0.5 optim.momentum=0.9 train.train_iter=12 --resume"));
    EXPECT_NE(run.exit_code, 0) << run.out;
    EXPECT_NE(run.out.find(dropped), std::string::npos) << run.out;
  }
  fs::remove_all(root);
}

TEST(CheckpointEndToEnd, ResumeErrorsAreOneLine) {
  const fs::path root = TempDir("errors");
  // A finished run cannot be resumed without raising train_iter.
  auto run = RunTessera(Nano(root / "done"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  run = RunTessera(Nano(root / "done", "--resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("train_iter"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  // A checkpoint of another model: the tensor and both shapes named.
  run = RunTessera(
      Nano(root / "wide", "model.hidden_size=32 train.load_weight=" + CheckpointPath(root / "done", 8).string()));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("the model's is"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  run = RunTessera(Nano(root / "none", "train.load_weight=" + (root / "nowhere").string()));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("train.load_weight"), std::string::npos) << run.out;
  // An export into the checkpoint it reads would break it.
  const fs::path rank0 = CheckpointPath(root / "done", 8) / "rank_00000.safetensors";
  const std::string before = ReadFile(rank0);
  run = RunTessera("export " + (root / "done").string() + " --output " + rank0.string());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("is inside the checkpoints of "), std::string::npos) << run.out;
  EXPECT_EQ(ReadFile(rank0), before);
  const std::string config = ReadFile(root / "done" / "config.json");
  run = RunTessera("export " + (root / "done").string() + " --output " + (root / "done").string());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("is the training run's own directory"), std::string::npos) << run.out;
  EXPECT_EQ(ReadFile(root / "done" / "config.json"), config);
  // A bit flipped on disk: one line naming the file and the tensor.
  const fs::path flipped = root / "flipped";
  fs::copy(CheckpointPath(root / "done", 8), flipped);
  std::string bytes = ReadFile(flipped / "rank_00000.safetensors");
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x40);
  WriteFile(flipped / "rank_00000.safetensors", bytes);
  run = RunTessera(Nano(root / "from_flipped", "train.load_weight=" + flipped.string()));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("rank_00000.safetensors: the data of '"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("' does not match its checksum (the file is damaged)"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  // (Not "actor 'param:...' (op ...)": whichever actor opened the file first.)
  EXPECT_EQ(run.out.rfind("tessera: checkpoint " + flipped.string() + ": ", 0), 0u) << run.out;
  // Another sequence length: the samples the checkpoint counted were other
  // windows of the data (it resumed silently).
  run = RunTessera(Nano(root / "done", "model.seq_length=16 train.train_iter=12 --resume"));
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("trained with model.seq_length 32, this run's is 16"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  // Other seeds or another synthetic task: resumed (on purpose, say past a
  // loss spike), but said (it went on silently).
  fs::copy(root / "done", root / "reseeded", fs::copy_options::recursive);
  run = RunTessera(Nano(root / "reseeded", "model.data_seed=9 train.seed=5 train.train_iter=9 --resume"));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("[warning] train.resume: train.seed 1234 -> 5, "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("model.data_seed "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("from iteration 8 on the run draws other samples or random numbers"), std::string::npos)
      << run.out;
  // A smaller model than the checkpoint's (one layer of its two): a resume
  // is refused naming a tensor left over (the rest used to be dropped
  // silently); a new run from its weights warns and starts from the rest.
  run = RunTessera(Nano(root / "done", "model.num_layers=1 train.train_iter=12 --resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("holds 'h.1."), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("which this model does not have"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  run = RunTessera(Nano(root / "done", "model.num_attention_heads=2 train.train_iter=12 --resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("was trained with model.num_attention_heads 4, this run has 2"), std::string::npos) << run.out;
  // Another initialisation seed: nothing reads it (every weight comes from
  // the checkpoint), so it is refused as any key nothing reads.
  run = RunTessera(Nano(root / "done", "model.init_seed=99 train.train_iter=12 --resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("was trained with model.init_seed "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(", this run has 99"), std::string::npos) << run.out;
  // Another optimizer: its state is not in the checkpoint, and the error
  // says so (it named a missing tensor).
  run = RunTessera(Nano(root / "done", "optim._target_=SGD train.train_iter=12 --resume"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("was trained with optim._target_ \"AdamW\", this run has \"SGD\": a resume continues the "
                         "optimizer's state"),
            std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find('\n'), run.out.size() - 1) << run.out;
  run = RunTessera(
      Nano(root / "smaller", "model.num_layers=1 train.load_weight=" + CheckpointPath(root / "done", 8).string()));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("[warning] train.load_weight: checkpoint "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("; the run starts from the rest"), std::string::npos) << run.out;
  // Weights only: starts at iteration 1 from the trained weights, so its
  // first loss is the finished run's level, not the init's.
  run = RunTessera(Nano(root / "warm", "train.load_weight=" + CheckpointPath(root / "done", 8).string()));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto cold = Losses(root / "done"), warm = Losses(root / "warm");
  ASSERT_EQ(warm.size(), 8u);
  EXPECT_LT(warm.at(1), cold.at(1) - 0.05);
  // Another train.seed on a resume reseeds the dropout and the data order.
  CopyCheckpoint(root / "done", 8, root / "reseeded");
  run = RunTessera(Nano(root / "reseeded", "train.seed=77 train.train_iter=10 --resume"));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  // With --resume and a checkpoint to continue, train.load_weight is not
  // read, and the run says so where the user sees it (it reached only
  // log.txt).
  run = RunTessera(Nano(root / "reseeded",
                        "train.train_iter=11 --resume train.load_weight=" + CheckpointPath(root / "done", 8).string()));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("[node 0] train.load_weight " + CheckpointPath(root / "done", 8).string() +
                         " is not read: --resume continues"),
            std::string::npos)
      << run.out;
  fs::remove_all(root);
}

// Every `tessera train` names its checkpoints' temporary directories
// alike (.iter_N.tmp-job-000001-1): one a killed run left must not take the
// next run's shards beside its own (a tensor-parallel run's halves
// "overlapped" a one-device run's whole tensors, and its files were
// committed). The next run removes it before its first iteration.
TEST(CheckpointEndToEnd, ATemporaryDirectoryAKilledRunLeftIsRemoved) {
  const fs::path root = TempDir("stale_temp");
  const fs::path out = root / "run";
  const fs::path stale = CheckpointTempPath(out, 4, "job-000001-1");
  fs::create_directories(stale);
  ASSERT_TRUE(WriteRankFile(stale / "rank_00001.safetensors", {{"wte.weight", Iota(Shape{2, 2})}},
                            {{"wte.weight", {{"logical_shape", {2, 2}}, {"offset", {0, 0}}}}})
                  .ok());
  const auto run = RunTessera(Nano(out));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  for (const int64_t iteration : {4, 8}) {
    const fs::path checkpoint = CheckpointPath(out, iteration);
    EXPECT_TRUE(fs::exists(checkpoint / "index.json")) << checkpoint;
    EXPECT_FALSE(fs::exists(checkpoint / "rank_00001.safetensors")) << "the killed run's file was committed";
  }
  for (const auto& entry : fs::directory_iterator(out / "checkpoints")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
  fs::remove_all(root);
}

// Mixed precision's bookkeeping (fp16's loss scale and counts) is no
// model state: a resume with fp16 turned off, or switched to bf16, is not
// refused as a smaller model.
TEST(CheckpointEndToEnd, AResumeMayChangeTheMixedPrecision) {
  const fs::path root = TempDir("amp_resume");
  auto run = RunTessera(Nano(root / "fp16", "train.amp.enabled=true train.amp.dtype=fp16 train.train_iter=4"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  for (const std::string amp : {"train.amp.enabled=false", "train.amp.enabled=true train.amp.dtype=bf16"}) {
    const fs::path out = root / "resumed";
    CopyCheckpoint(root / "fp16", 4, out);
    run = RunTessera(Nano(out, amp + " --resume"));
    EXPECT_EQ(run.exit_code, 0) << amp << ": " << run.out;
  }
  fs::remove_all(root);
}

TEST(CheckpointEndToEnd, KillDuringAWriteLeavesThePreviousCheckpointLoadable) {
  const fs::path root = TempDir("kill");
  const fs::path out = root / "run";
  // A model large enough that each checkpoint write takes a while; one per iteration.
  const std::string args = "train " + SourcePath("configs/gpt2_nano.json") +
                           " model.vocab_size=8192 model.hidden_size=256 train.train_iter=400 train.log_period=1"
                           " train.checkpointer.period=1 train.checkpointer.max_to_keep=2 train.output_dir=" +
                           out.string();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setpgid(0, 0);
    const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " > /dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill it while a checkpoint's temporary directory exists (a write in
  // progress), once at least one checkpoint is complete.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  bool killed_mid_write = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    bool complete = false, writing = false;
    if (fs::exists(out / "checkpoints", ec)) {
      for (const auto& entry : fs::directory_iterator(out / "checkpoints", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.starts_with("iter_")) complete = true;
        if (name.find(".tmp-") != std::string::npos) writing = true;
      }
    }
    if (complete && writing) {
      ::kill(-child, SIGKILL);
      killed_mid_write = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!killed_mid_write) ::kill(-child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(killed_mid_write) << "no checkpoint write was seen in 90 s";
  // Every complete checkpoint reads back whole, and a resume starts from the latest.
  auto latest = LatestCheckpoint(out);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  auto reader = CheckpointReader::Open(**latest);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto meta = (*reader)->Meta("wte.weight");
  ASSERT_TRUE(meta.ok()) << meta.status();
  Tensor wte = *Tensor::Zeros(meta->shape, meta->dtype);
  EXPECT_TRUE((*reader)->Read("wte.weight", TensorSlice::Whole(meta->shape), wte).ok());
  const int64_t iteration = (*reader)->iteration();
  auto run =
      RunTessera("train " + SourcePath("configs/gpt2_nano.json") +
                 " model.vocab_size=8192 model.hidden_size=256 train.log_period=1 train.output_dir=" + out.string() +
                 " train.train_iter=" + std::to_string(iteration + 1) + " --resume");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_TRUE(fs::exists(CheckpointPath(out, iteration + 1) / "index.json"));
  fs::remove_all(root);
}

// Ctrl-C (SIGINT), SIGTERM and SIGHUP (its terminal closed): the run
// finishes the iteration in flight, writes a checkpoint there, says where
// on one line and exits 128 + the signal; a resume from it continues the
// straight run's losses bit for bit.
TEST(CheckpointEndToEnd, SignalSavesACheckpointAndTheResumeContinuesExactly) {
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    const fs::path root = TempDir(signal == SIGINT ? "sigint" : signal == SIGTERM ? "sigterm" : "sighup");
    const fs::path out = root / "run";
    const fs::path log = root / "log.txt";
    // No periodic checkpoints: the one on disk afterwards is the signal's. A
    // constant learning rate: the runs below train fewer iterations with the
    // same rates.
    const std::string constant = " lr_scheduler._target_=ConstantLR train.warmup_ratio=0";
    // SIGTERM's round runs a pipeline with gradient accumulation: its
    // stages' Recv actors and Acc actors stop at the gate too.
    const std::string layout =
        signal != SIGTERM ? "" : " train.dist.pipeline_parallel_size=2 train.num_accumulation_steps=2";
    const std::string args = Nano(out, "train.train_iter=100000 train.checkpointer.period=null" + constant + layout);
    const pid_t child = ::tessera::testing::SpawnTessera(args, log);
    ASSERT_GE(child, 0);
    // Signal it once it has logged a few iterations.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (std::chrono::steady_clock::now() < deadline && Losses(out).size() < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(child, signal);
    // SIGTERM's round delivers it twice at once, as GNU timeout does (to
    // the process, then to its group): the same stop, not "again to stop
    // at once" (every timeout-wrapped run died without a checkpoint).
    if (signal == SIGTERM) ::kill(child, signal);
    int status = 0;
    ::waitpid(child, &status, 0);
    const std::string text = ReadFile(log);
    ASSERT_TRUE(WIFEXITED(status)) << text;
    EXPECT_EQ(WEXITSTATUS(status), 128 + signal) << text;
    const size_t at = text.find("interrupted at iteration ");
    ASSERT_NE(at, std::string::npos) << text;
    const int64_t iteration = std::stoll(text.substr(at + std::string("interrupted at iteration ").size()));
    EXPECT_NE(text.find(CheckpointPath(out, iteration).string()), std::string::npos) << text;
    // log.txt records a resumable stop, not a failure.
    const std::string log_txt = ReadFile(out / "log.txt");
    EXPECT_NE(log_txt.find("CANCELLED: worker local (node 0): CANCELLED: interrupted at iteration "), std::string::npos)
        << log_txt;
    EXPECT_EQ(log_txt.find("FAILED"), std::string::npos) << log_txt;
    auto latest = LatestCheckpoint(out);
    ASSERT_TRUE(latest.ok() && latest->has_value()) << text;
    EXPECT_EQ(**latest, CheckpointPath(out, iteration));
    ASSERT_GE(iteration, 3);
    ASSERT_LT(iteration, 100000);

    const std::string more =
        constant + layout + " train.checkpointer.period=null train.train_iter=" + std::to_string(iteration + 3);
    auto run = RunTessera(Nano(out, more + " --resume"));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    run = RunTessera(Nano(root / "straight", more));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const std::map<int64_t, double> resumed = Losses(out), straight = Losses(root / "straight");
    ASSERT_EQ(straight.size(), static_cast<size_t>(iteration + 3));
    for (int64_t it = iteration + 1; it <= iteration + 3; ++it) {
      ASSERT_TRUE(resumed.contains(it)) << "iteration " << it;
      EXPECT_EQ(resumed.at(it), straight.at(it)) << "iteration " << it;
    }
    fs::remove_all(root);
  }
}

// Started ignoring SIGHUP (`nohup tessera train ...`): a hangup does not
// stop the run, which trains on.
TEST(CheckpointEndToEnd, ARunStartedUnderNohupIgnoresTheHangup) {
  const fs::path root = TempDir("nohup");
  const fs::path out = root / "run";
  const fs::path log = root / "log.txt";
  void (*previous)(int) = ::signal(SIGHUP, SIG_IGN);  // inherited by the child
  const pid_t child = ::tessera::testing::SpawnTessera(Nano(out, "train.train_iter=100000"), log);
  ::signal(SIGHUP, previous);
  ASSERT_GE(child, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline && Losses(out).size() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(child, SIGHUP);
  const size_t logged = Losses(out).size();
  while (std::chrono::steady_clock::now() < deadline && Losses(out).size() < logged + 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(Losses(out).size(), logged + 3) << ReadFile(log);
  EXPECT_EQ(ReadFile(log).find("hung up"), std::string::npos) << ReadFile(log);
  ::kill(child, SIGINT);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << status << "\n" << ReadFile(log);
  fs::remove_all(root);
}

// A second signal (past the same-signal window) stops at once and says so
// on a line (it ended without a word), naming the checkpoint a resume
// takes. Iterations of a wider model take long enough, and the process is
// stopped between the two signals (once the first is taken), so the first
// one's graceful stop cannot finish before the second arrives.
TEST(CheckpointEndToEnd, ASecondSignalStopsAtOnceSayingSo) {
  const fs::path root = TempDir("second_signal");
  const fs::path log = root / "log.txt";
  const pid_t child = ::tessera::testing::SpawnTessera(
      Nano(root / "run",
           "train.train_iter=100000 train.checkpointer.period=1 train.checkpointer.max_to_keep=1 "
           "model.hidden_size=512 model.num_layers=6 model.ffn_hidden_size=2048"),
      log);
  ASSERT_GE(child, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline && !fs::exists(CheckpointPath(root / "run", 1) / "index.json")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(child, SIGINT);
  while (std::chrono::steady_clock::now() < deadline &&
         ReadFile(log).find("tessera: interrupted: stopping") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(child, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(child, SIGINT);
  ::kill(child, SIGCONT);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string text = ReadFile(log);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status << "\n" << text;
  constexpr std::string_view kSaid = "\ntessera: stopped at once: no further checkpoint is written (the latest: ";
  const size_t said = text.find(kSaid);
  ASSERT_NE(said, std::string::npos) << text;
  const size_t end = text.find(")\n", said);
  ASSERT_NE(end, std::string::npos) << text;
  const std::string latest = text.substr(said + kSaid.size(), end - said - kSaid.size());
  EXPECT_TRUE(latest.starts_with((root / "run" / "checkpoints" / "iter_").string())) << latest;
  EXPECT_TRUE(fs::exists(fs::path(latest) / "index.json")) << latest;
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera
