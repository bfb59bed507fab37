#include "nn/module.h"

#include <utility>

#include "core/status.h"
#include "core/text.h"

namespace tessera::nn {

NdSbp Replicated() { return {Sbp::Broadcast(), Sbp::Broadcast()}; }
NdSbp TensorParallelSplit(int axis) { return {Sbp::Broadcast(), Sbp::Split(axis)}; }
NdSbp BatchSplit() { return {Sbp::Split(0), Sbp::Broadcast()}; }

int64_t StreamKey(std::string_view name) {
  uint32_t hash = 2166136261u;  // FNV-1a, 32 bits
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 16777619u;
  }
  return static_cast<int64_t>(hash);
}

std::string Module::full_name() const {
  if (parent_ == nullptr) return name_;
  std::string prefix = parent_->full_name();
  return prefix.empty() ? name_ : StrCat(prefix, ".", name_);
}

RandomSeeds Module::seeds() const {
  for (const Module* m = this; m != nullptr; m = m->parent_) {
    if (m->seeds_) return *m->seeds_;
  }
  return RandomSeeds{};
}

std::vector<NamedParameter> Module::NamedParameters() const {
  std::vector<NamedParameter> out;
  const std::string prefix = full_name();
  for (size_t i = 0; i < specs_.size(); ++i) {
    out.push_back({prefix.empty() ? specs_[i].name : StrCat(prefix, ".", specs_[i].name), &specs_[i], values_[i]});
  }
  for (const auto& [name, child] : children_) {
    std::vector<NamedParameter> sub = child->NamedParameters();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

Sym Module::parameter(std::string_view local_name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == local_name) return values_[i];
  }
  TESSERA_CHECK(false, "module '", full_name(), "' declares no parameter '", local_name, "'");
  return Sym();
}

void Module::RegisterModule(std::string name, Module& child) {
  TESSERA_CHECK(child.parent_ == nullptr, "module '", name, "' is already registered under '",
                child.parent_ == nullptr ? std::string() : child.parent_->full_name(), "'");
  child.name_ = name;
  child.parent_ = this;
  children_.emplace_back(std::move(name), &child);
}

void Module::DeclareParameter(ParameterSpec spec) {
  specs_.push_back(std::move(spec));
  values_.emplace_back();
}

bool Module::Bind(GraphBuilder& b) {
  if (!b.status().ok()) return false;
  if (builder_ == nullptr) builder_ = &b;
  if (builder_ != &b) {
    b.Fail(absl::FailedPreconditionError(StrCat("module '", full_name(),
                                                "' was already used in another GraphBuilder; build a fresh "
                                                "module tree per graph")));
    return false;
  }
  return true;
}

void Module::MaterializeOwn(GraphBuilder& b) {
  const std::string prefix = full_name();
  const RandomSeeds seeds = this->seeds();
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (values_[i].valid() || !b.status().ok()) continue;
    const ParameterSpec& spec = specs_[i];
    const std::string name = prefix.empty() ? spec.name : StrCat(prefix, ".", spec.name);
    graph::InitRule init;
    switch (spec.init.kind) {
      case ParameterInit::Kind::kNormal:
        init = graph::InitRule::Normal(spec.init.mean, spec.init.std, seeds.init, StreamKey(name));
        break;
      case ParameterInit::Kind::kZeros:
        init = graph::InitRule::Zeros();
        break;
      case ParameterInit::Kind::kOnes:
        init = graph::InitRule::Ones();
        break;
    }
    // Straight into the graph, so the name is the module path whatever
    // builder scope the caller is in.
    auto id = b.mutable_graph().AddVariable(
        name, spec.shape, init,
        {.weight_decay = spec.weight_decay, .sbp = spec.sbp, .layer_idx = layer_idx_, .scope = prefix});
    if (!id.ok()) {
      b.Fail(id.status());
      return;
    }
    values_[i] = Sym(&b, *id);
  }
}

void Module::Materialize(GraphBuilder& b) {
  if (!Bind(b)) return;
  MaterializeOwn(b);
  for (const auto& [name, child] : children_) child->Materialize(b);
}

GraphBuilder* Module::Prepare(const Sym& x) {
  GraphBuilder* b = x.builder();
  if (b == nullptr || !x.valid() || !Bind(*b)) return nullptr;
  MaterializeOwn(*b);
  return b->status().ok() ? b : nullptr;
}

}  // namespace tessera::nn
