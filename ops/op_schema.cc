#include "ops/op_schema.h"

#include <algorithm>

#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::ops {
namespace {

// f64 is a host-side dtype (core/dtype.h): no op has f64 kernels, so none
// takes or makes f64 tensors. Returns `metas` when none is f64.
absl::StatusOr<std::vector<TensorMeta>> RefuseF64(std::vector<TensorMeta> metas, std::string_view what) {
  for (size_t i = 0; i < metas.size(); ++i) {
    if (metas[i].dtype == DType::kF64) {
      return absl::UnimplementedError(
          StrCat(what, " ", i, " is f64: no op has f64 kernels (f64 is a host-side dtype)"));
    }
  }
  return metas;
}

}  // namespace

TensorSlice KernelContext::input_slice(int i) const {
  if (input_slices.empty()) return TensorSlice::Whole(input(i).shape());
  return input_slices[static_cast<size_t>(i)];
}

TensorSlice KernelContext::output_slice(int i) const {
  if (output_slices.empty()) return TensorSlice::Whole(output(i).shape());
  return output_slices[static_cast<size_t>(i)];
}

std::string SbpSignature::ToString() const {
  auto join = [](const std::vector<tessera::Sbp>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += StrCat(i ? ", " : "", v[i].ToString());
    return s;
  };
  return StrCat(join(inputs), " -> ", join(outputs));
}

OpSchema& OpSchema::Doc(std::string doc) { doc_ = std::move(doc); return *this; }
OpSchema& OpSchema::DrawsByGlobalIndex(std::string rate_attr) {
  draws_by_global_index_ = true;
  draw_rate_attr_ = std::move(rate_attr);
  return *this;
}

bool OpSchema::Draws(const AttrMap& attrs) const {
  if (!draws_by_global_index_) return false;
  if (draw_rate_attr_.empty()) return true;
  const AttrValue* rate = attrs.Find(draw_rate_attr_);
  if (rate == nullptr) {
    for (const AttrDef& def : attrs_) {
      if (def.name == draw_rate_attr_ && def.default_value) rate = &*def.default_value;
    }
  }
  return rate == nullptr || !std::holds_alternative<double>(*rate) || std::get<double>(*rate) != 0.0;
}
OpSchema& OpSchema::Workspace(WorkspaceFn fn) {
  workspace_ = std::move(fn);
  return *this;
}

int64_t OpSchema::WorkspaceBytes(const std::vector<TensorMeta>& inputs, const std::vector<TensorMeta>& outputs,
                                 const AttrMap& attrs, DeviceType device) const {
  return workspace_ ? std::max<int64_t>(0, workspace_(inputs, outputs, attrs, device)) : 0;
}
OpSchema& OpSchema::Input(std::string name) { inputs_.push_back({std::move(name), false, true}); return *this; }
OpSchema& OpSchema::NonDifferentiableInput(std::string name) {
  inputs_.push_back({std::move(name), false, false});
  return *this;
}
OpSchema& OpSchema::VariadicInput(std::string name) { inputs_.push_back({std::move(name), true, true}); return *this; }
OpSchema& OpSchema::Output(std::string name) { outputs_.push_back({std::move(name), false, true}); return *this; }
OpSchema& OpSchema::VariadicOutput(std::string name) {
  outputs_.push_back({std::move(name), true, true});
  return *this;
}
OpSchema& OpSchema::Attr(std::string name, AttrType type, std::optional<AttrValue> default_value) {
  if (default_value && type == AttrType::kFloat && std::holds_alternative<int64_t>(*default_value)) {
    default_value = static_cast<double>(std::get<int64_t>(*default_value));
  }
  attrs_.push_back({std::move(name), type, std::move(default_value)});
  return *this;
}
OpSchema& OpSchema::Infer(InferFn fn) { infer_ = std::move(fn); return *this; }
OpSchema& OpSchema::Sbp(SbpFn fn) { sbp_ = std::move(fn); return *this; }
OpSchema& OpSchema::NdSbpCheck(NdSbpCheckFn fn) {
  nd_sbp_check_ = std::move(fn);
  return *this;
}
OpSchema& OpSchema::Grad(GradFn fn) { grad_ = std::move(fn); return *this; }
OpSchema& OpSchema::Kernel(DeviceType device, KernelFn fn) { kernels_[device] = std::move(fn); return *this; }
OpSchema& OpSchema::Example(std::vector<TensorMeta> inputs, AttrMap attrs) {
  example_ = OpExample{std::move(inputs), std::move(attrs)};
  return *this;
}

const KernelFn* OpSchema::FindKernel(DeviceType device) const {
  auto it = kernels_.find(device);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<DeviceType> OpSchema::KernelDevices() const {
  std::vector<DeviceType> out;
  for (const auto& [device, fn] : kernels_) out.push_back(device);
  return out;
}

bool OpSchema::InputDifferentiable(int i) const {
  if (inputs_.empty()) return false;
  const size_t index = std::min(static_cast<size_t>(i), inputs_.size() - 1);
  return inputs_[index].differentiable;
}

absl::StatusOr<AttrMap> OpSchema::CanonicalizeAttrs(const AttrMap& given) const {
  AttrMap out;
  for (const auto& [name, value] : given.values()) {
    const AttrDef* def = nullptr;
    for (const AttrDef& d : attrs_) {
      if (d.name == name) def = &d;
    }
    if (def == nullptr) {
      std::vector<std::string> names;
      for (const AttrDef& d : attrs_) names.push_back(d.name);
      return absl::InvalidArgumentError(StrCat("op '", name_, "': unknown attribute '", name, "' (attributes: ",
                                               names.empty() ? "none" : Join(names, ", "), ")"));
    }
    AttrValue v = value;
    if (def->type == AttrType::kFloat && std::holds_alternative<int64_t>(v)) {
      v = static_cast<double>(std::get<int64_t>(v));
    }
    if (TypeOf(v) != def->type) {
      return absl::InvalidArgumentError(StrCat("op '", name_, "': attribute '", name, "' must be ",
                                               AttrTypeName(def->type), ", got ", AttrTypeName(TypeOf(v)), " ",
                                               AttrValueToString(v)));
    }
    out.Set(name, std::move(v));
  }
  for (const AttrDef& d : attrs_) {
    if (out.Has(d.name)) continue;
    if (!d.default_value) {
      return absl::InvalidArgumentError(StrCat("op '", name_, "': missing required attribute '", d.name,
                                               "' (", AttrTypeName(d.type), ")"));
    }
    out.Set(d.name, *d.default_value);
  }
  return out;
}

std::string DescribeInputs(const OpSchema& schema, const std::vector<TensorMeta>& inputs) {
  std::string out;
  const auto& defs = schema.inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = defs.empty() ? StrCat("in", i) : defs[std::min(i, defs.size() - 1)].name;
    if (!defs.empty() && i >= defs.size() - 1 && defs.back().variadic) name += StrCat("[", i - (defs.size() - 1), "]");
    out += StrCat(i ? ", " : "", name, ": ", inputs[i].ToString());
  }
  return out;
}

absl::Status OpSchema::CheckArity(const std::vector<TensorMeta>& inputs) const {
  const bool variadic = !inputs_.empty() && inputs_.back().variadic;
  const size_t fixed = variadic ? inputs_.size() - 1 : inputs_.size();
  if ((!variadic && inputs.size() != fixed) || (variadic && inputs.size() < fixed + 1)) {
    return absl::InvalidArgumentError(StrCat("op '", name_, "': expects ", variadic ? "at least " : "",
                                             variadic ? fixed + 1 : fixed, " inputs, got ", inputs.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorMeta>> OpSchema::InferMeta(const std::vector<TensorMeta>& inputs,
                                                            const AttrMap& attrs) const {
  RETURN_IF_ERROR(CheckArity(inputs));
  // Inference functions may multiply the extents of their inputs; outputs
  // made from attributes (shapes, counts) may be any size until checked.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (auto bytes = CheckedByteSize(inputs[i]); !bytes.ok()) {
      return absl::InvalidArgumentError(StrCat("op '", name_, "': input ", i, ": ", bytes.status().message()));
    }
  }
  absl::StatusOr<std::vector<TensorMeta>> result = RefuseF64(inputs, "input");
  if (result.ok()) result = infer_(inputs, attrs);
  if (result.ok()) result = RefuseF64(*std::move(result), "output");
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        StrCat("op '", name_, "' (", DescribeInputs(*this, inputs), "): ", result.status().message()));
  }
  for (size_t i = 0; i < result->size(); ++i) {
    if (auto bytes = CheckedByteSize((*result)[i]); !bytes.ok()) {
      const std::string output = outputs_.empty() ? StrCat(i) : outputs_[std::min(i, outputs_.size() - 1)].name;
      return absl::InvalidArgumentError(StrCat("op '", name_, "' (", DescribeInputs(*this, inputs), "): output ",
                                               output, ": ", bytes.status().message()));
    }
  }
  return result;
}

std::vector<SbpSignature> OpSchema::SbpSignatures(const std::vector<TensorMeta>& inputs, const AttrMap& attrs,
                                                  int64_t parallel_num) const {
  if (!sbp_) return {};
  return sbp_(inputs, attrs, parallel_num);
}

bool OpSchema::NdSbpValid(const std::vector<TensorMeta>& inputs, const std::vector<TensorMeta>& outputs,
                          const std::vector<NdSbp>& input_layouts, const std::vector<NdSbp>& output_layouts,
                          const std::vector<int64_t>& hierarchy) const {
  return !nd_sbp_check_ || nd_sbp_check_(inputs, outputs, input_layouts, output_layouts, hierarchy);
}

absl::Status OpSchema::Validate() const {
  if (!infer_) return absl::InternalError(StrCat("op '", name_, "': no shape inference"));
  if (kernels_.empty()) return absl::InternalError(StrCat("op '", name_, "': no kernel"));
  for (size_t i = 0; i + 1 < inputs_.size(); ++i) {
    if (inputs_[i].variadic) return absl::InternalError(StrCat("op '", name_, "': only the last input may be variadic"));
  }
  ASSIGN_OR_RETURN(AttrMap attrs, CanonicalizeAttrs(example_.attrs));
  ASSIGN_OR_RETURN(auto outputs, InferMeta(example_.inputs, attrs));
  for (const SbpSignature& sig : SbpSignatures(example_.inputs, attrs, 2)) {
    if (sig.inputs.size() != example_.inputs.size() || sig.outputs.size() != outputs.size()) {
      return absl::InternalError(StrCat("op '", name_, "': signature '", sig.ToString(), "' does not match ",
                                        example_.inputs.size(), " inputs and ", outputs.size(), " outputs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::ops
