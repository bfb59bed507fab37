#pragma once
// Binding a plan's sources and sink to host functions (DESIGN §9): what the
// in-process Engine and a cluster worker both do with a plan, from the plan
// alone (its SourceDesc and fetch_names), so that they cannot drift apart.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "actors/actor.h"
#include "comm/proto/plan.pb.h"
#include "core/tensor.h"

namespace tessera {

// Writes micro-batch `micro_batch` of graph input `input` for `iteration`
// into `tensor` (preallocated with the input's logical meta; micro_batch is
// 0 without accumulation). May be called from several device threads at once.
// It must write every element: the buffer holds whatever it held before.
// Write through the tensor (data<T>(), or a copy of it: `Tensor t = tensor;
// t.CopyFrom(values)`, copies share their storage); assigning another
// tensor to a copy writes nothing. data<T>() and ToVector<T>() of the wrong
// T, or FromVector with a count that is not the shape's, are TESSERA_CHECK
// failures (a programming error ends the process); errors the feed can
// meet (data it cannot read) are returned as a Status.
using FeedFn = std::function<absl::Status(int64_t iteration, int64_t micro_batch, std::string_view input,
                                          const Tensor& tensor)>;
// Called once per iteration with "loss" and the fetches (averaged over the
// micro-batches); the tensors are valid only during the call.
using FetchFn = std::function<absl::Status(int64_t iteration, const std::map<std::string, Tensor>& values)>;

// Registers a source callback for every SOURCE task of `plan`: the feed fills
// the logical tensor of each piece once, and every rank holding a shard of it
// takes its block (a rank holding the whole tensor is fed directly). `feed`
// must outlive the run.
absl::Status BindFeeds(const proto::Plan& plan, const FeedFn& feed, actors::HostCallbacks& callbacks);
// Registers the sink callback: fetch receives the sink's tensors by their
// fetch_names (and fetch_aliases: one tensor under several names). A sink
// naming two tensors alike, or an alias of nothing it fetches, is an error.
// An empty fetch accepts and drops them. `fetch` must outlive the run.
absl::Status BindFetch(const proto::Plan& plan, const FetchFn& fetch, actors::HostCallbacks& callbacks);

}  // namespace tessera
