// Text and Graphviz renderings of a Graph (Graph::ToText, Graph::ToDot).

#include <string>
#include <vector>

#include "core/text.h"
#include "graph/graph.h"

namespace tessera::graph {
namespace {

// "k=v, k=v" for the attributes of `attrs` that differ from the schema's
// defaults (all of them when there is no schema); `skip` names ones to omit.
std::string AttrList(const ops::AttrMap& attrs, const ops::OpSchema* schema,
                     const std::vector<std::string>& skip = {}) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : attrs.values()) {
    bool omit = false;
    for (const std::string& s : skip) omit = omit || s == name;
    if (schema != nullptr) {
      for (const ops::AttrDef& def : schema->attrs()) {
        if (def.name == name && def.default_value.has_value() && *def.default_value == value) omit = true;
      }
    }
    if (!omit) parts.push_back(StrCat(name, "=", ops::AttrValueToString(value)));
  }
  return Join(parts, ", ");
}

std::string Refs(const std::vector<ValueId>& ids) {
  std::vector<std::string> parts;
  for (ValueId id : ids) parts.push_back(ValueRef(id));
  return Join(parts, ", ");
}

std::string HintSuffix(const Value& v) {
  std::string out;
  if (v.placement_hint) out += StrCat(" @", v.placement_hint->ToString());
  if (v.sbp_hint) out += StrCat(" ", NdSbpToString(*v.sbp_hint));
  return out;
}

std::string DotEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string Graph::ToText() const {
  std::string out;
  for (const Node& n : nodes_) {
    out += StrCat(Refs(n.outputs), " = ");
    std::string attrs;
    switch (n.kind) {
      case NodeKind::kInput:
        out += StrCat("input \"", value(n.outputs.front()).name, "\"");
        break;
      case NodeKind::kVariable: {
        const VariableInfo& info = *n.variable;
        const std::string init_attrs =
            AttrList(info.init.attrs, registry_->Find(info.init.op), {"shape", "dtype"});
        out += StrCat("variable \"", value(n.outputs.front()).name, "\"");
        attrs = StrCat("init=", info.init.op, "(", init_attrs, ")");
        if (!info.trainable) attrs += ", trainable=false";
        if (info.weight_decay.has_value()) attrs += StrCat(", weight_decay=", *info.weight_decay);
        break;
      }
      case NodeKind::kOp:
      case NodeKind::kRepeat:
      case NodeKind::kAcc:
        out += StrCat(n.op, "(", Refs(n.inputs), ")");
        attrs = AttrList(n.attrs, schema(n));
        break;
    }
    if (!attrs.empty()) out += StrCat(" {", attrs, "}");
    std::vector<std::string> metas;
    for (ValueId id : n.outputs) metas.push_back(value(id).meta.ToString() + HintSuffix(value(id)));
    out += StrCat(" : ", Join(metas, ", "));
    const bool layered = n.layer_idx != kUnassignedLayer;
    if (layered) out += StrCat("  # layer ", n.layer_idx);
    if (!n.scope.empty()) out += StrCat(layered ? " " : "  # ", "scope ", n.scope);
    out += "\n";
  }
  for (ValueId id : losses_) out += StrCat("loss ", ValueRef(id), "\n");
  for (const auto& [name, id] : fetches_) out += StrCat("fetch \"", name, "\" = ", ValueRef(id), "\n");
  for (const auto& [var, new_value] : variable_updates_) {
    out += StrCat("update ", ValueRef(var), " \"", value(var).name, "\" <- ", ValueRef(new_value), "\n");
  }
  return out;
}

std::string Graph::ToDot() const {
  std::string out = "digraph tessera {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n";
  for (const Node& n : nodes_) {
    std::string label, shape;
    switch (n.kind) {
      case NodeKind::kInput:
        label = DotEscape(StrCat("input ", value(n.outputs.front()).name));
        shape = "parallelogram";
        break;
      case NodeKind::kVariable:
        label = DotEscape(StrCat("variable ", value(n.outputs.front()).name));
        shape = "ellipse";
        break;
      case NodeKind::kOp:
      case NodeKind::kRepeat:
      case NodeKind::kAcc: {
        label = DotEscape(n.op);
        const std::string attrs = AttrList(n.attrs, schema(n));
        if (!attrs.empty()) label += StrCat("\\n{", DotEscape(attrs), "}");
        shape = n.kind == NodeKind::kOp ? "box" : "box, style=rounded";
        break;
      }
    }
    out += StrCat("  n", n.id, " [label=\"", label, "\", shape=", shape, "];\n");
  }
  for (const Node& n : nodes_) {
    for (ValueId in : n.inputs) {
      const Value& v = value(in);
      out += StrCat("  n", v.producer, " -> n", n.id, " [label=\"", ValueRef(in), " ", v.meta.ToString(), "\"];\n");
    }
  }
  // Roots as plain text nodes so the picture shows what the graph is for.
  int root = 0;
  auto add_root = [&](const std::string& label, ValueId id) {
    out += StrCat("  r", root, " [label=\"", DotEscape(label), "\", shape=plaintext];\n");
    out += StrCat("  n", value(id).producer, " -> r", root, " [style=dashed];\n");
    ++root;
  };
  for (ValueId id : losses_) add_root("loss", id);
  for (const auto& [name, id] : fetches_) add_root(StrCat("fetch ", name), id);
  for (const auto& [var, new_value] : variable_updates_) add_root(StrCat("update ", value(var).name), new_value);
  out += "}\n";
  return out;
}

}  // namespace tessera::graph
