#include "core/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/json_text.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera::config {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Debian's Abseil is built with its own absl::string_view, which does not
// convert from std::string_view; the public API uses the standard one.
absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

// Every dotted key path in `node` (objects and leaves, not array elements),
// the candidates for GetNode's "did you mean".
void CollectPaths(const Json& node, const std::string& prefix, std::vector<std::string>& paths) {
  if (!node.is_object()) return;
  for (const auto& [key, child] : node.items()) {
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

std::string JoinPath(const std::string& path, std::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", AbslView(name));
}

// Drops the recorded origins of everything below `path`.
void EraseOriginsBelow(Origins& origins, const std::string& path) {
  const std::string prefix = path.empty() ? "" : path + ".";
  for (auto it = origins.lower_bound(prefix); it != origins.end() && it->first.starts_with(prefix);) {
    if (it->first == path) {
      ++it;
      continue;
    }
    it = origins.erase(it);
  }
}

// Records `origin` for `path` and every path inside `value`.
void RecordOrigins(const Json& value, const std::string& path, const std::string& origin, Origins& origins) {
  origins[path] = origin;
  if (!value.is_object()) return;
  for (const auto& [key, child] : value.items()) RecordOrigins(child, JoinPath(path, key), origin, origins);
}

bool TargetChanges(const Json& base, const Json& overlay) {
  const auto b = base.find(kTargetKey), o = overlay.find(kTargetKey);
  return b != base.end() && o != overlay.end() && *b != *o;
}

// DeepMerge that also records where each merged path came from.
void MergeInto(Json& base, const Json& overlay, const std::string& path, const std::string& origin, Origins* origins) {
  if (!base.is_object() || !overlay.is_object() || TargetChanges(base, overlay)) {
    base = overlay;
    if (origins != nullptr) {
      EraseOriginsBelow(*origins, path);
      RecordOrigins(overlay, path, origin, *origins);
    }
    return;
  }
  if (origins != nullptr && !path.empty()) (*origins)[path] = origin;
  for (const auto& [key, value] : overlay.items()) {
    const std::string child_path = JoinPath(path, key);
    auto it = base.find(key);
    if (it == base.end()) {
      base[key] = value;
      if (origins != nullptr) {
        EraseOriginsBelow(*origins, child_path);
        RecordOrigins(value, child_path, origin, *origins);
      }
    } else {
      MergeInto(*it, value, child_path, origin, origins);
    }
  }
}

// Parses JSON text (comments allowed) with the nesting limit; `deep` is set
// when the text nests deeper than kMaxNestingDepth (the deep parts are then
// discarded, so the result stays small). `duplicate` gets the dotted path of
// the first key an object holds twice (nlohmann keeps the last silently;
// a config saying train_iter twice is a mistake either way), else "".
Json ParseLimited(const std::string& text, bool allow_exceptions, bool* deep, std::string* duplicate) {
  *deep = false;
  duplicate->clear();
  // Per open object: its dotted path, the keys seen, the last key.
  struct Open {
    std::string path;
    std::set<std::string> keys;
    std::string last;
  };
  std::vector<Open> open;
  const Json::parser_callback_t limit = [deep, duplicate, &open](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxNestingDepth) {
      *deep = true;
      return false;
    }
    if (event == Json::parse_event_t::object_start) {
      open.push_back({open.empty() ? std::string() : JoinPath(open.back().path, open.back().last), {}, {}});
    } else if (event == Json::parse_event_t::object_end && !open.empty()) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key && !open.empty() && parsed.is_string()) {
      Open& object = open.back();
      object.last = parsed.get<std::string>();
      if (!object.keys.insert(object.last).second && duplicate->empty()) {
        *duplicate = JoinPath(object.path, object.last);
      }
    }
    return true;
  };
  return Json::parse(text, limit, allow_exceptions, /*ignore_comments=*/true);
}

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

// Where the number a nlohmann out-of-range error quotes ("number overflow
// parsing '1e400'") stands in `contents`: that error carries no position,
// so the first place the quoted text stands as a whole token (not inside a
// longer number or a string's letters) is taken; the path alone when the
// error quotes nothing or the text is not found.
std::string NumberLocation(const fs::path& path, const std::string& contents, const std::string& what) {
  const std::size_t open = what.find('\'');
  const std::size_t close = what.rfind('\'');
  if (open == std::string::npos || close <= open + 1) return path.string();
  const std::string number = what.substr(open + 1, close - open - 1);
  const auto part_of_number = [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  };
  for (std::size_t at = contents.find(number); at != std::string::npos; at = contents.find(number, at + 1)) {
    const std::size_t end = at + number.size();
    if ((at == 0 || !part_of_number(contents[at - 1])) && (end == contents.size() || !part_of_number(contents[end]))) {
      return Location(path, contents, at + 1);
    }
  }
  return path.string();
}

// The reason part of a nlohmann parse error, without its id and position.
std::string ParseErrorReason(const std::string& what) {
  std::string reason = what;
  const std::size_t column = what.find("column ");
  if (column != std::string::npos) {
    const std::size_t colon = what.find(": ", column);
    if (colon != std::string::npos) reason = what.substr(colon + 2);
  }
  // "[json.exception.out_of_range.406] number overflow ...": the reason.
  if (reason.starts_with("[json.exception.")) {
    if (const std::size_t end = reason.find("] "); end != std::string::npos) reason.erase(0, end + 2);
  }
  for (char& c : reason) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  // The parser quotes the text it stopped at, which may hold bytes that are
  // not text (an ill-formed UTF-8 byte): escaped, one printable line.
  return EscapeControlChars(reason, /*non_ascii=*/true);
}

absl::StatusOr<Json> ReadJsonFile(const fs::path& path, std::string* text = nullptr) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    // (An error other than "no such file": a symlink loop, a permission.)
    if (error && error != std::errc::no_such_file_or_directory) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", EscapeControlChars(path.string()), "' cannot be read: ", error.message()));
    }
    // (An override given first: `tessera train key=value CONFIG`.)
    const bool override_first = path.string().find('=') != std::string::npos;
    return absl::NotFoundError(
        absl::StrCat("config file '", EscapeControlChars(path.string()), "' not found",
                     override_first ? " (the config file comes first, then its key=value overrides)" : ""));
  }
  if (!fs::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config path '", path.string(), "' is not a regular file"));
  }
  const std::uintmax_t size = fs::file_size(path, error);
  if (!error && size > kMaxConfigFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(), "' is ", size,
                                                   " bytes; configs are limited to ", kMaxConfigFileBytes));
  }
  // (Read with the reason of a failure; the file may grow while it is read.)
  absl::StatusOr<std::string> read = ReadWholeFile(path, kMaxConfigFileBytes);
  if (!read.ok()) {
    const std::string message(read.status().message());
    if (message.find(": more than the ") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path.string(), "' is larger than ", kMaxConfigFileBytes, " bytes"));
    }
    // ReadWholeFile's "PATH: cannot read: REASON", as "config file 'PATH'".
    const std::string prefix = path.string() + ": ";
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", path.string(), "': ", message.starts_with(prefix) ? message.substr(prefix.size()) : message));
  }
  std::string contents = *std::move(read);
  // (The parser said "unexpected end of input; expected '[', '{', or a literal".)
  if (contents.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(), "' is empty"));
  }
  // The parser would take a NUL for the end of the input and ignore the rest.
  if (const std::size_t nul = contents.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(), "' contains a NUL byte at offset ", nul,
                                                   " (not a text file)"));
  }
  Json config;
  bool deep = false;
  std::string duplicate;
  try {
    config = ParseLimited(contents, /*allow_exceptions=*/true, &deep, &duplicate);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        Location(path, contents, e.byte), ": JSON syntax error: ", ParseErrorReason(e.what())));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(NumberLocation(path, contents, e.what()), ": invalid JSON: ", ParseErrorReason(e.what())));
  }
  if (const std::optional<NumberAt> tiny = FirstUnderflowingNumber(contents)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Location(path, contents, tiny->offset + 1), ": number ", ShortText(tiny->text),
                     " is nonzero but below the smallest a number holds (it would read as 0)"));
  }
  if (deep) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(), "' nests objects or arrays deeper than ",
                                                   kMaxNestingDepth, " levels"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path.string(), "' gives key '", ShortText(duplicate), "' twice in one object"));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path.string(),
                                                   "' must hold a JSON object, not ",
                                                   WithArticle(JsonTypeName(config))));
  }
  if (text != nullptr) *text = std::move(contents);
  return config;
}

// Where each object member's key stands in JSON text the parser accepted
// (comments allowed), by its dotted path ("optim.lr"): its 1-based line and
// column (in bytes); members of objects inside arrays are left out (no key
// path names them). One pass: lines are counted as the scan goes (a
// search from the start for each key was quadratic in a file of many keys).
struct KeyAt {
  std::string path;
  std::size_t line = 0;
  std::size_t column = 0;
};
std::vector<KeyAt> KeyPositions(std::string_view text) {
  struct Frame {
    bool object = false;
    bool named = true;       // false inside an array
    std::string path;        // of this container
    bool expect_key = true;  // an object's next string is a key
    std::string last_key;    // the path of its member being read
  };
  std::vector<KeyAt> keys;
  std::vector<Frame> stack;
  const std::size_t n = text.size();
  std::size_t line = 1, line_start = 0, counted = 0;
  const auto count_lines_to = [&](std::size_t end) {
    for (; counted < end; ++counted) {
      if (text[counted] == '\n') {
        ++line;
        line_start = counted + 1;
      }
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '/' && i + 1 < n && text[i + 1] == '/') {
      const std::size_t end = text.find('\n', i);
      if (end == std::string_view::npos) break;
      i = end - 1;
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '*') {
      const std::size_t end = text.find("*/", i + 2);
      if (end == std::string_view::npos) break;
      i = end + 1;
      continue;
    }
    if (c == '"') {
      std::size_t j = i + 1;
      while (j < n && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      if (j >= n) break;
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        Frame& top = stack.back();
        const Json key = Json::parse(text.substr(i, j + 1 - i), nullptr, /*allow_exceptions=*/false);
        top.expect_key = false;
        top.last_key = key.is_string() ? JoinPath(top.path, key.get<std::string>()) : std::string();
        if (top.named && key.is_string()) {
          count_lines_to(i);
          keys.push_back({top.last_key, line, i - line_start + 1});
        }
      }
      i = j;
      continue;
    }
    if (c == '{' || c == '[') {
      Frame frame;
      frame.object = c == '{';
      if (!stack.empty()) {
        const Frame& parent = stack.back();
        frame.named = parent.named && parent.object && !parent.last_key.empty();
        frame.path = parent.object ? parent.last_key : parent.path;
      }
      if (!frame.object) frame.named = false;
      stack.push_back(std::move(frame));
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ',' && !stack.empty() && stack.back().object) {
      stack.back().expect_key = true;
    }
  }
  return keys;
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
                                                   QuoteJson(*it)));
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
    // (The OS would read the path only up to it: another file.)
    if (base.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("config file '", EscapeControlChars(path.string()),
                                                     "': ", AbslView(kBaseKey), " '", EscapeControlChars(base),
                                                     "' holds a NUL character"));
    }
  }
  return bases;
}

// Reads one config and its bases; counts files to bound a _base_ lattice
// that would otherwise include files exponentially often.
class FileLoader {
 public:
  explicit FileLoader(Origins* origins) : origins_(origins) {}

  absl::StatusOr<Json> Load(const fs::path& path) {
    chain_ = {{Canonical(path), path.string()}};
    return LoadWithBases(path);
  }

 private:
  // Loads `path` (already on chain_) with its bases merged in.
  absl::StatusOr<Json> LoadWithBases(const fs::path& path) {
    if (++files_read_ > kMaxConfigFiles) {
      return absl::InvalidArgumentError(absl::StrCat("config '", chain_.front().display, "' reads more than ",
                                                     kMaxConfigFiles, " files, itself and its ", AbslView(kBaseKey),
                                                     " files (at '", path.string(), "')"));
    }
    std::string text;
    ASSIGN_OR_RETURN(Json self, ReadJsonFile(path, &text));
    ASSIGN_OR_RETURN(const std::vector<std::string> bases, BaseList(self, path));
    Json merged = Json::object();
    for (const std::string& base : bases) {
      const fs::path resolved = (path.parent_path() / base).lexically_normal();
      std::error_code error;
      const bool exists = fs::exists(resolved, error);
      if (!exists && error && error != std::errc::no_such_file_or_directory) {
        return absl::InvalidArgumentError(absl::StrCat("config file '", EscapeControlChars(path.string()),
                                                       "' names base '", EscapeControlChars(base),
                                                       "', which cannot be read: ", error.message()));
      }
      if (!exists) {
        const std::string looked_for =
            resolved.string() == base ? ""
                                      : absl::StrCat(" (looked for '", EscapeControlChars(resolved.string()), "')");
        return absl::NotFoundError(absl::StrCat("config file '", EscapeControlChars(path.string()), "' names base '",
                                                EscapeControlChars(base), "', which does not exist", looked_for));
      }
      if (!fs::is_regular_file(resolved, error)) {
        return absl::InvalidArgumentError(absl::StrCat("config file '", EscapeControlChars(path.string()),
                                                       "' names base '", EscapeControlChars(base),
                                                       "', which is not a regular file"));
      }
      ChainEntry entry{Canonical(resolved), resolved.string()};
      for (const ChainEntry& ancestor : chain_) {
        if (ancestor.canonical != entry.canonical) continue;
        std::vector<std::string> names;
        for (const ChainEntry& link : chain_) names.push_back(link.display);
        names.push_back(entry.display);
        return absl::InvalidArgumentError(
            absl::StrCat("config ", AbslView(kBaseKey), " cycle: ", absl::StrJoin(names, " -> ")));
      }
      if (static_cast<int>(chain_.size()) >= kMaxBaseDepth) {
        return absl::InvalidArgumentError(absl::StrCat("config ", AbslView(kBaseKey), " chain deeper than ",
                                                       kMaxBaseDepth, " files, the config itself included (at '",
                                                       entry.display, "')"));
      }
      chain_.push_back(std::move(entry));
      absl::StatusOr<Json> base_config = LoadWithBases(resolved);
      chain_.pop_back();
      if (!base_config.ok()) return base_config.status();
      // The base's own origins were recorded while it loaded.
      MergeInto(merged, *base_config, "", "", nullptr);
    }
    self.erase(std::string(kBaseKey));
    const std::string in_file = absl::StrCat("in ", path.string());
    MergeInto(merged, self, "", in_file, origins_);
    if (origins_ != nullptr) {
      // Each key this file set, where it stands ("in job.json:12:5").
      for (const KeyAt& key : KeyPositions(text)) {
        if (const auto it = origins_->find(key.path); it != origins_->end() && it->second == in_file) {
          it->second = absl::StrCat(in_file, ":", key.line, ":", key.column);
        }
      }
    }
    return merged;
  }

  Origins* origins_;
  std::vector<ChainEntry> chain_;
  int files_read_ = 0;
};

absl::Status ExpectedType(std::string_view dotted_path, std::string_view expected,
                          const Json& got) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", AbslView(dotted_path),
                                                 "' expects ", AbslView(expected), ", got ",
                                                 DescribeJson(got)));
}

}  // namespace

absl::StatusOr<Override> ParseOverride(std::string_view text) {
  if (const std::optional<std::size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed override '",
                                                   ShortText(EscapeControlChars(text, /*non_ascii=*/true)),
                                                   "': not valid UTF-8 (byte ", *bad, ")"));
  }
  const std::size_t equals = text.find('=');
  if (equals == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed override '", ShortText(text), "': expected key=value"));
  }
  Override result;
  result.text = std::string(text);
  result.key = std::string(text.substr(0, equals));
  result.raw_value = std::string(text.substr(equals + 1));
  if (result.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed override '", ShortText(text), "': empty key"));
  }
  if (!SplitKey(result.key).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed override '", ShortText(text), "': empty path segment in key '", ShortText(result.key), "'"));
  }
  bool deep = false;
  std::string duplicate;
  result.value = ParseLimited(result.raw_value, /*allow_exceptions=*/false, &deep, &duplicate);
  if (deep) {
    return absl::InvalidArgumentError(absl::StrCat("override '", ShortText(text), "': the value nests deeper than ",
                                                   kMaxNestingDepth, " levels"));
  }
  if (!duplicate.empty() && !result.value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("override '", ShortText(text), "': its value gives key '",
                                                   ShortText(duplicate), "' twice in one object"));
  }
  if (!result.value.is_discarded()) {
    if (const std::optional<NumberAt> tiny = FirstUnderflowingNumber(result.raw_value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("override '", ShortText(text), "': ", ShortText(tiny->text),
                       " is nonzero but below the smallest a number holds (it would read as 0)"));
    }
  }
  if (result.value.is_discarded()) result.value = result.raw_value;
  return result;
}

absl::Status ApplyOverrides(Json& config, const std::vector<std::string>& overrides, const Section& schema,
                            Origins* origins) {
  if (overrides.empty()) return absl::OkStatus();
  if (!config.is_object()) return absl::InvalidArgumentError("cannot apply overrides: the config is not an object");
  // Work on copies so a failing override leaves the caller's config intact.
  Json updated = config;
  Origins updated_origins = origins != nullptr ? *origins : Origins{};
  // "_target_" overrides go first, so that `optim.momentum=0.9
  // optim._target_=SGD` means what it says whatever the order. A whole
  // section naming its _target_ (`optim={"_target_": "SGD", ...}`) sets that
  // target first too, and the rest in its turn. Each section's target is
  // set once, to the last one given (`optim._target_=SGD
  // optim._target_=AdamW` is AdamW with the file's arguments, not AdamW's
  // defaults: a target changed and changed back reset the section).
  const auto is_target = [](const std::string& text) { return text.substr(0, text.find('=')).ends_with(kTargetKey); };
  std::vector<std::pair<std::string, std::string>> targets;  // (key, override), the last per key
  const auto set_target = [&targets](std::string key, std::string text) {
    std::erase_if(targets, [&key](const auto& target) { return target.first == key; });
    targets.emplace_back(std::move(key), std::move(text));
  };
  for (const std::string& text : overrides) {
    if (is_target(text)) {
      set_target(text.substr(0, text.find('=')), text);
    } else if (const absl::StatusOr<Override> parsed = ParseOverride(text);
               parsed.ok() && parsed->value.is_object() && parsed->value.contains(kTargetKey)) {
      const std::string key = absl::StrCat(parsed->key, ".", std::string(kTargetKey));
      set_target(key, absl::StrCat(key, "=", parsed->value[kTargetKey].dump()));
    }
  }
  std::vector<std::string> ordered;
  for (auto& [key, text] : targets) ordered.push_back(std::move(text));
  const size_t first_other = ordered.size();
  for (const std::string& text : overrides) {
    if (!is_target(text)) ordered.push_back(text);
  }
  for (size_t i = 0; i < ordered.size(); ++i) {
    const std::string& text = ordered[i];
    ASSIGN_OR_RETURN(Override parsed, ParseOverride(text));
    // (A section's object: its target was set above, to the last one given.)
    if (i >= first_other && parsed.value.is_object()) parsed.value.erase(std::string(kTargetKey));
    const std::string from = absl::StrCat(" (from override '", ShortText(text), "')");
    const std::string origin = absl::StrCat("from override '", ShortText(text), "'");
    absl::StatusOr<SchemaEntry> entry = Lookup(schema, updated, parsed.key);
    if (!entry.ok()) {
      if (absl::IsNotFound(entry.status())) {
        const std::string hint = OtherTargetsHint(schema, parsed.key);
        const std::optional<std::string> closest = ClosestMatch(parsed.key, DeclaredPaths(schema, updated));
        return absl::InvalidArgumentError(absl::StrCat("unknown config key '", ShortText(parsed.key), "'", from,
                                                       !hint.empty() ? hint
                                                       : closest     ? absl::StrCat("; did you mean '", *closest, "'?")
                                                                     : ""));
      }
      return absl::InvalidArgumentError(absl::StrCat(entry.status().message(), from));
    }
    if (entry->not_implemented != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("config key '", ShortText(parsed.key), "'", from, " is in a section that is not implemented yet (",
                                                     entry->not_implemented->not_implemented(), ")"));
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> segments, SplitKey(parsed.key));
    Json value = parsed.value;
    // A number past a double's range (JSON's parser refuses it, so it was
    // taken as text): said as such, not as "got string".
    if (entry->key != nullptr && value.is_string() &&
        (entry->key->type == KeyType::kNumber || entry->key->type == KeyType::kInt)) {
      const std::string& text = parsed.raw_value;
      char* end = nullptr;
      errno = 0;
      (void)std::strtod(text.c_str(), &end);
      const bool json_number = !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
      if (json_number && end == text.c_str() + text.size() && errno == ERANGE) {
        return absl::InvalidArgumentError(absl::StrCat("config key '", ShortText(parsed.key), "'", from, ": ",
                                                       ShortText(text), " is beyond the range of a number"));
      }
    }
    // `name=2024` on a string key means the text, not a type error.
    if (entry->key != nullptr && entry->key->type == KeyType::kString && (value.is_number() || value.is_boolean())) {
      value = parsed.raw_value;
    }
    Json* node = &updated;
    std::string path;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
      path = JoinPath(path, segments[i]);
      Json& child = (*node)[segments[i]];
      if (child.is_null()) child = Json::object();
      if (!child.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat("config key '", path, "' is ", WithArticle(JsonTypeName(child)),
                                                       ", not an object, so '", parsed.key, "' cannot be set", from));
      }
      node = &child;
    }
    const std::string& leaf = segments.back();
    const std::string parent_path = path;
    path = JoinPath(path, leaf);
    if (entry->is_target) {
      const auto it = node->find(leaf);
      if (it != node->end() && *it != value) {
        // Another target: the old one's arguments mean nothing to it.
        *node = Json::object();
        EraseOriginsBelow(updated_origins, parent_path);
      }
      (*node)[leaf] = value;
      updated_origins[path] = origin;
      continue;
    }
    Json& slot = (*node)[leaf];
    if (entry->section != nullptr && value.is_object()) {
      if (slot.is_null()) slot = Json::object();
      MergeInto(slot, value, path, origin, &updated_origins);
      updated_origins[path] = origin;
      continue;
    }
    slot = value;
    EraseOriginsBelow(updated_origins, path);
    RecordOrigins(value, path, origin, updated_origins);
  }
  config = std::move(updated);
  if (origins != nullptr) *origins = std::move(updated_origins);
  return absl::OkStatus();
}

absl::StatusOr<Json> LoadConfigFiles(const fs::path& path, Origins* origins) {
  return FileLoader(origins).Load(path);
}

absl::StatusOr<Json> LoadConfig(const fs::path& path, const std::vector<std::string>& overrides,
                                const Section& schema) {
  Origins origins;
  ASSIGN_OR_RETURN(Json config, LoadConfigFiles(path, &origins));
  RETURN_IF_ERROR(ApplyOverrides(config, overrides, schema, &origins));
  return Resolve(schema, config, origins);
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

void DeepMerge(Json& base, const Json& overlay) { MergeInto(base, overlay, "", "", nullptr); }

absl::StatusOr<const Json*> GetNode(const Json& config, std::string_view dotted_path) {
  ASSIGN_OR_RETURN(const std::vector<std::string> segments, SplitKey(dotted_path));
  const Json* node = &config;
  std::string path;
  for (const std::string& segment : segments) {
    if (!node->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config key '", path, "' is ", WithArticle(JsonTypeName(*node)),
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
