#include "ops/describe.h"

#include "core/text.h"

namespace tessera::ops {
namespace {

constexpr int64_t kExampleParallelNum = 2;

std::string ArgName(const ArgDef& arg) {
  return StrCat(arg.name, arg.variadic ? "..." : "", arg.differentiable ? "" : " (no grad)");
}

}  // namespace

nlohmann::json DescribeOpsJson(const OpRegistry& registry) {
  nlohmann::json ops = nlohmann::json::array();
  for (const std::string& name : registry.Names()) {
    const OpSchema& s = *registry.Find(name);
    nlohmann::json op;
    op["name"] = name;
    op["doc"] = s.doc();
    op["inputs"] = nlohmann::json::array();
    for (const ArgDef& a : s.inputs()) {
      op["inputs"].push_back({{"name", a.name}, {"variadic", a.variadic}, {"differentiable", a.differentiable}});
    }
    op["outputs"] = nlohmann::json::array();
    for (const ArgDef& a : s.outputs()) op["outputs"].push_back({{"name", a.name}, {"variadic", a.variadic}});
    op["attrs"] = nlohmann::json::array();
    for (const AttrDef& a : s.attrs()) {
      nlohmann::json attr = {{"name", a.name}, {"type", AttrTypeName(a.type)}};
      attr["default"] = a.default_value ? nlohmann::json(AttrValueToString(*a.default_value)) : nlohmann::json(nullptr);
      op["attrs"].push_back(attr);
    }
    op["kernels"] = nlohmann::json::array();
    for (DeviceType d : s.KernelDevices()) op["kernels"].push_back(DeviceTypeName(d));
    op["differentiable"] = s.differentiable();
    op["draws_by_global_index"] = s.draws_by_global_index();
    nlohmann::json sbp;
    nlohmann::json example_inputs = nlohmann::json::array();
    for (const TensorMeta& m : s.example().inputs) example_inputs.push_back(m.ToString());
    sbp["example_inputs"] = example_inputs;
    sbp["parallel_num"] = kExampleParallelNum;
    sbp["signatures"] = nlohmann::json::array();
    if (auto attrs = s.CanonicalizeAttrs(s.example().attrs); attrs.ok()) {
      sbp["example_attrs"] = attrs->ToString();
      for (const SbpSignature& sig : s.SbpSignatures(s.example().inputs, *attrs, kExampleParallelNum)) {
        sbp["signatures"].push_back(sig.ToString());
      }
    }
    op["sbp"] = sbp;
    ops.push_back(op);
  }
  return {{"count", ops.size()}, {"ops", ops}};
}

std::string DescribeOpsText(const OpRegistry& registry) {
  const nlohmann::json all = DescribeOpsJson(registry);
  std::string out = StrCat(all["count"].get<size_t>(), " ops. Signatures are shown for each op's example inputs over ",
                           kExampleParallelNum, " devices.\n\n");
  for (const nlohmann::json& op : all["ops"]) {
    const OpSchema& s = *registry.Find(op["name"].get<std::string>());
    std::vector<std::string> inputs, outputs, attrs, kernels;
    for (const ArgDef& a : s.inputs()) inputs.push_back(ArgName(a));
    for (const ArgDef& a : s.outputs()) outputs.push_back(ArgName(ArgDef{a.name, a.variadic, true}));
    for (const nlohmann::json& a : op["attrs"]) {
      attrs.push_back(StrCat(a["name"].get<std::string>(), ": ", a["type"].get<std::string>(),
                             a["default"].is_null() ? "" : StrCat(" = ", a["default"].get<std::string>())));
    }
    for (const nlohmann::json& k : op["kernels"]) kernels.push_back(k.get<std::string>());
    out += StrCat(op["name"].get<std::string>(), "(", Join(inputs, ", "), ") -> (", Join(outputs, ", "), ")\n");
    if (!s.doc().empty()) out += StrCat("    ", s.doc(), "\n");
    if (!attrs.empty()) out += StrCat("    attrs: ", Join(attrs, ", "), "\n");
    out += StrCat("    kernels: ", Join(kernels, ", "), "   gradient: ", s.differentiable() ? "yes" : "no",
                  s.draws_by_global_index() ? "   random: by global element index" : "", "\n");
    std::vector<std::string> example;
    for (const nlohmann::json& e : op["sbp"]["example_inputs"]) example.push_back(e.get<std::string>());
    out += StrCat("    sbp for (", Join(example, ", "), "):\n");
    for (const nlohmann::json& sig : op["sbp"]["signatures"]) out += StrCat("      ", sig.get<std::string>(), "\n");
  }
  return out;
}

}  // namespace tessera::ops
