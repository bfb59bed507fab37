#include "ops/registry.h"

#include "core/status.h"
#include "core/text.h"

namespace tessera::ops {

absl::Status OpRegistry::Register(OpSchema schema) {
  if (schemas_.count(schema.name())) {
    return absl::AlreadyExistsError(StrCat("op '", schema.name(), "' is registered twice"));
  }
  RETURN_IF_ERROR(schema.Validate());
  std::string name = schema.name();
  schemas_.emplace(std::move(name), std::make_unique<OpSchema>(std::move(schema)));
  return absl::OkStatus();
}

void OpRegistry::MustRegister(OpSchema schema) {
  const absl::Status status = Register(std::move(schema));
  TESSERA_CHECK(status.ok(), status.ToString());
}

const OpSchema* OpRegistry::Find(std::string_view name) const {
  auto it = schemas_.find(name);
  return it == schemas_.end() ? nullptr : it->second.get();
}

absl::StatusOr<const OpSchema*> OpRegistry::Get(std::string_view name) const {
  if (const OpSchema* s = Find(name)) return s;
  return absl::NotFoundError(StrCat("unknown op '", name, "'"));
}

std::vector<std::string> OpRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, schema] : schemas_) names.push_back(name);
  return names;
}

const OpRegistry& BuiltinOps() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry();
    RegisterBuiltinOps(*r);
    return r;
  }();
  return *registry;
}

}  // namespace tessera::ops
