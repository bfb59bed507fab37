#pragma once
// Registry<T>: builds objects of base type T from config nodes by their
// "_target_" name, e.g. {"_target_": "AdamW", "lr": 1e-4} → an AdamW.
//
// Not a singleton: whoever owns the set of, say, optimizers owns a
// Registry<Optimizer> and passes it where objects are built. Register() is not
// thread-safe; once registration is done, the const methods (Create, Names)
// may be called from any number of threads. Created objects belong to the
// caller.

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/strings.h"

namespace tessera {

template <typename T>
class Registry {
 public:
  // Receives the whole config node, "_target_" included. A factory may throw
  // nlohmann::json::exception (e.g. from args.at("lr")); Create turns it into
  // an InvalidArgument status naming the target.
  using Factory = std::function<absl::StatusOr<std::unique_ptr<T>>(const nlohmann::json& args)>;

  // `kind` names what is built ("optimizer", "lr scheduler") in messages.
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  // AlreadyExists if `name` is taken; InvalidArgument for an empty name or
  // factory.
  [[nodiscard]] absl::Status Register(std::string name, Factory factory) {
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot register a ", kind_, " with an empty name"));
    }
    if (!factory) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot register ", kind_, " '", name, "' without a factory"));
    }
    if (factories_.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat(kind_, " '", name, "' is already registered"));
    }
    factories_.emplace(std::move(name), std::move(factory));
    return absl::OkStatus();
  }

  // Builds the object that `node["_target_"]` names. InvalidArgument if the
  // node has no string "_target_"; NotFound, with the closest registered
  // name, for an unknown target; otherwise whatever the factory returns (a
  // factory returning OK with a null pointer is reported as Internal).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<T>> Create(const nlohmann::json& node) const {
    const auto target_it = node.is_object() ? node.find("_target_") : node.end();
    if (!node.is_object() || target_it == node.end() || !target_it->is_string()) {
      std::string got = node.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (got.size() > 80) got = got.substr(0, 80) + "...";
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot build a ", kind_, ": the config node needs a string \"_target_\", got ", got));
    }
    const std::string& target = target_it->template get_ref<const std::string&>();
    const auto factory_it = factories_.find(target);
    if (factory_it == factories_.end()) {
      const std::vector<std::string> names = Names();
      const std::optional<std::string> closest = ClosestMatch(target, names);
      return absl::NotFoundError(
          absl::StrCat("unknown ", kind_, " _target_ '", target, "'",
                       closest ? absl::StrCat("; did you mean '", *closest, "'?") : std::string(),
                       " (registered: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
    }
    absl::StatusOr<std::unique_ptr<T>> created;
    try {
      created = factory_it->second(node);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad arguments for ", kind_, " '", target, "': ", e.what()));
    }
    if (created.ok() && *created == nullptr) {
      return absl::InternalError(
          absl::StrCat("factory for ", kind_, " '", target, "' returned null"));
    }
    return created;
  }

  // Registered names, sorted.
  [[nodiscard]] std::vector<std::string> Names() const {
    std::vector<std::string> names;
    names.reserve(factories_.size());
    for (const auto& [name, factory] : factories_) names.push_back(name);
    return names;
  }

 private:
  std::string kind_;
  std::map<std::string, Factory, std::less<>> factories_;
};

}  // namespace tessera
