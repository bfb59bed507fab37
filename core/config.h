#pragma once
// Tessera's job configuration (DESIGN.md §10; user reference: docs/config.md).
//
// A config is a JSON object read from a file that may contain comments and may
// inherit from other files through "_base_"; `key.sub=value` overrides from the
// command line are applied on top. Everything is checked against a schema
// (core/schema.h) that declares every key once, and the result is the
// complete config: defaults filled in, types normalised.
//
// All functions are free functions without shared state: they are safe to call
// from any thread on distinct json objects. None of them throws; every error is
// an absl::Status with a one-line message naming the key path and the file or
// override it came from.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/schema.h"

namespace tessera::config {

// Key of the list of files a config inherits from (a string or an array of
// strings, relative to the directory of the file that names them).
inline constexpr std::string_view kBaseKey = "_base_";
// Names the registry entry that builds the object described by a node.
inline constexpr std::string_view kTargetKey = "_target_";

// Limits on what a config may be, so that no file or override can make the
// loader run out of stack, memory or time.
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{16} << 20;
inline constexpr int kMaxNestingDepth = 32;      // objects / arrays inside one another
inline constexpr int kMaxBaseDepth = 16;         // a _base_ of a _base_ of ...
inline constexpr int kMaxConfigFiles = 64;       // files read for one config, repeats counted

// One parsed command-line override `key=value`.
struct Override {
  std::string text;       // The override as the user wrote it, for messages.
  std::string key;        // Dotted path, e.g. "train.dist.tensor_parallel_size".
  std::string raw_value;  // Everything after the first '='.
  // raw_value parsed as JSON, or raw_value as a JSON string when it does not
  // parse: `2` is a number, `true` a bool, `[1,2]` an array, `hello` and
  // `"2"` strings.
  nlohmann::json value;
};

// Splits `text` at its first '='. Fails on a missing '=', an empty key, an
// empty path segment ("a..b=1", ".a=1", "a.=1"), text that is not valid
// UTF-8, or a value nested deeper than kMaxNestingDepth.
[[nodiscard]] absl::StatusOr<Override> ParseOverride(std::string_view text);

// Applies `overrides` to `config` in order (a later one wins). Each key must
// be declared by `schema` (an unknown one is an error with a "did you mean");
// a string key takes the raw text of a value that parsed as a number or bool
// (`name=2024` sets "2024"); an object value merges key by key; setting a
// section's "_target_" to another target drops the keys the old target had
// ("_target_" overrides are applied before the others, so their place on
// the command line does not matter).
// Types and ranges are checked by Resolve, which names the override. Records
// in `origins` (if given) that each path set came from its override. Either
// every override is applied or, on error, `config` is left unchanged.
[[nodiscard]] absl::Status ApplyOverrides(nlohmann::json& config, const std::vector<std::string>& overrides,
                                          const Section& schema, Origins* origins = nullptr);

// Reads the config file at `path`, resolving "_base_" recursively: the bases
// are deep-merged in list order, then the file itself on top (see DeepMerge),
// and "_base_" is dropped. Records in `origins` (if given) which file set each
// path. Errors name the file (with line and column for JSON syntax errors),
// the include chain for a cycle, and the including file for a missing base.
[[nodiscard]] absl::StatusOr<nlohmann::json> LoadConfigFiles(const std::filesystem::path& path,
                                                             Origins* origins = nullptr);

// LoadConfigFiles, then ApplyOverrides, then Resolve against `schema`: the
// complete, checked config. Every error names the file or override that set
// the offending key.
[[nodiscard]] absl::StatusOr<nlohmann::json> LoadConfig(const std::filesystem::path& path,
                                                        const std::vector<std::string>& overrides,
                                                        const Section& schema);

// Writes `config` as indented JSON to `path` through a temporary file
// (`path.tmp.<pid>`) that is synced and then renamed over `path`, so a crash
// leaves either the old file or the complete new one. The parent directory
// must exist.
[[nodiscard]] absl::Status SaveConfig(const nlohmann::json& config,
                                      const std::filesystem::path& path);

// Merges `overlay` into `base`: objects key by key, recursively; any other
// overlay value (null included) replaces what `base` had. An object whose
// "_target_" differs from the one it merges into replaces it whole (the old
// target's arguments mean nothing to the new one).
void DeepMerge(nlohmann::json& base, const nlohmann::json& overlay);

// The node at `dotted_path` ("train.dist"), borrowed from `config`, which
// must outlive its use. NotFound (with a "did you mean") if absent.
[[nodiscard]] absl::StatusOr<const nlohmann::json*> GetNode(const nlohmann::json& config,
                                                            std::string_view dotted_path);

// Typed reads of a leaf. NotFound if the key is missing; InvalidArgument
// naming the path and the expected type on a type mismatch (null included:
// read optional keys with GetNode and check is_null()). GetInt also accepts
// an integral float (1e5); GetDouble accepts any number.
[[nodiscard]] absl::StatusOr<int64_t> GetInt(const nlohmann::json& config,
                                             std::string_view dotted_path);
[[nodiscard]] absl::StatusOr<double> GetDouble(const nlohmann::json& config,
                                               std::string_view dotted_path);
[[nodiscard]] absl::StatusOr<bool> GetBool(const nlohmann::json& config,
                                           std::string_view dotted_path);
[[nodiscard]] absl::StatusOr<std::string> GetString(const nlohmann::json& config,
                                                    std::string_view dotted_path);

}  // namespace tessera::config
