#include "core/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera::config {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Debian's Abseil is built with its own absl::string_view, which does not
// convert from std::string_view; the public API uses the standard one.
absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

// Messages quote values that may come from the command line; a long array
// would otherwise swamp the one-line error.
constexpr std::size_t kMaxQuotedValueChars = 80;

std::string TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return value.type_name();
  }
}

std::string WithArticle(const std::string& type_name) {
  if (type_name == "null") return type_name;
  const bool vowel = type_name[0] == 'a' || type_name[0] == 'i' || type_name[0] == 'o';
  return absl::StrCat(vowel ? "an " : "a ", type_name);
}

std::string Quote(const Json& value) {
  // The replace handler keeps a stray invalid UTF-8 byte from a command line
  // from turning an error message into an exception.
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuotedValueChars) {
    text.resize(kMaxQuotedValueChars);
    text += "...";
  }
  return text;
}

// `number` as an int64 if it is integral and in range (2.0, 1e5), else nullopt.
std::optional<int64_t> AsIntegral(double number) {
  // 2^63 is exactly representable; anything at or beyond it would overflow.
  constexpr double kTwoToThe63 = 9223372036854775808.0;
  if (std::trunc(number) != number || number < -kTwoToThe63 || number >= kTwoToThe63) {
    return std::nullopt;
  }
  return static_cast<int64_t>(number);
}

// "string \"abc\"", "integer 3", or just "null".
std::string Describe(const Json& value) {
  return value.is_null() ? "null" : absl::StrCat(TypeName(value), " ", Quote(value));
}

bool IsFreeForm(const Json& node) {
  if (!node.is_object()) return false;
  const auto it = node.find(kFreeFormKey);
  return it != node.end() && it->is_boolean() && it->get<bool>();
}

// Every dotted key path in `node` (objects and leaves, not array elements),
// the candidates for "did you mean".
void CollectPaths(const Json& node, const std::string& prefix, std::vector<std::string>& paths) {
  if (!node.is_object()) return;
  for (const auto& [key, child] : node.items()) {
    if (key == kFreeFormKey) continue;
    std::string path = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    CollectPaths(child, path, paths);
    paths.push_back(std::move(path));
  }
}

std::string DidYouMean(const Json& root, std::string_view dotted_path) {
  std::vector<std::string> paths;
  CollectPaths(root, "", paths);
  const std::optional<std::string> closest = ClosestMatch(dotted_path, paths);
  return closest ? absl::StrCat("; did you mean '", *closest, "'?") : "";
}

absl::StatusOr<std::vector<std::string>> SplitKey(std::string_view dotted_path) {
  if (dotted_path.empty()) return absl::InvalidArgumentError("empty config key");
  std::vector<std::string> segments = absl::StrSplit(AbslView(dotted_path), '.');
  for (const std::string& segment : segments) {
    if (segment.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty path segment in config key '", AbslView(dotted_path), "'"));
    }
  }
  return segments;
}

// ---------------------------------------------------------------- overrides

// Applies one override; `root` is the whole config, used for hints.
class OverrideApplier {
 public:
  OverrideApplier(Json& root, const Override& override_entry)
      : root_(root), override_(override_entry) {}

  absl::Status Apply(const std::vector<std::string>& segments) {
    Json* node = &root_;
    bool free_form = IsFreeForm(root_);
    std::string path;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
      path = path.empty() ? segments[i] : absl::StrCat(path, ".", segments[i]);
      auto it = node->find(segments[i]);
      if (it == node->end()) {
        if (!free_form) return UnknownKey(override_.key);
        node = &((*node)[segments[i]] = Json::object());
      } else if (!it->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config key '", path, "' is ", WithArticle(TypeName(*it)), ", not an object, so '",
            override_.key, "' cannot be set", FromOverride()));
      } else {
        node = &*it;
      }
      free_form = free_form || IsFreeForm(*node);
    }
    const std::string& leaf = segments.back();
    auto it = node->find(leaf);
    if (it == node->end()) {
      if (!free_form) return UnknownKey(override_.key);
      (*node)[leaf] = override_.value;
      return absl::OkStatus();
    }
    return Assign(*it, override_.key, override_.value, free_form, /*top_level=*/true);
  }

 private:
  // Sets `slot` (the existing value at `path`) to `value` under the type rules
  // documented on ApplyOverrides; objects merge with per-leaf checks.
  absl::Status Assign(Json& slot, const std::string& path, const Json& value, bool free_form,
                      bool top_level) {
    if (value.is_null() || slot.is_null()) {
      slot = value;
      return absl::OkStatus();
    }
    switch (slot.type()) {
      case Json::value_t::object: {
        if (!value.is_object()) return TypeMismatch(path, slot, value);
        const bool children_free = free_form || IsFreeForm(slot);
        for (const auto& [key, child_value] : value.items()) {
          const std::string child_path = absl::StrCat(path, ".", key);
          auto child = slot.find(key);
          if (child == slot.end()) {
            if (!children_free) return UnknownKey(child_path);
            slot[key] = child_value;
            continue;
          }
          RETURN_IF_ERROR(Assign(*child, child_path, child_value, children_free, false));
        }
        return absl::OkStatus();
      }
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        if (value.is_number_integer()) {
          slot = value;
          return absl::OkStatus();
        }
        if (value.is_number_float()) {
          // 2.0 is an integer written loosely; 2.5 is a mistake.
          if (const std::optional<int64_t> integral = AsIntegral(value.get<double>())) {
            slot = *integral;
            return absl::OkStatus();
          }
        }
        return TypeMismatch(path, slot, value);
      case Json::value_t::number_float:
        if (!value.is_number()) return TypeMismatch(path, slot, value);
        // Stored as a float so a saved config keeps the key's type.
        slot = value.get<double>();
        return absl::OkStatus();
      case Json::value_t::string:
        if (value.is_string()) {
          slot = value;
          return absl::OkStatus();
        }
        // `name=2024` on a string key means the text, not a type error; only
        // for the override's own raw text, not leaves inside an object value.
        if (top_level && (value.is_number() || value.is_boolean())) {
          slot = override_.raw_value;
          return absl::OkStatus();
        }
        return TypeMismatch(path, slot, value);
      default:
        if (slot.type() != value.type()) return TypeMismatch(path, slot, value);
        slot = value;
        return absl::OkStatus();
    }
  }

  std::string FromOverride() const {
    return absl::StrCat(" (from override '", override_.text, "')");
  }

  absl::Status UnknownKey(const std::string& path) const {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown config key '", path, "'", FromOverride(), DidYouMean(root_, path)));
  }

  absl::Status TypeMismatch(const std::string& path, const Json& expected, const Json& got) const {
    const std::string expected_type =
        expected.is_number_float() ? "a number" : WithArticle(TypeName(expected));
    return absl::InvalidArgumentError(absl::StrCat("config key '", path, "' expects ",
                                                   expected_type, ", got ", Describe(got),
                                                   FromOverride()));
  }

  Json& root_;
  const Override& override_;
};

// ------------------------------------------------------------------ loading

// "file:line:column" for the byte offset nlohmann reports, which counts the
// offending character itself. nlohmann's own line/column is off by one line
// when the error is detected at a newline.
std::string Location(const fs::path& path, const std::string& contents, std::size_t byte) {
  const std::size_t index = std::min(byte > 0 ? byte - 1 : 0, contents.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < index; ++i) {
    if (contents[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::StrCat(path.string(), ":", line, ":", index - line_start + 1);
}

// The reason part of a nlohmann parse error, without its id and position.
std::string ParseErrorReason(const std::string& what) {
  std::string reason = what;
  const std::size_t column = what.find("column ");
  if (column != std::string::npos) {
    const std::size_t colon = what.find(": ", column);
    if (colon != std::string::npos) reason = what.substr(colon + 2);
  }
  for (char& c : reason) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return reason;
}

absl::StatusOr<Json> ReadJsonFile(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat("config file '", path.string(), "' not found"));
  }
  if (!fs::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config path '", path.string(), "' is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string contents{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in.good() && !in.eof()) {
    return absl::UnavailableError(absl::StrCat("cannot read config file '", path.string(), "'"));
  }
  Json config;
  try {
    config = Json::parse(contents, /*cb=*/nullptr, /*allow_exceptions=*/true,
                         /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        Location(path, contents, e.byte), ": JSON syntax error: ", ParseErrorReason(e.what())));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": invalid JSON: ", ParseErrorReason(e.what())));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(),
                                                   "' must hold a JSON object, not ",
                                                   WithArticle(TypeName(config))));
  }
  return config;
}

// One file on the current "_base_" chain, for cycle detection and messages.
struct ChainEntry {
  fs::path canonical;
  std::string display;
};

fs::path Canonical(const fs::path& path) {
  std::error_code error;
  fs::path canonical = fs::weakly_canonical(path, error);
  return error ? fs::absolute(path, error).lexically_normal() : canonical;
}

absl::StatusOr<std::vector<std::string>> BaseList(const Json& config, const fs::path& path) {
  const auto it = config.find(kBaseKey);
  if (it == config.end()) return std::vector<std::string>{};
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(),
                                                   "': ", AbslView(kBaseKey),
                                                   " must be a non-empty string or an array of "
                                                   "non-empty strings, got ",
                                                   Quote(*it)));
  };
  std::vector<std::string> bases;
  if (it->is_string()) {
    bases.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const Json& entry : *it) {
      if (!entry.is_string()) return bad();
      bases.push_back(entry.get<std::string>());
    }
  } else {
    return bad();
  }
  for (const std::string& base : bases) {
    if (base.empty()) return bad();
  }
  return bases;
}

// Loads `path` (already on `chain`) with its bases merged in.
absl::StatusOr<Json> LoadWithBases(const fs::path& path, std::vector<ChainEntry>& chain) {
  ASSIGN_OR_RETURN(Json self, ReadJsonFile(path));
  ASSIGN_OR_RETURN(const std::vector<std::string> bases, BaseList(self, path));
  Json merged = Json::object();
  for (const std::string& base : bases) {
    const fs::path resolved = (path.parent_path() / base).lexically_normal();
    std::error_code error;
    if (!fs::exists(resolved, error)) {
      const std::string looked_for =
          resolved.string() == base ? "" : absl::StrCat(" (looked for '", resolved.string(), "')");
      return absl::NotFoundError(absl::StrCat("config file '", path.string(), "' names base '",
                                              base, "', which does not exist", looked_for));
    }
    ChainEntry entry{Canonical(resolved), resolved.string()};
    for (const ChainEntry& ancestor : chain) {
      if (ancestor.canonical != entry.canonical) continue;
      std::vector<std::string> names;
      for (const ChainEntry& link : chain) names.push_back(link.display);
      names.push_back(entry.display);
      return absl::InvalidArgumentError(
          absl::StrCat("config ", AbslView(kBaseKey), " cycle: ", absl::StrJoin(names, " -> ")));
    }
    chain.push_back(std::move(entry));
    absl::StatusOr<Json> base_config = LoadWithBases(resolved, chain);
    chain.pop_back();
    if (!base_config.ok()) return base_config.status();
    DeepMerge(merged, *base_config);
  }
  self.erase(std::string(kBaseKey));
  DeepMerge(merged, self);
  return merged;
}

absl::Status ExpectedType(std::string_view dotted_path, std::string_view expected,
                          const Json& got) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", AbslView(dotted_path),
                                                 "' expects ", AbslView(expected), ", got ",
                                                 Describe(got)));
}

}  // namespace

absl::StatusOr<Override> ParseOverride(std::string_view text) {
  const std::size_t equals = text.find('=');
  if (equals == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed override '", AbslView(text), "': expected key=value"));
  }
  Override result;
  result.text = std::string(text);
  result.key = std::string(text.substr(0, equals));
  result.raw_value = std::string(text.substr(equals + 1));
  if (result.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed override '", AbslView(text), "': empty key"));
  }
  if (!SplitKey(result.key).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed override '", AbslView(text), "': empty path segment in key '", result.key, "'"));
  }
  result.value = Json::parse(result.raw_value, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (result.value.is_discarded()) result.value = result.raw_value;
  return result;
}

absl::Status ApplyOverrides(Json& config, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return absl::OkStatus();
  // Work on a copy so a failing override leaves the caller's config intact.
  Json updated = config;
  for (const std::string& text : overrides) {
    ASSIGN_OR_RETURN(const Override parsed, ParseOverride(text));
    ASSIGN_OR_RETURN(const std::vector<std::string> segments, SplitKey(parsed.key));
    if (!updated.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot apply override '", text, "': the config is not an object"));
    }
    RETURN_IF_ERROR(OverrideApplier(updated, parsed).Apply(segments));
  }
  config = std::move(updated);
  return absl::OkStatus();
}

absl::StatusOr<Json> LoadConfig(const fs::path& path, const std::vector<std::string>& overrides) {
  std::vector<ChainEntry> chain = {{Canonical(path), path.string()}};
  ASSIGN_OR_RETURN(Json config, LoadWithBases(path, chain));
  RETURN_IF_ERROR(ApplyOverrides(config, overrides));
  return config;
}

absl::Status SaveConfig(const Json& config, const fs::path& path) {
  std::string text;
  try {
    text = config.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write config '", path.string(), "': ", e.what()));
  }
  fs::path temp_path = path;
  temp_path += absl::StrCat(".tmp.", ::getpid());
  // Reads errno first: the cleanup and message building may change it.
  const auto fail = [&](const char* step) {
    const int error_number = errno;
    ::unlink(temp_path.c_str());
    return absl::ErrnoToStatus(
        error_number, absl::StrCat("cannot write config '", path.string(), "' (", step, " '",
                                   temp_path.string(), "')"));
  };
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open");
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = fail("write");
      ::close(fd);
      return status;
    }
    written += static_cast<std::size_t>(n);
  }
  // Without the fsync a crash after the rename can leave an empty file under
  // the final name on some filesystems.
  if (::fsync(fd) != 0) {
    absl::Status status = fail("fsync");
    ::close(fd);
    return status;
  }
  if (::close(fd) != 0) return fail("close");
  if (::rename(temp_path.c_str(), path.c_str()) != 0) return fail("rename");
  return absl::OkStatus();
}

void DeepMerge(Json& base, const Json& overlay) {
  if (!base.is_object() || !overlay.is_object()) {
    base = overlay;
    return;
  }
  for (const auto& [key, value] : overlay.items()) {
    auto it = base.find(key);
    if (it == base.end()) {
      base[key] = value;
    } else {
      DeepMerge(*it, value);
    }
  }
}

absl::StatusOr<const Json*> GetNode(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const std::vector<std::string> segments, SplitKey(dotted_path));
  const Json* node = &config;
  std::string path;
  for (const std::string& segment : segments) {
    if (!node->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key '", path, "' is ", WithArticle(TypeName(*node)),
                       ", not an object, so it has no key '", AbslView(dotted_path), "'"));
    }
    path = path.empty() ? segment : absl::StrCat(path, ".", segment);
    const auto it = node->find(segment);
    if (it == node->end()) {
      return absl::NotFoundError(absl::StrCat("config key '", AbslView(dotted_path), "' not found",
                                              DidYouMean(config, dotted_path)));
    }
    node = &*it;
  }
  return node;
}

absl::StatusOr<int64_t> GetInt(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const Json* node, GetNode(config, dotted_path));
  if (node->is_number_unsigned()) {
    if (node->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return ExpectedType(dotted_path, "a 64-bit signed integer", *node);
    }
    return static_cast<int64_t>(node->get<uint64_t>());
  }
  if (node->is_number_integer()) return node->get<int64_t>();
  if (node->is_number_float()) {
    // LiBai-style configs write counts like 1e5.
    if (const std::optional<int64_t> integral = AsIntegral(node->get<double>())) return *integral;
  }
  return ExpectedType(dotted_path, "an integer", *node);
}

absl::StatusOr<double> GetDouble(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const Json* node, GetNode(config, dotted_path));
  if (!node->is_number()) return ExpectedType(dotted_path, "a number", *node);
  return node->get<double>();
}

absl::StatusOr<bool> GetBool(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const Json* node, GetNode(config, dotted_path));
  if (!node->is_boolean()) return ExpectedType(dotted_path, "a boolean", *node);
  return node->get<bool>();
}

absl::StatusOr<std::string> GetString(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const Json* node, GetNode(config, dotted_path));
  if (!node->is_string()) return ExpectedType(dotted_path, "a string", *node);
  return node->get<std::string>();
}

}  // namespace tessera::config
