#include "ops/attr.h"

#include "core/status.h"
#include "core/text.h"

namespace tessera::ops {

std::string_view AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kBool: return "bool";
    case AttrType::kInt: return "int";
    case AttrType::kFloat: return "float";
    case AttrType::kString: return "string";
    case AttrType::kInts: return "ints";
    case AttrType::kDType: return "dtype";
  }
  return "?";
}

AttrType TypeOf(const AttrValue& value) { return static_cast<AttrType>(value.index()); }

std::string AttrValueToString(const AttrValue& value) {
  struct Visitor {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return StrCat(v); }
    std::string operator()(double v) const { return StrCat(v); }
    std::string operator()(const std::string& v) const { return StrCat("\"", v, "\""); }
    std::string operator()(const std::vector<int64_t>& v) const { return StrCat("[", Join(v, ", "), "]"); }
    std::string operator()(DType v) const { return std::string(DTypeName(v)); }
  };
  return std::visit(Visitor{}, value);
}

const AttrValue* AttrMap::Find(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

namespace {
template <typename T>
const T& Get(const AttrMap& map, std::string_view name) {
  const AttrValue* v = map.Find(name);
  TESSERA_CHECK(v != nullptr, "missing attribute '", name, "' in ", map.ToString());
  const T* typed = std::get_if<T>(v);
  TESSERA_CHECK(typed != nullptr, "attribute '", name, "' has type ", AttrTypeName(TypeOf(*v)));
  return *typed;
}
}  // namespace

bool AttrMap::Bool(std::string_view name) const { return Get<bool>(*this, name); }
int64_t AttrMap::Int(std::string_view name) const { return Get<int64_t>(*this, name); }
double AttrMap::Float(std::string_view name) const { return Get<double>(*this, name); }
const std::string& AttrMap::String(std::string_view name) const { return Get<std::string>(*this, name); }
const std::vector<int64_t>& AttrMap::Ints(std::string_view name) const {
  return Get<std::vector<int64_t>>(*this, name);
}
DType AttrMap::GetDType(std::string_view name) const { return Get<DType>(*this, name); }

std::string AttrMap::ToString() const {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : values_) {
    out += StrCat(first ? "" : ", ", name, "=", AttrValueToString(value));
    first = false;
  }
  return out + "}";
}

}  // namespace tessera::ops
