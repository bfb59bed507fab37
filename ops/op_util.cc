#include "ops/op_util.h"

#include "core/text.h"

namespace tessera::ops {

absl::Status ExpectDType(const TensorMeta& meta, DType dtype, std::string_view input_name) {
  if (meta.dtype == dtype) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("input '", input_name, "' must be ", DTypeName(dtype), ", got ", DTypeName(meta.dtype)));
}

absl::Status ExpectRank(const TensorMeta& meta, int rank, std::string_view input_name, bool at_least) {
  if (meta.shape.rank() == rank || (at_least && meta.shape.rank() >= rank)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("input '", input_name, "' must have rank ", at_least ? "at least " : "",
                                           rank, ", got shape ", meta.shape.ToString()));
}

std::vector<SbpSignature> ElementwiseSignatures(int num_inputs, int num_outputs, int rank, bool linear_in_all) {
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis < rank; ++axis) {
    sigs.push_back({std::vector<Sbp>(static_cast<size_t>(num_inputs), Sbp::Split(axis)),
                    std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Split(axis))});
  }
  sigs.push_back({std::vector<Sbp>(static_cast<size_t>(num_inputs), Sbp::Broadcast()),
                  std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::Broadcast())});
  if (linear_in_all) {
    sigs.push_back({std::vector<Sbp>(static_cast<size_t>(num_inputs), Sbp::PartialSum()),
                    std::vector<Sbp>(static_cast<size_t>(num_outputs), Sbp::PartialSum())});
  }
  return sigs;
}

std::vector<SbpSignature> BroadcastBinarySignatures(const Shape& a, const Shape& b, PartialRules partial) {
  std::vector<SbpSignature> sigs;
  const int rank = std::max(a.rank(), b.rank());
  auto input_sbp = [rank](const Shape& s, int out_axis) {
    const int axis = out_axis - (rank - s.rank());
    if (axis < 0 || s[axis] == 1) return Sbp::Broadcast();
    return Sbp::Split(axis);
  };
  for (int axis = 0; axis < rank; ++axis) {
    const Sbp sa = input_sbp(a, axis), sb = input_sbp(b, axis);
    if (sa.is_broadcast() && sb.is_broadcast()) continue;  // output extent 1 along it: nothing to split
    sigs.push_back({{sa, sb}, {Sbp::Split(axis)}});
  }
  sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast()}, {Sbp::Broadcast()}});
  if (partial.both_partial) sigs.push_back({{Sbp::PartialSum(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  if (partial.first_partial) sigs.push_back({{Sbp::PartialSum(), Sbp::Broadcast()}, {Sbp::PartialSum()}});
  if (partial.second_partial) sigs.push_back({{Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return sigs;
}

std::vector<SbpSignature> BiasSignatures(const std::vector<TensorMeta>& in, bool linear) {
  const int rank = in[0].shape.rank();
  const size_t n = in.size();
  std::vector<SbpSignature> sigs;
  for (int axis = 0; axis + 1 < rank; ++axis) {
    std::vector<Sbp> ins(n, Sbp::Split(axis));
    ins[1] = Sbp::Broadcast();
    sigs.push_back({ins, {Sbp::Split(axis)}});
  }
  std::vector<Sbp> channel(n, Sbp::Split(rank - 1));
  channel[1] = Sbp::Split(0);
  sigs.push_back({channel, {Sbp::Split(rank - 1)}});
  sigs.push_back({std::vector<Sbp>(n, Sbp::Broadcast()), {Sbp::Broadcast()}});
  if (linear) sigs.push_back({{Sbp::PartialSum(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return sigs;
}

}  // namespace tessera::ops
