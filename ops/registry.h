#pragma once
// OpRegistry: name → OpSchema. Not a singleton: BuiltinOps() builds the one
// with Tessera's ops once (by explicit registration calls, so no op can be
// dropped by the linker) and hands it out read-only; embedders may build
// their own registry with extra ops. Immutable after construction, so safe to
// share across threads.

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/op_schema.h"

namespace tessera::ops {

class OpRegistry {
 public:
  // Validates the schema; a duplicate name or an invalid schema is an error.
  absl::Status Register(OpSchema schema);
  // Like Register, but a failure is a bug in Tessera (CHECK).
  void MustRegister(OpSchema schema);

  const OpSchema* Find(std::string_view name) const;
  // Error names the op and the closest registered name.
  absl::StatusOr<const OpSchema*> Get(std::string_view name) const;
  std::vector<std::string> Names() const;  // sorted
  size_t size() const { return schemas_.size(); }

 private:
  std::map<std::string, std::unique_ptr<OpSchema>, std::less<>> schemas_;
};

// Tessera's built-in ops.
const OpRegistry& BuiltinOps();
// Adds the built-in ops to `registry` (what BuiltinOps() is made of).
void RegisterBuiltinOps(OpRegistry& registry);

}  // namespace tessera::ops
