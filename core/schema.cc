#include "core/schema.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_split.h"
#include "core/json_text.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"

namespace tessera::config {
namespace {

using Json = nlohmann::json;

std::string Join2(const std::string& path, std::string_view name) {
  return path.empty() ? std::string(name) : StrCat(path, ".", name);
}

std::string FormatBound(double bound, KeyType type) {
  if ((type == KeyType::kInt || type == KeyType::kIntList) && AsIntegral(bound)) return StrCat(*AsIntegral(bound));
  return StrCat(bound);
}

// "in [1, 1024]", "> 0", ">= 1", "<= 8".
std::string RangeText(const KeySpec& spec) {
  const bool has_min = spec.min.has_value(), has_max = spec.max.has_value();
  if (has_min && has_max) {
    return StrCat("in ", spec.exclusive_min ? "(" : "[", FormatBound(*spec.min, spec.type), ", ",
                  FormatBound(*spec.max, spec.type), spec.exclusive_max ? ")" : "]");
  }
  if (has_min) return StrCat(spec.exclusive_min ? "> " : ">= ", FormatBound(*spec.min, spec.type));
  if (has_max) return StrCat(spec.exclusive_max ? "< " : "<= ", FormatBound(*spec.max, spec.type));
  return "";
}

bool InRange(const KeySpec& spec, double v) {
  if (spec.min && (spec.exclusive_min ? !(v > *spec.min) : !(v >= *spec.min))) return false;
  if (spec.max && (spec.exclusive_max ? !(v < *spec.max) : !(v <= *spec.max))) return false;
  return true;
}

// The nearest recorded origin of `path` or of one of its ancestors.
std::string OriginOf(const Origins& origins, std::string_view path) {
  std::string p(path.substr(0, path.find('[')));  // a list element comes from where its list does
  while (true) {
    if (auto it = origins.find(p); it != origins.end()) return StrCat(" (", it->second, ")");
    if (p.empty()) return "";
    const std::size_t dot = p.rfind('.');
    p = dot == std::string::npos ? "" : p.substr(0, dot);
  }
}

// The section `node` selects among `section`'s targets; null when it names
// none (or an unknown one) and there is no usable default.
const Section* SelectedTarget(const Section& section, const Json* node) {
  if (node != nullptr && node->is_object()) {
    const auto it = node->find("_target_");
    if (it != node->end() && it->is_string()) return section.FindTarget(it->get_ref<const std::string&>());
    if (it != node->end()) return nullptr;
  }
  return section.default_target() ? section.FindTarget(*section.default_target()) : nullptr;
}

void CollectPaths(const Section& section, const Json* node, const std::string& path, std::vector<std::string>& out) {
  if (section.targeted()) {
    out.push_back(Join2(path, "_target_"));
    const Section* selected = SelectedTarget(section, node);
    if (selected != nullptr) {
      CollectPaths(*selected, node, path, out);
    } else {
      for (const auto& [name, target] : section.targets()) CollectPaths(target, node, path, out);
    }
  }
  for (const auto& [name, spec] : section.keys()) out.push_back(Join2(path, name));
  for (const auto& [name, sub] : section.subs()) {
    const Json* child = nullptr;
    if (node != nullptr && node->is_object()) {
      if (auto it = node->find(name); it != node->end()) child = &*it;
    }
    const std::string child_path = Join2(path, name);
    out.push_back(child_path);
    CollectPaths(sub, child, child_path, out);
  }
}

class Resolver {
 public:
  Resolver(const Section& schema, const Json& config, const Origins& origins, std::string_view prefix)
      : schema_(schema), config_(config), origins_(origins), prefix_(prefix) {}

  absl::StatusOr<Json> Run() {
    if (!config_.is_object()) {
      return absl::InvalidArgumentError(StrCat("a config must be a JSON object, got ", DescribeJson(config_), OriginOf(origins_, "")));
    }
    ASSIGN_OR_RETURN(Json resolved, ResolveSection(schema_, &config_, prefix_));
    for (const auto& [path, from] : seeds_) {
      if (!prefix_.empty()) {
        return Error(path, StrCat("config key '", path, "' is null: its seed derives from '", from,
                                  "', so it is resolved with the whole job config"));
      }
      ASSIGN_OR_RETURN(const Json* source, Find(resolved, from));
      if (!source->is_number_integer()) {
        return absl::InternalError(StrCat("config key '", path, "' derives its seed from '", from, "', which is not an integer"));
      }
      ASSIGN_OR_RETURN(Json* slot, FindMutable(resolved, path));
      *slot = DeriveSeed(source->get<int64_t>(), path);
    }
    return resolved;
  }

 private:
  static absl::StatusOr<const Json*> Find(const Json& root, std::string_view path) {
    const Json* node = &root;
    std::size_t start = 0;
    while (start <= path.size()) {
      const std::size_t dot = std::min(path.find('.', start), path.size());
      const std::string segment(path.substr(start, dot - start));
      if (!node->is_object() || !node->contains(segment)) {
        return absl::InternalError(StrCat("config schema: derived seed source '", path, "' is not declared"));
      }
      node = &node->at(segment);
      start = dot + 1;
    }
    return node;
  }
  static absl::StatusOr<Json*> FindMutable(Json& root, std::string_view path) {
    ASSIGN_OR_RETURN(const Json* node, Find(root, path));
    return const_cast<Json*>(node);
  }

  // The hint for an unknown full path: matched within this config, shown in full.
  std::string DidYouMean(const std::string& full_path) const {
    const std::string_view relative = prefix_.empty() ? std::string_view(full_path)
                                                      : std::string_view(full_path).substr(prefix_.size() + 1);
    const std::optional<std::string> closest = ClosestMatch(relative, DeclaredPaths(schema_, config_));
    if (!closest) return "";
    return StrCat("; did you mean '", prefix_.empty() ? *closest : StrCat(prefix_, ".", *closest), "'?");
  }

  absl::Status Error(std::string_view path, const std::string& message) const {
    return absl::InvalidArgumentError(StrCat(message, OriginOf(origins_, path)));
  }

  absl::StatusOr<Json> ResolveSection(const Section& section, const Json* node, const std::string& path) {
    if (!section.not_implemented().empty()) {
      if (node != nullptr && node->is_null()) node = nullptr;
      if (node != nullptr && !(node->is_object() && node->empty())) {
        return Error(path, StrCat("config section '", path, "' is not implemented yet (", section.not_implemented(), ")"));
      }
      return Json(nullptr);
    }
    if (node == nullptr && section.required()) {
      std::string hint;
      if (section.targeted()) hint = StrCat(": set ", Join2(path, "_target_"), " to one of ", Join(section.TargetNames(), ", "));
      return Error(path, StrCat("config has no '", path, "' section, which is required", hint));
    }
    if (node != nullptr && !node->is_object()) {
      return Error(path, StrCat("config key '", path, "' expects an object, got ", DescribeJson(*node)));
    }
    const Section* keys = &section;
    Json out = Json::object();
    if (section.targeted()) {
      std::string target;
      const auto it = node != nullptr ? node->find("_target_") : Json::const_iterator();
      if (node != nullptr && it != node->end()) {
        const std::string target_path = Join2(path, "_target_");
        if (!it->is_string()) {
          return Error(target_path, StrCat("config key '", target_path, "' expects a string (one of ",
                                           Join(section.TargetNames(), ", "), "), got ", DescribeJson(*it)));
        }
        target = it->get<std::string>();
        if (section.FindTarget(target) == nullptr) {
          const std::vector<std::string> names = section.TargetNames();
          const std::optional<std::string> closest = ClosestMatch(target, names);
          return Error(target_path, StrCat("unknown ", path, " _target_ '", EscapeControlChars(target), "'",
                                           closest ? StrCat("; did you mean '", *closest, "'?") : std::string(),
                                           " (one of: ", Join(names, ", "), ")"));
        }
      } else if (section.default_target()) {
        target = *section.default_target();
      } else {
        return Error(path, StrCat("config key '", Join2(path, "_target_"), "' is missing: set it to one of ",
                                  Join(section.TargetNames(), ", ")));
      }
      keys = section.FindTarget(target);
      out["_target_"] = target;
    }
    if (node != nullptr) {
      for (const auto& [name, value] : node->items()) {
        if (section.targeted() && name == "_target_") continue;
        if (keys->FindKey(name) != nullptr || keys->FindSub(name) != nullptr) continue;
        const std::string key_path = Join2(path, name);
        // (key_path is the full path: the prefix's part of it is above schema_.)
        const std::string_view relative =
            prefix_.empty() ? std::string_view(key_path) : std::string_view(key_path).substr(prefix_.size() + 1);
        std::string hint = OtherTargetsHint(schema_, relative, prefix_);
        if (hint.empty()) hint = DidYouMean(key_path);
        // A dotted name in a file is one key, not a path: "did you mean
        // 'train.train_iter'?" named the key itself.
        // One that is no key nested either is told both.
        if (name.find('.') != std::string::npos) {
          std::string nested = "...";
          const std::vector<std::string> parts = absl::StrSplit(name, '.');
          for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
            nested = StrCat("{\"", EscapeControlChars(*part), "\": ", nested, "}");
          }
          hint = hint == StrCat("; did you mean '", key_path, "'?")
                     ? StrCat("; a file nests keys: write ", nested, " (a dotted path is for overrides)")
                     : StrCat("; a file nests keys (", nested,
                              "; a dotted path is for overrides), and nested it is no key either", hint);
        }
        return absl::InvalidArgumentError(
            StrCat("unknown config key '", EscapeControlChars(key_path), "'", OriginOf(origins_, key_path), hint));
      }
    }
    for (const auto& [name, spec] : keys->keys()) {
      const std::string key_path = Join2(path, name);
      const Json* value = nullptr;
      if (node != nullptr) {
        if (auto it = node->find(name); it != node->end()) value = &*it;
      }
      ASSIGN_OR_RETURN(out[name], ResolveKey(spec, value, key_path));
    }
    for (const auto& [name, sub] : keys->subs()) {
      const Json* child = nullptr;
      if (node != nullptr) {
        if (auto it = node->find(name); it != node->end()) child = &*it;
      }
      ASSIGN_OR_RETURN(Json resolved, ResolveSection(sub, child, Join2(path, name)));
      if (!resolved.is_null()) out[name] = std::move(resolved);
    }
    return out;
  }

  std::string Expected(const KeySpec& spec) const {
    std::string text = KeyTypeName(spec.type);
    const std::string range = RangeText(spec);
    if (!range.empty()) text += StrCat(spec.type == KeyType::kIntList || spec.type == KeyType::kNumberList ? ", each " : " ", range);
    if (!spec.choices.empty()) text += StrCat(" (one of ", Join(spec.choices, ", "), ")");
    if (spec.allow_inf) text += StrCat(" or \"", kInfinity, "\"");
    if (spec.nullable) text += " or null";
    return text;
  }

  absl::StatusOr<Json> Scalar(const KeySpec& spec, const Json& value, const std::string& path) const {
    const auto mismatch = [&] {
      return Error(path, StrCat("config key '", path, "' expects ", WithArticle(Expected(spec)), ", got ", DescribeJson(value)));
    };
    switch (spec.type) {
      case KeyType::kBool:
        if (!value.is_boolean()) return mismatch();
        return value;
      case KeyType::kInt: {
        int64_t v = 0;
        if (value.is_number_unsigned()) {
          if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return Error(path, StrCat("config key '", path, "' expects ", WithArticle(Expected(spec)), ", got ",
                                      DescribeJson(value), ", above the largest integer a key holds (",
                                      std::numeric_limits<int64_t>::max(), ")"));
          }
          v = static_cast<int64_t>(value.get<uint64_t>());
        } else if (value.is_number_integer()) {
          v = value.get<int64_t>();
        } else if (value.is_number_float()) {
          // LiBai-style configs write counts like 1e5.
          const std::optional<int64_t> integral = AsIntegral(value.get<double>());
          if (!integral) return mismatch();
          v = *integral;
        } else {
          return mismatch();
        }
        if (!InRange(spec, static_cast<double>(v))) {
          return Error(path, StrCat("config key '", path, "' must be ", RangeText(spec), ", got ", v));
        }
        return Json(v);
      }
      case KeyType::kNumber: {
        if (spec.allow_inf && value.is_string() && value.get_ref<const std::string&>() == kInfinity) {
          if (spec.max)
            return Error(path,
                         StrCat("config key '", path, "' must be ", RangeText(spec), ", got \"", kInfinity, "\""));
          return value;
        }
        if (!value.is_number()) return mismatch();
        const double v = value.get<double>();
        if (!std::isfinite(v)) return Error(path, StrCat("config key '", path, "' must be a finite number, got ", QuoteJson(value)));
        if (!InRange(spec, v)) return Error(path, StrCat("config key '", path, "' must be ", RangeText(spec), ", got ", v));
        return Json(v);
      }
      case KeyType::kString: {
        if (!value.is_string()) return mismatch();
        const std::string& s = value.get_ref<const std::string&>();
        if (spec.choices.empty()) {
          if (s.empty()) return Error(path, StrCat("config key '", path, "' must not be an empty string"));
          // (Paths and names: the OS would read a NUL as the string's end.)
          if (s.find('\0') != std::string::npos) {
            return Error(path, StrCat("config key '", path, "' holds a NUL character"));
          }
          // (Paths and names: the OS refuses longer paths; a 9000-byte
          // output_dir reached gRPC's metadata limit, which said only that.)
          if (constexpr size_t kMaxString = 4096; s.size() > kMaxString) {
            return Error(path, StrCat("config key '", path, "' is ", s.size(), " bytes long, more than ", kMaxString,
                                      " (a path's limit)"));
          }
          return value;
        }
        if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
          const std::optional<std::string> closest = ClosestMatch(s, spec.choices);
          return Error(path, StrCat("config key '", path, "' must be one of ", Join(spec.choices, ", "), ", got ", QuoteJson(value),
                                    closest ? StrCat(" (did you mean '", *closest, "'?)") : std::string()));
        }
        return value;
      }
      default:
        break;
    }
    return absl::InternalError("config schema: list type where a scalar was expected");
  }

  absl::StatusOr<Json> ResolveKey(const KeySpec& spec, const Json* value, const std::string& path) {
    if (value == nullptr) {
      if (spec.nullable && spec.default_value.is_null() && !spec.derive_seed_from.empty()) seeds_.emplace_back(path, spec.derive_seed_from);
      return spec.default_value;
    }
    Json resolved;
    if (value->is_null()) {
      if (!spec.nullable) {
        return Error(path, StrCat("config key '", path, "' must not be null (it expects ", WithArticle(Expected(spec)), ")"));
      }
      if (!spec.derive_seed_from.empty()) seeds_.emplace_back(path, spec.derive_seed_from);
      resolved = nullptr;
    } else if (spec.type == KeyType::kIntList || spec.type == KeyType::kNumberList) {
      if (!value->is_array()) {
        return Error(path, StrCat("config key '", path, "' expects ", WithArticle(Expected(spec)), ", got ", DescribeJson(*value)));
      }
      const auto size = static_cast<int64_t>(value->size());
      if ((spec.min_length && size < *spec.min_length) || (spec.max_length && size > *spec.max_length)) {
        std::string want;
        if (spec.min_length && spec.max_length && *spec.min_length == *spec.max_length) {
          want = StrCat("exactly ", *spec.min_length);
        } else if (spec.min_length && spec.max_length) {
          want = StrCat(*spec.min_length, " to ", *spec.max_length);
        } else if (spec.min_length) {
          want = StrCat("at least ", *spec.min_length);
        } else {
          want = StrCat("at most ", *spec.max_length);
        }
        return Error(path, StrCat("config key '", path, "' expects ", want, " elements, got ", size, " (", QuoteJson(*value), ")"));
      }
      KeySpec element = spec;
      element.type = spec.type == KeyType::kIntList ? KeyType::kInt : KeyType::kNumber;
      element.nullable = false;
      element.min_length = element.max_length = std::nullopt;
      resolved = Json::array();
      for (std::size_t i = 0; i < value->size(); ++i) {
        ASSIGN_OR_RETURN(Json v, Scalar(element, (*value)[i], StrCat(path, "[", i, "]")));
        resolved.push_back(std::move(v));
      }
    } else {
      ASSIGN_OR_RETURN(resolved, Scalar(spec, *value, path));
    }
    if (!spec.not_implemented.empty() && resolved != spec.default_value) {
      return Error(path, StrCat("config key '", path, "' = ", QuoteJson(resolved), " is not implemented yet (", spec.not_implemented,
                                "); only ", QuoteJson(spec.default_value), " is accepted"));
    }
    return resolved;
  }

  const Section& schema_;
  const Json& config_;
  const Origins& origins_;
  const std::string prefix_;
  std::vector<std::pair<std::string, std::string>> seeds_;  // (path, source path)
};

std::string DefaultText(const KeySpec& spec) {
  if (!spec.derive_seed_from.empty() && spec.default_value.is_null()) return StrCat("derived from `", spec.derive_seed_from, "`");
  return StrCat("`", QuoteJson(spec.default_value), "`");
}

std::string AllowedText(const KeySpec& spec) {
  if (!spec.not_implemented.empty()) return StrCat("not implemented yet (", spec.not_implemented, "): only the default");
  std::vector<std::string> parts;
  if (!spec.choices.empty()) {
    std::vector<std::string> quoted;
    for (const std::string& c : spec.choices) quoted.push_back(StrCat("`", c, "`"));
    parts.push_back(Join(quoted, ", "));
  }
  const std::string range = RangeText(spec);
  if (!range.empty()) parts.push_back(spec.type == KeyType::kIntList || spec.type == KeyType::kNumberList ? StrCat("each ", range) : range);
  if (spec.min_length && spec.max_length && *spec.min_length == *spec.max_length) {
    parts.push_back(StrCat(*spec.min_length, " elements"));
  } else {
    if (spec.min_length) parts.push_back(StrCat("at least ", *spec.min_length, " elements"));
    if (spec.max_length) parts.push_back(StrCat("at most ", *spec.max_length, " elements"));
  }
  if (spec.allow_inf) parts.push_back(StrCat("`\"", kInfinity, "\"`"));
  if (parts.empty()) {
    if (spec.type == KeyType::kBool) {
      parts.push_back("`true`, `false`");
    } else {
      parts.push_back(spec.type == KeyType::kString ? "any non-empty string" : "any");
    }
  }
  if (spec.nullable) parts.push_back("`null`");
  return Join(parts, "; ");
}

std::string Cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

void SectionMarkdown(const Section& section, const std::string& path, const std::string& title, std::string& out) {
  out += StrCat("\n### ", title, "\n\n");
  if (!section.doc().empty()) out += StrCat(section.doc(), "\n\n");
  if (!section.not_implemented().empty()) {
    out += StrCat("Not implemented yet (", section.not_implemented(), "): any key here is refused.\n");
    return;
  }
  if (section.targeted()) {
    std::vector<std::string> names;
    for (const std::string& n : section.TargetNames()) names.push_back(StrCat("`", n, "`"));
    out += StrCat("`", Join2(path, "_target_"), "` selects one of ", Join(names, ", "),
                  section.default_target() ? StrCat(" (default `", *section.default_target(), "`)") : std::string(" (required)"),
                  "; each has the keys below.\n");
    for (const auto& [name, target] : section.targets()) {
      SectionMarkdown(target, path, StrCat("`", path, "` with `_target_: ", name, "`"), out);
    }
    return;
  }
  if (!section.keys().empty()) {
    out += "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    for (const auto& [name, spec] : section.keys()) {
      out += StrCat("| `", Join2(path, name), "` | ", KeyTypeName(spec.type), " | ", Cell(DefaultText(spec)), " | ",
                    Cell(AllowedText(spec)), " | ", Cell(spec.doc), " |\n");
    }
  }
  for (const auto& [name, sub] : section.subs()) {
    const std::string sub_path = Join2(path, name);
    SectionMarkdown(sub, sub_path, StrCat("`", sub_path, "`"), out);
  }
}

}  // namespace

std::string KeyTypeName(KeyType type) {
  switch (type) {
    case KeyType::kBool: return "boolean";
    case KeyType::kInt: return "integer";
    case KeyType::kNumber: return "number";
    case KeyType::kString: return "string";
    case KeyType::kIntList: return "list of integers";
    case KeyType::kNumberList: return "list of numbers";
  }
  return "?";
}

void Section::CheckNameFree(const std::string& name) const {
  TESSERA_CHECK(!name.empty() && name.find('.') == std::string::npos, "config schema: bad name '", name, "'");
  TESSERA_CHECK(FindKey(name) == nullptr && FindSub(name) == nullptr, "config schema: '", name, "' declared twice");
}

Section& Section::Key(std::string name, KeySpec spec) {
  CheckNameFree(name);
  TESSERA_CHECK(spec.nullable || !spec.default_value.is_null() || spec.not_implemented.size() > 0,
                "config schema: key '", name, "' has a null default but is not nullable");
  keys_.emplace_back(std::move(name), std::move(spec));
  return *this;
}

Section& Section::Sub(std::string name, Section section) {
  CheckNameFree(name);
  subs_.emplace_back(std::move(name), std::move(section));
  return *this;
}

Section& Section::Target(std::string name, Section keys) {
  TESSERA_CHECK(FindTarget(name) == nullptr, "config schema: target '", name, "' declared twice");
  targets_.emplace_back(std::move(name), std::move(keys));
  return *this;
}

Section& Section::DefaultTarget(std::string name) {
  default_target_ = std::move(name);
  return *this;
}

Section& Section::Required() {
  required_ = true;
  return *this;
}

Section& Section::NotImplemented(std::string reason) {
  not_implemented_ = std::move(reason);
  return *this;
}

const KeySpec* Section::FindKey(std::string_view name) const {
  for (const auto& [n, spec] : keys_) {
    if (n == name) return &spec;
  }
  return nullptr;
}

const Section* Section::FindSub(std::string_view name) const {
  for (const auto& [n, sub] : subs_) {
    if (n == name) return &sub;
  }
  return nullptr;
}

const Section* Section::FindTarget(std::string_view name) const {
  for (const auto& [n, target] : targets_) {
    if (n == name) return &target;
  }
  return nullptr;
}

std::vector<std::string> Section::TargetNames() const {
  std::vector<std::string> names;
  for (const auto& [n, target] : targets_) names.push_back(n);
  return names;
}

absl::StatusOr<Json> Resolve(const Section& schema, const Json& config, const Origins& origins,
                             std::string_view prefix) {
  return Resolver(schema, config, origins, prefix).Run();
}

std::vector<std::string> DeclaredPaths(const Section& schema, const Json& config) {
  std::vector<std::string> paths;
  CollectPaths(schema, &config, "", paths);
  return paths;
}

std::string OtherTargetsHint(const Section& schema, std::string_view dotted_path, std::string_view prefix) {
  std::vector<std::string> segments;
  for (std::size_t start = 0; start <= dotted_path.size();) {
    const std::size_t dot = std::min(dotted_path.find('.', start), dotted_path.size());
    segments.emplace_back(dotted_path.substr(start, dot - start));
    start = dot + 1;
  }
  // Whether `section` declares segments [i, end) as a key.
  const auto declares = [&segments](const Section* section, std::size_t i) {
    for (; section != nullptr && i + 1 < segments.size(); ++i) section = section->FindSub(segments[i]);
    return section != nullptr && section->FindKey(segments.back()) != nullptr;
  };
  const Section* section = &schema;
  for (std::size_t i = 0; i < segments.size() && section != nullptr; ++i) {
    if (section->targeted()) {
      std::vector<std::string> having;
      for (const auto& [name, target] : section->targets()) {
        if (declares(&target, i)) having.push_back(name);
      }
      if (having.empty()) return "";
      std::string at = prefix.empty() ? std::string() : StrCat(prefix, ".");
      for (std::size_t j = 0; j < i; ++j) at += segments[j] + ".";
      return StrCat(" (a key of ", at, "_target_ ", Join(having, " or "), ")");
    }
    section = section->FindSub(segments[i]);
  }
  return "";
}

absl::StatusOr<SchemaEntry> Lookup(const Section& schema, const Json& config, std::string_view dotted_path) {
  SchemaEntry entry;
  entry.section = &schema;
  const Json* node = &config;
  std::string path;
  std::size_t start = 0;
  while (start <= dotted_path.size()) {
    const std::size_t dot = std::min(dotted_path.find('.', start), dotted_path.size());
    const std::string segment(dotted_path.substr(start, dot - start));
    const bool last = dot == dotted_path.size();
    path = Join2(path, segment);
    const Section* section = entry.section;
    if (section == nullptr) {
      return absl::InvalidArgumentError(StrCat("config key '", path.substr(0, path.rfind('.')), "' is ",
                                               WithArticle(KeyTypeName(entry.key->type)), ", not an object, so '",
                                               dotted_path, "' cannot be set"));
    }
    if (!section->not_implemented().empty()) {
      entry.not_implemented = section;
      entry.parent = section;
      entry.section = nullptr;
      entry.key = nullptr;
      return entry;
    }
    entry.parent = section;
    const Section* keys = section;
    if (section->targeted()) {
      if (segment == "_target_" && last) {
        entry.is_target = true;
        entry.section = nullptr;
        return entry;
      }
      keys = SelectedTarget(*section, node);
      if (keys == nullptr) {
        // No usable target: accept any target's key; Resolve reports the target.
        for (const auto& [name, target] : section->targets()) {
          if (target.FindKey(segment) != nullptr || target.FindSub(segment) != nullptr) {
            keys = &target;
            break;
          }
        }
      }
    }
    const KeySpec* key = keys != nullptr ? keys->FindKey(segment) : nullptr;
    const Section* sub = keys != nullptr ? keys->FindSub(segment) : nullptr;
    if (key == nullptr && sub == nullptr) {
      return absl::NotFoundError(StrCat("unknown config key '", dotted_path, "'"));
    }
    entry.key = key;
    entry.section = sub;
    if (node != nullptr && node->is_object()) {
      const auto it = node->find(segment);
      node = it != node->end() ? &*it : nullptr;
    } else {
      node = nullptr;
    }
    start = dot + 1;
  }
  return entry;
}

std::string SchemaMarkdown(const Section& schema) {
  std::string out;
  for (const auto& [name, spec] : schema.keys()) {
    out += StrCat("- `", name, "` (", KeyTypeName(spec.type), ", default ", DefaultText(spec), "): ", spec.doc, "\n");
  }
  for (const auto& [name, sub] : schema.subs()) SectionMarkdown(sub, name, StrCat("`", name, "`"), out);
  return out;
}

int64_t DeriveSeed(int64_t seed, std::string_view path) {
  // FNV-1a of the path, then SplitMix64's finaliser over seed ^ hash.
  uint64_t hash = 14695981039346656037ull;
  for (const char c : path) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  uint64_t z = static_cast<uint64_t>(seed) ^ hash;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<int64_t>(z >> 1);  // non-negative
}

namespace internal {
absl::Status UnresolvedKey(std::string_view name, std::string_view kind, const nlohmann::json& node) {
  // (A config Resolve made has every key, valid: one read unresolved is a
  // program's, or a saved config damaged since.)
  return absl::InvalidArgumentError(StrCat("key '", name, "' is ", kind, " in ", QuoteJson(node),
                                           " (not a config resolved against its schema: damaged?)"));
}
}  // namespace internal

}  // namespace tessera::config
