// embed_engine: a C++ program that trains a model in its own process with
// tessera::Engine, no master or worker involved.
//
//   embed_engine --iterations 20 --devices 2
//
// The model is a nano GPT-2 (the one of configs/gpt2_nano.json, without
// dropout) built in code; it learns the synthetic Markov chain its FillBatch
// generates. The program compiles its graph once, then runs the iterations
// through the actor runtime, feeding the batches and the learning rate and
// printing what the engine fetches each iteration: the loss and, because the
// optimizer clips gradients, their global norm.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "models/gpt2.h"
#include "train/engine.h"

namespace {

// One line on stderr, whatever the message holds; the exit code of a failure.
int Fail(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "embed_engine: %s\n", message.c_str());
  return 1;
}

absl::Status Train(int64_t iterations, int64_t batch, double lr, int64_t devices) {
  // The model, in global view: nothing here says how many devices run it.
  tessera::models::Gpt2Config config;
  config.vocab_size = 256;
  config.hidden_size = 64;
  config.num_layers = 2;
  config.num_attention_heads = 4;
  config.max_seq_length = 32;
  RETURN_IF_ERROR(tessera::models::Gpt2::Validate(config));
  const tessera::models::Gpt2 model(config);

  // The graph is built for the whole batch of an iteration; the engine cuts
  // it into one shard per data-parallel device.
  ASSIGN_OR_RETURN(tessera::graph::Graph graph, model.BuildGraph(batch));

  tessera::CompileOptions options;
  options.optimizer.kind = tessera::graph::OptimizerKind::kAdamW;
  options.optimizer.weight_decay = 0.01;
  options.optimizer.clip_grad_max_norm = 1.0;  // also makes "grad_norm" a fetch
  options.lower.parallel.data = devices;       // virtual CPU devices, data-parallel
  options.lower.parallel.world_size = devices;
  ASSIGN_OR_RETURN(std::unique_ptr<tessera::Engine> engine, tessera::Engine::Compile(std::move(graph), options));

  // Called on the devices' threads for every graph input of every
  // iteration: the model's token batches, and the learning rate (constant
  // here; a schedule would compute it from `iteration`).
  const std::string lr_input = options.optimizer.lr_input_name;
  const auto feed = [&](int64_t iteration, int64_t /*micro_batch*/, std::string_view input,
                        const tessera::Tensor& out) -> absl::Status {
    if (input == lr_input) {
      tessera::Tensor value = out;
      return value.CopyFrom(tessera::Tensor::FromVector(tessera::Shape{}, std::vector<float>{static_cast<float>(lr)}));
    }
    return model.FillBatch(iteration, input, out);
  };
  // Called once per iteration, in order; the tensors live only during the
  // call. An error returned here stops the run and is what Run returns.
  const auto fetch = [&](int64_t iteration, const std::map<std::string, tessera::Tensor>& values) -> absl::Status {
    const float loss = values.at("loss").ToVector<float>().at(0);
    const float grad_norm = values.at("grad_norm").ToVector<float>().at(0);
    std::printf("iter %lld  loss %.6f  grad_norm %.4f\n", static_cast<long long>(iteration + 1), loss, grad_norm);
    std::fflush(stdout);
    if (!std::isfinite(loss)) return absl::InternalError(absl::StrCat("loss is ", loss, " at iteration ", iteration + 1));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(engine->Run(iterations, feed, fetch));
  std::printf("trained %lld iterations on %lld device(s)\n", static_cast<long long>(iterations),
              static_cast<long long>(devices));
  return absl::OkStatus();
}

// Integers as tessera takes them: decimal digits only, leading zeros
// decimal too (CLI11 alone read "0x2" as 2 and "010" as 8).
const CLI::Validator kDecimal(
    [](std::string& text) {
      const bool digits =
          !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits) return "'" + text + "' is not a decimal integer";
      text.erase(0, std::min(text.find_first_not_of('0'), text.size() - 1));  // "010" is 10
      return std::string();
    },
    "");

// A learning rate in (0, 1], said as typed when it is not one (1e-400 read
// as 0, NaN past CLI::Range).
const CLI::Validator kLearningRate(
    [](std::string& text) {
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
      return value > 0 && value <= 1 ? std::string() : text + " is not in (0, 1]";
    },
    "in (0, 1]");

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a nano GPT-2 in this process with tessera::Engine and print its loss per iteration."};
  int64_t iterations = 20;
  int64_t batch = 16;
  double lr = 3e-3;
  int64_t devices = 1;
  std::string log_level = "warn";
  app.add_option("--iterations", iterations, "Training iterations")
      ->check(kDecimal)
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", batch, "Sequences per iteration, all devices together (a multiple of --devices)")
      ->check(kDecimal)
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--lr", lr, "AdamW learning rate")->check(kLearningRate)->capture_default_str();
  app.add_option("--devices", devices, "Virtual CPU devices to spread the batch over (data parallel)")
      ->check(kDecimal)
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "Tessera's log lines on stderr: info shows compile and plan timings")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(absl::StrCat(e.what(), " (see --help)"));
  }
  // Without this, spdlog's default logger writes info lines to stdout.
  if (absl::Status level = tessera::SetLogLevel(log_level); !level.ok()) return Fail(std::string(level.message()));
  // Each device takes an equal share of the batch.
  if (batch % devices != 0) return Fail(absl::StrCat("--batch ", batch, " is not a multiple of --devices ", devices));
  if (absl::Status trained = Train(iterations, batch, lr, devices); !trained.ok()) {
    return Fail(std::string(trained.message()));
  }
  return 0;
}
