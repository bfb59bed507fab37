#pragma once
// Tessera's job configuration (DESIGN.md §10; user reference: docs/config.md).
//
// A config is a JSON object read from a file that may contain comments and may
// inherit from other files through "_base_"; `key.sub=value` overrides from the
// command line are applied on top, checked against the keys and types that the
// files define. The result is a plain nlohmann::json that the rest of the
// engine reads with the typed accessors below.
//
// All functions are free functions without shared state: they are safe to call
// from any thread on distinct json objects. None of them throws; every error is
// an absl::Status with a one-line message naming the file and/or key path.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::config {

// Key of the list of files a config inherits from (a string or an array of
// strings, relative to the directory of the file that names them).
inline constexpr std::string_view kBaseKey = "_base_";
// An object holding `"_free_form_": true` accepts overrides that create new
// keys anywhere below it (e.g. a model's extra keyword arguments).
inline constexpr std::string_view kFreeFormKey = "_free_form_";
// Names the registry entry that builds the object described by a node.
inline constexpr std::string_view kTargetKey = "_target_";

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

// Splits `text` at its first '='. Fails on a missing '=', an empty key or an
// empty path segment ("a..b=1", ".a=1", "a.=1").
[[nodiscard]] absl::StatusOr<Override> ParseOverride(std::string_view text);

// Parses and applies `overrides` to `config` in order (a later one wins).
// Each key must name an existing entry unless it lies below a free-form
// object; the new value must have the existing value's JSON type, except that
// an integer may replace a number (stored as a float), an integral float may
// replace an integer (stored as an integer), an existing null accepts
// anything, and anything may be set to null. A string entry also takes the
// raw text of a value that parsed as a number or bool (`name=2024` sets
// "2024"). An object value is merged key by key with the same checks. Either
// every override is applied or, on error, `config` is left unchanged.
[[nodiscard]] absl::Status ApplyOverrides(nlohmann::json& config,
                                          const std::vector<std::string>& overrides);

// Reads the config at `path`, resolving "_base_" recursively: the bases are
// deep-merged in list order, then the file itself on top (objects merge key
// by key, any other value replaces), and "_base_" is dropped. Then applies
// `overrides` as ApplyOverrides does. Errors name the file (with line and
// column for JSON syntax errors), the include chain for a cycle, and the
// including file for a missing base.
[[nodiscard]] absl::StatusOr<nlohmann::json> LoadConfig(
    const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

// Writes `config` as indented JSON to `path` through a temporary file
// (`path.tmp.<pid>`) that is synced and then renamed over `path`, so a crash
// leaves either the old file or the complete new one. The parent directory
// must exist.
[[nodiscard]] absl::Status SaveConfig(const nlohmann::json& config,
                                      const std::filesystem::path& path);

// Merges `overlay` into `base`: objects key by key, recursively; any other
// overlay value (null included) replaces what `base` had.
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
