#include "train/feeds.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "actors/plan.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/tensor_util.h"

namespace tessera {

absl::Status BindFeeds(const proto::Plan& plan, const FeedFn& feed, actors::HostCallbacks& callbacks) {
  // A piece of an input read in shards is filled once and shared by the
  // ranks that read it (device threads call concurrently).
  struct FeedCache {
    std::mutex mu;
    std::map<std::pair<std::string, int64_t>, std::pair<Tensor, int>> pieces;  // (input, piece) -> (tensor, readers left)
  };
  auto cache = std::make_shared<FeedCache>();
  struct Source {
    std::string callback;
    std::string input;
    TensorMeta logical;
    TensorSlice slice;
    int64_t pieces = 1;
  };
  std::vector<Source> sources;
  std::map<std::string, int> split_readers;  // input -> ranks reading a shard of it
  // (Found by id: a linear search per source took minutes on a plan of
  // 160k sources.)
  std::map<int64_t, const proto::RegisterDesc*> descs;
  for (const proto::RegisterDesc& d : plan.register_descs()) descs.emplace(d.id(), &d);
  for (const auto& task : plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_SOURCE || task.callback().empty()) continue;
    if (!task.has_source()) {
      return absl::InvalidArgumentError(StrCat("source task '", task.name(), "' does not say which input it feeds"));
    }
    Source s;
    s.callback = task.callback();
    s.input = task.source().input();
    ASSIGN_OR_RETURN(s.logical, actors::TensorMetaFromProto(task.source().logical()));
    const auto produced =
        task.produced_register_desc_ids_size() == 1 ? descs.find(task.produced_register_desc_ids(0)) : descs.end();
    if (produced == descs.end() || produced->second->tensors_size() != 1) {
      return absl::InvalidArgumentError(StrCat("source task '", task.name(), "' must produce one tensor"));
    }
    ASSIGN_OR_RETURN(const TensorMeta local, actors::TensorMetaFromProto(produced->second->tensors(0)));
    ASSIGN_OR_RETURN(s.slice, actors::TensorSliceFromProto(task.source().slice(), local.shape));
    if (s.slice.logical != s.logical.shape) {
      return absl::InvalidArgumentError(StrCat("source task '", task.name(), "': its slice is of ",
                                               s.slice.logical.ToString(), ", the input is ", s.logical.ToString()));
    }
    s.pieces = actors::PiecesPerIteration(task);
    if (!s.slice.IsWhole()) ++split_readers[s.input];
    sources.push_back(std::move(s));
  }
  for (Source& s : sources) {
    const int readers = split_readers[s.input];
    callbacks.sources[s.callback] = [&feed, s, readers, cache](int64_t piece,
                                                                 const std::vector<Tensor>& outputs) -> absl::Status {
      const int64_t m = s.pieces;
      if (!feed) return absl::FailedPreconditionError(StrCat("no feed for input '", s.input, "'"));
      if (s.slice.IsWhole()) return feed(piece / m, piece % m, s.input, outputs.at(0));
      std::lock_guard<std::mutex> lock(cache->mu);
      auto& [whole, left] = cache->pieces[{s.input, piece}];
      if (!whole.defined()) {
        ASSIGN_OR_RETURN(whole, Tensor::Zeros(s.logical.shape, s.logical.dtype));
        RETURN_IF_ERROR(feed(piece / m, piece % m, s.input, whole));
        left = readers;
      }
      ASSIGN_OR_RETURN(Tensor block, ExtractBlock(whole, s.slice.offset, s.slice.local));
      Tensor target = outputs.at(0);
      RETURN_IF_ERROR(target.CopyFrom(block));
      if (--left == 0) cache->pieces.erase({s.input, piece});
      return absl::OkStatus();
    };
  }
  return absl::OkStatus();
}

absl::Status BindFetch(const proto::Plan& plan, const FetchFn& fetch, actors::HostCallbacks& callbacks) {
  for (const auto& task : plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_SINK || task.callback().empty()) continue;
    const std::vector<std::string> names(task.fetch_names().begin(), task.fetch_names().end());
    // Each alias -> the position of the tensor it names.
    std::vector<std::pair<std::string, size_t>> aliases;
    std::set<std::string> taken;
    std::map<std::string, size_t> position;
    for (const std::string& name : names) {
      position.emplace(name, position.size());
      if (!name.empty() && !taken.insert(name).second) {
        return absl::InvalidArgumentError(StrCat("sink task '", EscapeControlChars(task.name()),
                                                 "' names two tensors '", EscapeControlChars(name), "'"));
      }
    }
    for (const proto::FetchAlias& alias : task.fetch_aliases()) {
      const auto of = position.find(alias.of());
      if (alias.of().empty() || of == position.end()) {
        return absl::InvalidArgumentError(StrCat("sink task '", EscapeControlChars(task.name()), "': fetch alias '",
                                                 EscapeControlChars(alias.name()), "' is of '",
                                                 EscapeControlChars(alias.of()), "', which the sink does not fetch"));
      }
      if (alias.name().empty() || !taken.insert(alias.name()).second) {
        return absl::InvalidArgumentError(StrCat("sink task '", EscapeControlChars(task.name()), "': fetch alias '",
                                                 EscapeControlChars(alias.name()),
                                                 "' is empty or names another fetch"));
      }
      aliases.emplace_back(alias.name(), of->second);
    }
    callbacks.sinks[task.callback()] = [&fetch, names, aliases](int64_t iteration,
                                                                const std::vector<Tensor>& inputs) -> absl::Status {
      if (!fetch) return absl::OkStatus();
      std::map<std::string, Tensor> values;
      for (size_t i = 0; i < inputs.size() && i < names.size(); ++i) {
        if (!names[i].empty()) values[names[i]] = inputs[i];
      }
      for (const auto& [alias, at] : aliases) {
        if (at < inputs.size()) values[alias] = inputs[at];
      }
      return fetch(iteration, values);
    };
  }
  return absl::OkStatus();
}

}  // namespace tessera
