#pragma once
// OpSchema: everything Tessera knows about one op, registered once (DESIGN §5):
// inputs/outputs, attributes with defaults, shape/dtype inference, SBP
// signatures, a gradient rule that emits ops, kernels per device type, and an
// example input used to document signatures (`tessera ops`).
//
// Built with chained setters at registration; immutable afterwards, so it is
// safe to read from any thread.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/sbp.h"
#include "core/tensor.h"
#include "ops/attr.h"
#include "ops/grad.h"
#include "ops/kernel_context.h"

namespace tessera::ops {

struct ArgDef {
  std::string name;
  bool variadic = false;        // only the last input / output may be variadic
  bool differentiable = true;   // inputs: whether gradients flow into it
};

struct AttrDef {
  std::string name;
  AttrType type;
  std::optional<AttrValue> default_value;  // nullopt = required
};

// One valid combination: inputs laid out so → outputs laid out so (1-D; the
// scheduler forms N-D candidates per hierarchy axis).
struct SbpSignature {
  std::vector<Sbp> inputs;
  std::vector<Sbp> outputs;
  std::string ToString() const;  // "S(0), B -> S(0)"
  bool operator==(const SbpSignature&) const = default;
};

using InferFn = std::function<absl::StatusOr<std::vector<TensorMeta>>(const std::vector<TensorMeta>& inputs,
                                                                      const AttrMap& attrs)>;
// Signatures valid for these (logical) inputs over `parallel_num` devices on
// one axis. Split signatures that would need a shard to be empty are fine
// (balanced splits allow it); ones whose local computation would be wrong for
// this parallel_num (e.g. reshape across an uneven split) must be left out.
using SbpFn = std::function<std::vector<SbpSignature>(const std::vector<TensorMeta>& inputs,
                                                      const AttrMap& attrs, int64_t parallel_num)>;
// Whether an N-D combination of the per-axis signatures (the layouts of
// each input and output over every axis of `hierarchy`) is right for these
// logical inputs and outputs. Asked only over two or more axes: splits nest
// (core/sbp.h LocalSlice: an axis splits the previous axes' piece), so a
// combination of signatures each valid on its own axis can still be wrong
// for an op whose local computation depends on where a shard begins (a
// reshape across a split that the outer axis left uneven). Ops without one
// accept every combination.
using NdSbpCheckFn =
    std::function<bool(const std::vector<TensorMeta>& inputs, const std::vector<TensorMeta>& outputs,
                       const std::vector<NdSbp>& input_layouts, const std::vector<NdSbp>& output_layouts,
                       const std::vector<int64_t>& hierarchy)>;
using GradFn = std::function<void(GradBuilder& builder)>;
using KernelFn = std::function<absl::Status(KernelContext& ctx)>;
// Bytes of workspace one kernel call on `device` needs for these local
// inputs and outputs (0: none). The lowering records it per task and the
// memory planner places it in the device's arena (KernelContext::workspace).
using WorkspaceFn = std::function<int64_t(const std::vector<TensorMeta>& inputs,
                                          const std::vector<TensorMeta>& outputs, const AttrMap& attrs,
                                          DeviceType device)>;

struct OpExample {
  std::vector<TensorMeta> inputs;
  AttrMap attrs;
};

class OpSchema {
 public:
  explicit OpSchema(std::string name) : name_(std::move(name)) {}

  OpSchema& Doc(std::string doc);
  OpSchema& Input(std::string name);
  OpSchema& NonDifferentiableInput(std::string name);
  OpSchema& VariadicInput(std::string name);
  OpSchema& Output(std::string name);
  OpSchema& VariadicOutput(std::string name);
  OpSchema& Attr(std::string name, AttrType type, std::optional<AttrValue> default_value = std::nullopt);
  OpSchema& Infer(InferFn fn);
  OpSchema& Sbp(SbpFn fn);
  OpSchema& NdSbpCheck(NdSbpCheckFn fn);
  OpSchema& Grad(GradFn fn);
  OpSchema& Kernel(DeviceType device, KernelFn fn);
  OpSchema& Example(std::vector<TensorMeta> inputs, AttrMap attrs = {});
  // The kernel draws random numbers keyed by each element's global index
  // (the logical tensor's, from the input slices): under micro-batching the
  // scheduler gives it the micro-batch's place in the global batch
  // (TensorRef.micro_batch_stride), so the draws do not depend on how the
  // batch is cut. With `rate_attr`, it draws only where that float
  // attribute is not 0 (a dropout of rate 0 draws nothing).
  OpSchema& DrawsByGlobalIndex(std::string rate_attr = {});
  // The kernels use KernelContext::workspace (sized by `fn`) when it is
  // defined, and allocate what they need themselves when it is not.
  OpSchema& Workspace(WorkspaceFn fn);

  const std::string& name() const { return name_; }
  const std::string& doc() const { return doc_; }
  const std::vector<ArgDef>& inputs() const { return inputs_; }
  const std::vector<ArgDef>& outputs() const { return outputs_; }
  const std::vector<AttrDef>& attrs() const { return attrs_; }
  bool differentiable() const { return static_cast<bool>(grad_); }
  const GradFn& grad() const { return grad_; }
  const OpExample& example() const { return example_; }
  bool has_sbp() const { return static_cast<bool>(sbp_); }
  bool draws_by_global_index() const { return draws_by_global_index_; }
  // Whether a node of the op with `attrs` draws (draws_by_global_index,
  // its rate attribute, given or its default, not 0).
  bool Draws(const AttrMap& attrs) const;
  // 0 when the op declares no workspace (or needs none for these).
  int64_t WorkspaceBytes(const std::vector<TensorMeta>& inputs, const std::vector<TensorMeta>& outputs,
                         const AttrMap& attrs, DeviceType device) const;
  // Kernel for a device type, or null.
  const KernelFn* FindKernel(DeviceType device) const;
  std::vector<DeviceType> KernelDevices() const;
  // Whether input i (variadic inputs: any index past the last declared)
  // receives gradients.
  bool InputDifferentiable(int i) const;

  // Checks names and types against the declared attributes (ints are
  // accepted for float attributes) and fills in defaults. Errors name the op,
  // the attribute and, for unknown ones, the declared names.
  absl::StatusOr<AttrMap> CanonicalizeAttrs(const AttrMap& given) const;
  // Output metas for these inputs; errors name the op and every input's
  // dtype and shape. Attributes must be canonical. f64 inputs and outputs
  // are refused: f64 is host-side only (core/dtype.h). Inputs and outputs are
  // held to core/checked.h's size limits (an error names the tensor).
  absl::StatusOr<std::vector<TensorMeta>> InferMeta(const std::vector<TensorMeta>& inputs,
                                                    const AttrMap& attrs) const;
  // Empty when the op declares no signatures.
  std::vector<SbpSignature> SbpSignatures(const std::vector<TensorMeta>& inputs, const AttrMap& attrs,
                                          int64_t parallel_num) const;

  // NdSbpCheckFn's answer; true when the op declares none.
  bool NdSbpValid(const std::vector<TensorMeta>& inputs, const std::vector<TensorMeta>& outputs,
                  const std::vector<NdSbp>& input_layouts, const std::vector<NdSbp>& output_layouts,
                  const std::vector<int64_t>& hierarchy) const;

  // Registration-time consistency check (infer and a kernel present, example
  // infers, signatures match arities).
  absl::Status Validate() const;

 private:
  absl::Status CheckArity(const std::vector<TensorMeta>& inputs) const;

  std::string name_;
  std::string doc_;
  std::vector<ArgDef> inputs_, outputs_;
  std::vector<AttrDef> attrs_;
  InferFn infer_;
  SbpFn sbp_;
  NdSbpCheckFn nd_sbp_check_;
  GradFn grad_;
  std::map<DeviceType, KernelFn> kernels_;
  OpExample example_;
  bool draws_by_global_index_ = false;
  std::string draw_rate_attr_;
  WorkspaceFn workspace_;
};

// "x: f32(2, 3), w: f32(4, 5)" — for error messages.
std::string DescribeInputs(const OpSchema& schema, const std::vector<TensorMeta>& inputs);

}  // namespace tessera::ops
