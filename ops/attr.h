#pragma once
// Op attributes: a small typed map. Schemas declare each attribute's name,
// type and default; OpSchema::CanonicalizeAttrs checks what a caller passed
// (unknown names and wrong types are errors naming the op) and fills in
// defaults, so kernels read attributes with typed getters that cannot fail.

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace tessera::ops {

using AttrValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, DType>;
enum class AttrType : uint8_t { kBool, kInt, kFloat, kString, kInts, kDType };

std::string_view AttrTypeName(AttrType type);  // "bool", "int", "float", "string", "ints", "dtype"
AttrType TypeOf(const AttrValue& value);
std::string AttrValueToString(const AttrValue& value);

class AttrMap {
 public:
  AttrMap() = default;
  AttrMap(std::initializer_list<std::pair<const std::string, AttrValue>> values) : values_(values) {}

  bool Has(std::string_view name) const { return values_.find(name) != values_.end(); }
  void Set(std::string name, AttrValue value) { values_[std::move(name)] = std::move(value); }
  const AttrValue* Find(std::string_view name) const;

  // Typed getters. The attribute must exist with that type (true after
  // canonicalisation); a mismatch is a bug and CHECK-fails naming it.
  bool Bool(std::string_view name) const;
  int64_t Int(std::string_view name) const;
  double Float(std::string_view name) const;
  const std::string& String(std::string_view name) const;
  const std::vector<int64_t>& Ints(std::string_view name) const;
  DType GetDType(std::string_view name) const;

  const std::map<std::string, AttrValue, std::less<>>& values() const { return values_; }
  // "{axis=1, keepdim=true}"
  std::string ToString() const;
  bool operator==(const AttrMap&) const = default;

 private:
  std::map<std::string, AttrValue, std::less<>> values_;
};

}  // namespace tessera::ops
