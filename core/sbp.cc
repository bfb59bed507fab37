#include "core/sbp.h"

#include <utility>
#include <vector>

#include "core/text.h"

namespace tessera {

std::string Sbp::ToString() const {
  switch (kind_) {
    case Kind::kSplit: return StrCat("S(", axis_, ")");
    case Kind::kBroadcast: return "B";
    case Kind::kPartialSum: return "P";
    case Kind::kPartialMax: return "P(max)";
  }
  return "?";
}

absl::StatusOr<Sbp> ParseSbp(std::string_view text) {
  std::string compact;
  for (char c : text) {
    if (c != ' ' && c != '\t') compact.push_back(c);
  }
  if (compact == "B") return Sbp::Broadcast();
  if (compact == "P" || compact == "P(sum)") return Sbp::PartialSum();
  if (compact == "P(max)") return Sbp::PartialMax();
  std::string_view rest = compact;
  if (ConsumePrefix(&rest, "S")) {
    if (ConsumePrefix(&rest, "(") && !ConsumeSuffix(&rest, ")")) rest = "";
    int axis = -1;
    if (ParseInteger(rest, &axis) && axis >= 0) return Sbp::Split(axis);
  }
  return absl::InvalidArgumentError(
      StrCat("bad SBP '", text, "' (expected S(axis), B, P or P(max))"));
}

std::string NdSbpToString(const NdSbp& nd_sbp) {
  std::string out = "(";
  for (size_t i = 0; i < nd_sbp.size(); ++i) out += StrCat(i ? ", " : "", nd_sbp[i].ToString());
  return out + ")";
}

absl::StatusOr<NdSbp> ParseNdSbp(std::string_view text) {
  std::string_view body = StripWhitespace(text);
  if (ConsumePrefix(&body, "(")) {
    if (!ConsumeSuffix(&body, ")")) {
      return absl::InvalidArgumentError(StrCat("bad nd-SBP '", text, "': unbalanced parentheses"));
    }
  }
  // Split on commas that are not inside S(...) / P(...) parentheses.
  NdSbp out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      auto sbp = ParseSbp(body.substr(start, i - start));
      if (!sbp.ok()) {
        return absl::InvalidArgumentError(StrCat("bad nd-SBP '", text, "': ", sbp.status().message()));
      }
      out.push_back(*sbp);
      start = i + 1;
    } else if (body[i] == '(') {
      ++depth;
    } else if (body[i] == ')') {
      --depth;
    }
  }
  return out;
}

Range BalancedSplit(int64_t n, int64_t parts, int64_t index) {
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  Range r;
  r.size = base + (index < extra ? 1 : 0);
  r.offset = index * base + (index < extra ? index : extra);
  return r;
}

TensorSlice TensorSlice::Whole(const Shape& shape) {
  return TensorSlice{shape, std::vector<int64_t>(static_cast<size_t>(shape.rank()), 0), shape};
}

absl::StatusOr<TensorSlice> LocalSlice(const Shape& logical, const NdSbp& nd_sbp,
                                       const std::vector<int64_t>& hierarchy, int64_t parallel_id) {
  if (nd_sbp.size() != hierarchy.size()) {
    return absl::InvalidArgumentError(StrCat("nd-SBP ", NdSbpToString(nd_sbp), " has ", nd_sbp.size(),
                                                   " axes but the hierarchy has ", hierarchy.size()));
  }
  TensorSlice slice = TensorSlice::Whole(logical);
  // Row-major coordinates of parallel_id in the hierarchy.
  std::vector<int64_t> coords(hierarchy.size());
  int64_t rem = parallel_id;
  for (int i = static_cast<int>(hierarchy.size()) - 1; i >= 0; --i) {
    coords[static_cast<size_t>(i)] = rem % hierarchy[static_cast<size_t>(i)];
    rem /= hierarchy[static_cast<size_t>(i)];
  }
  for (size_t i = 0; i < nd_sbp.size(); ++i) {
    const Sbp& sbp = nd_sbp[i];
    if (!sbp.is_split()) continue;
    if (sbp.axis() >= logical.rank()) {
      return absl::InvalidArgumentError(StrCat("SBP ", sbp.ToString(), " splits axis ", sbp.axis(),
                                                     " of a tensor of shape ", logical.ToString()));
    }
    const int axis = sbp.axis();
    const Range r = BalancedSplit(slice.local[axis], hierarchy[i], coords[i]);
    slice.offset[static_cast<size_t>(axis)] += r.offset;
    slice.local[axis] = r.size;
  }
  return slice;
}

namespace {

// A block's elements as a grid of flat indices: base + sum_j i_j * stride_j,
// 0 <= i_j < extent_j, in row-major order of i. Canonical: axes of extent 1
// dropped, and an axis merged into the next inner one whenever its stride is
// that axis's extent times its stride (the inner axis is whole). Row-major
// grids nest (an axis's stride covers the inner axes' whole span), so two
// grids walk the same indices in the same order iff their canonical forms
// are equal.
struct Grid {
  int64_t base = 0;
  std::vector<std::pair<int64_t, int64_t>> axes;  // (extent, stride), innermost first
};

Grid CanonicalGrid(const TensorSlice& s) {
  Grid g;
  int64_t stride = 1;
  for (int d = s.logical.rank() - 1; d >= 0; --d) {
    g.base += s.offset[static_cast<size_t>(d)] * stride;
    if (s.local[d] != 1) {
      if (!g.axes.empty() && g.axes.back().first * g.axes.back().second == stride) {
        g.axes.back().first *= s.local[d];
      } else {
        g.axes.emplace_back(s.local[d], stride);
      }
    }
    stride *= s.logical[d];
  }
  return g;
}

}  // namespace

bool SameRowMajorElements(const TensorSlice& a, const TensorSlice& b) {
  if (a.local.NumElements() == 0 || b.local.NumElements() == 0) {
    return a.local.NumElements() == b.local.NumElements();
  }
  const Grid ga = CanonicalGrid(a), gb = CanonicalGrid(b);
  return ga.base == gb.base && ga.axes == gb.axes;
}

absl::StatusOr<Shape> LocalShape(const Shape& logical, const Sbp& sbp, int64_t parts, int64_t index) {
  ASSIGN_OR_RETURN(TensorSlice slice, LocalSlice(logical, NdSbp{sbp}, {parts}, index));
  return slice.local;
}

}  // namespace tessera
