#pragma once
// The config schema (DESIGN §10; the user reference is docs/config.md, made
// from the job's schema by `tessera config --schema`).
//
// Every key of every namespace is declared once, with its type, default,
// range or choices and a one-line doc, in a tree of Sections. The same
// declaration checks a config whatever it came from — a file, one of its
// `_base_`s, a command-line override or an RPC — and fills in the defaults:
//
//   Resolve(schema, config, origins)  ->  the complete, checked config
//
// Errors name the key path, what was expected, what was found and where it
// came from ("in configs/x.json", "from override 'a=b'"); unknown keys get a
// "did you mean" hint from the declared paths.
//
// A section may select its keys by "_target_" (a model, an optimizer, a
// schedule): each target declares its own keys. A key or section of a
// feature that does not exist yet is declared `not_implemented`: its default
// is accepted (so saved configs and LiBai-style bases load) and anything else
// is refused with the reason, never silently ignored.
//
// Binding<T> ties a section to a plain struct: each key is declared with the
// member it fills, the default is the member's default initialiser, and
// Read() fills a T from a resolved node — so the struct and the schema are
// one list.
//
// Sections are immutable after construction and may be shared between
// threads. Nothing here throws.

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::config {

enum class KeyType { kBool, kInt, kNumber, kString, kIntList, kNumberList };

// "integer", "list of numbers", ...
std::string KeyTypeName(KeyType type);

struct KeySpec {
  KeyType type = KeyType::kInt;
  // What an absent key resolves to. Null only for nullable keys.
  nlohmann::json default_value = nullptr;
  // null is a value of this key (`doc` says what it means).
  bool nullable = false;
  // Bounds of numbers, integers and list elements (inclusive unless the
  // exclusive flag is set).
  std::optional<double> min = {};
  std::optional<double> max = {};
  bool exclusive_min = false;
  bool exclusive_max = false;
  // kString: the allowed values (empty: any non-empty string).
  std::vector<std::string> choices = {};
  // kNumber: the string "inf" is a value too, +infinity (JSON has no
  // literal for it); the resolved config keeps it as "inf", and a Binding's
  // double member reads it as infinity.
  bool allow_inf = false;
  // Lists: bounds on the number of elements.
  std::optional<int64_t> min_length = {};
  std::optional<int64_t> max_length = {};
  // A nullable integer key whose null resolves to a seed derived from this
  // key's value and the key's own path (e.g. "train.seed"), so one seed
  // drives every generator a job does not seed itself.
  std::string derive_seed_from = {};
  // Non-empty: the feature is not built yet. Only `default_value` is
  // accepted; any other value is refused with this text as the reason.
  std::string not_implemented = {};
  std::string doc = {};
};

class Section {
 public:
  explicit Section(std::string doc = {}) : doc_(std::move(doc)) {}

  // Declares a leaf. Keys, subsections and targets of one section have
  // distinct names (TESSERA_CHECKed: a clash is a bug in the declaration).
  Section& Key(std::string name, KeySpec spec);
  // Declares a nested object.
  Section& Sub(std::string name, Section section);
  // Declares a target: with "_target_": name, the section's keys are those
  // of `keys` (its own keys and subsections).
  Section& Target(std::string name, Section keys);
  // The target an absent "_target_" means; without one "_target_" is required.
  Section& DefaultTarget(std::string name);
  // An absent section is an error (e.g. `model`).
  Section& Required();
  // The whole section is a feature that does not exist yet: any key in it
  // is refused with `reason`.
  Section& NotImplemented(std::string reason);

  const std::string& doc() const { return doc_; }
  const std::vector<std::pair<std::string, KeySpec>>& keys() const { return keys_; }
  const std::vector<std::pair<std::string, Section>>& subs() const { return subs_; }
  const std::vector<std::pair<std::string, Section>>& targets() const { return targets_; }
  const std::optional<std::string>& default_target() const { return default_target_; }
  bool targeted() const { return !targets_.empty(); }
  bool required() const { return required_; }
  const std::string& not_implemented() const { return not_implemented_; }

  const KeySpec* FindKey(std::string_view name) const;
  const Section* FindSub(std::string_view name) const;
  const Section* FindTarget(std::string_view name) const;
  std::vector<std::string> TargetNames() const;

 private:
  void CheckNameFree(const std::string& name) const;

  std::string doc_;
  std::vector<std::pair<std::string, KeySpec>> keys_;
  std::vector<std::pair<std::string, Section>> subs_;
  std::vector<std::pair<std::string, Section>> targets_;
  std::optional<std::string> default_target_;
  bool required_ = false;
  std::string not_implemented_;
};

// Where each part of a config came from: dotted path -> "in configs/a.json"
// or "from override 'a.b=1'". A path without an entry inherits its nearest
// ancestor's; the root's entry ("") is the fallback (e.g. "from RPC").
using Origins = std::map<std::string, std::string, std::less<>>;

// Checks `config` against `schema` and returns it complete: every declared
// key present (defaults filled in, derived seeds computed), integers stored
// as integers, numbers as floats, "_target_" explicit. Resolving a resolved
// config gives it back unchanged. `prefix` is the path of `config` inside a
// larger config ("model" for a model's own section), for messages; a key
// whose seed derives from another key can only be resolved from the root.
[[nodiscard]] absl::StatusOr<nlohmann::json> Resolve(const Section& schema, const nlohmann::json& config,
                                                     const Origins& origins = {}, std::string_view prefix = "");

// Every dotted path `schema` declares (sections and keys), with a targeted
// section's keys taken from the target `config` selects there (all targets'
// when it selects none or an unknown one). The candidates for "did you mean".
std::vector<std::string> DeclaredPaths(const Section& schema, const nlohmann::json& config);

// For an unknown `dotted_path` (below `prefix`, where `schema` sits in a
// larger config): where the targeted section on its way has targets that
// declare the rest of it, " (a key of optim._target_ SGD)" naming them;
// else "".
std::string OtherTargetsHint(const Section& schema, std::string_view dotted_path, std::string_view prefix = "");

// What `dotted_path` names in `schema`, under the targets `config` selects.
struct SchemaEntry {
  const KeySpec* key = nullptr;          // a leaf
  const Section* section = nullptr;      // a (sub)section
  const Section* parent = nullptr;       // the section holding it
  bool is_target = false;                // the "_target_" of a targeted section
  const Section* not_implemented = nullptr;  // an enclosing not-implemented section
};
// NotFound (with the "did you mean") for a path the schema does not declare.
[[nodiscard]] absl::StatusOr<SchemaEntry> Lookup(const Section& schema, const nlohmann::json& config,
                                                 std::string_view dotted_path);

// The reference documentation of `schema` in Markdown: one table per section
// (key, type, default, allowed values, meaning), targets as subsections.
std::string SchemaMarkdown(const Section& schema);

// The seed a derived key resolves to: a 63-bit mix of `seed` and `path`.
int64_t DeriveSeed(int64_t seed, std::string_view path);

// ---------------------------------------------------------------- Binding<T>

// How a KeySpec::allow_inf key writes +infinity.
inline constexpr std::string_view kInfinity = "inf";

namespace internal {
template <typename V>
struct FieldTraits;
template <>
struct FieldTraits<bool> {
  static constexpr KeyType kType = KeyType::kBool;
  static bool Get(const nlohmann::json& j) { return j.get<bool>(); }
};
template <>
struct FieldTraits<int64_t> {
  static constexpr KeyType kType = KeyType::kInt;
  static int64_t Get(const nlohmann::json& j) { return j.get<int64_t>(); }
};
template <>
struct FieldTraits<double> {
  static constexpr KeyType kType = KeyType::kNumber;
  // "inf" only where the key's spec allows it (Resolve checked).
  static double Get(const nlohmann::json& j) {
    if (j.is_string() && j.get_ref<const std::string&>() == kInfinity) return std::numeric_limits<double>::infinity();
    return j.get<double>();
  }
};
template <>
struct FieldTraits<std::string> {
  static constexpr KeyType kType = KeyType::kString;
  static std::string Get(const nlohmann::json& j) { return j.get<std::string>(); }
};
template <>
struct FieldTraits<std::vector<int64_t>> {
  static constexpr KeyType kType = KeyType::kIntList;
  static std::vector<int64_t> Get(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }
};
template <>
struct FieldTraits<std::vector<double>> {
  static constexpr KeyType kType = KeyType::kNumberList;
  static std::vector<double> Get(const nlohmann::json& j) { return j.get<std::vector<double>>(); }
};
template <typename V>
struct FieldTraits<std::optional<V>> {
  static constexpr KeyType kType = FieldTraits<V>::kType;
  static std::optional<V> Get(const nlohmann::json& j) {
    if (j.is_null()) return std::nullopt;
    return FieldTraits<V>::Get(j);
  }
};
template <typename V>
inline constexpr bool kIsOptional = false;
template <typename V>
inline constexpr bool kIsOptional<std::optional<V>> = true;

// Missing or mistyped key in a node that should have been resolved.
absl::Status UnresolvedKey(std::string_view name, std::string_view kind, const nlohmann::json& node);
}  // namespace internal

template <typename T>
class Binding {
 public:
  explicit Binding(std::string doc) : section_(std::move(doc)) {}

  // Declares key `name` filling `member` (bool, int64_t, double,
  // std::string, std::vector<int64_t>, std::vector<double>, or std::optional
  // of one of them — optional means nullable). The type comes from the
  // member and the default from T{}; `spec` gives the rest. A member with a
  // derive_seed_from spec is an int64_t whose key is nullable.
  template <typename V>
  Binding& Field(std::string name, V T::*member, KeySpec spec = {}) {
    using Traits = internal::FieldTraits<V>;
    spec.type = Traits::kType;
    spec.nullable = spec.nullable || internal::kIsOptional<V> || !spec.derive_seed_from.empty();
    if (spec.derive_seed_from.empty()) {
      const T defaults{};
      spec.default_value = DefaultJson(defaults.*member);
    } else {
      spec.default_value = nullptr;
    }
    section_.Key(name, std::move(spec));
    readers_.push_back([name, member](const nlohmann::json& node, T& out) -> absl::Status {
      const auto it = node.find(name);
      if (it == node.end()) return internal::UnresolvedKey(name, "missing", node);
      if (!internal::kIsOptional<V> && it->is_null()) return internal::UnresolvedKey(name, "null", node);
      try {
        out.*member = Traits::Get(*it);
      } catch (const nlohmann::json::exception&) {
        return internal::UnresolvedKey(name, std::string("of the wrong type (") + it->type_name() + ")", node);
      }
      return absl::OkStatus();
    });
    return *this;
  }

  // Declares the nested object `name` filling the struct `member`.
  template <typename U>
  Binding& Sub(std::string name, U T::*member, const Binding<U>& sub) {
    section_.Sub(name, sub.section());
    readers_.push_back([name, member, sub](const nlohmann::json& node, T& out) -> absl::Status {
      const auto it = node.find(name);
      if (it == node.end()) return internal::UnresolvedKey(name, "missing", node);
      auto value = sub.Read(*it);
      if (!value.ok()) return value.status();
      out.*member = *std::move(value);
      return absl::OkStatus();
    });
    return *this;
  }

  // Declares a key or section that fills no member (features that do not
  // exist yet: their spec says not_implemented).
  Binding& Unbound(std::string name, KeySpec spec) {
    section_.Key(std::move(name), std::move(spec));
    return *this;
  }
  Binding& Unbound(std::string name, Section section) {
    section_.Sub(std::move(name), std::move(section));
    return *this;
  }

  const Section& section() const { return section_; }

  // Fills a T from `node`, which Resolve produced from this section (every
  // key present and valid). An unresolved node is an error, never a throw.
  absl::StatusOr<T> Read(const nlohmann::json& node) const {
    if (!node.is_object()) return internal::UnresolvedKey("", "not an object", node);
    T out{};
    try {
      for (const auto& reader : readers_) {
        const absl::Status status = reader(node, out);
        if (!status.ok()) return status;
      }
    } catch (const nlohmann::json::exception& e) {
      return internal::UnresolvedKey(e.what(), "of the wrong type", node);
    }
    return out;
  }

 private:
  template <typename V>
  static nlohmann::json DefaultJson(const V& value) {
    if constexpr (internal::kIsOptional<V>) {
      return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
    } else {
      return nlohmann::json(value);
    }
  }

  Section section_;
  std::vector<std::function<absl::Status(const nlohmann::json&, T&)>> readers_;
};

}  // namespace tessera::config
