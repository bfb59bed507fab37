// The sink step: what the host receives each iteration.

#include <map>
#include <utility>

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {

// One sink on the first rank of the last stage reads the losses and fetches
// as (B, B) there.
absl::Status Lowering::LowerSink() {
  const int64_t stage = mesh_.num_stages() - 1;
  ASSIGN_OR_RETURN(const uint64_t sink, NewTask(proto::ACTOR_KIND_SINK, "sink:fetch", HostStream(), Device(stage, 0)));
  builder_.task(sink).set_callback(kSinkCallback);
  NdSbp all_b(mesh_.hierarchy().size(), Sbp::Broadcast());
  std::vector<Shard> read;
  for (const auto& [name, value] : facts_.sinks) {
    ASSIGN_OR_RETURN(Shard shard, Read(value, stage, all_b, 0, sink));
    read.push_back(shard);
  }
  // The sink receives every tensor of each consumed desc, in consumed order.
  const proto::Plan& plan = builder_.plan();
  std::vector<std::string> flat;
  std::map<std::pair<int64_t, int32_t>, size_t> position;
  for (int64_t desc_id : builder_.task(sink).consumed_register_desc_ids()) {
    const auto& desc = plan.register_descs(static_cast<int>(desc_id));
    for (int32_t k = 0; k < desc.tensors_size(); ++k) {
      position[{desc_id, k}] = flat.size();
      flat.push_back("");
    }
  }
  for (size_t s = 0; s < facts_.sinks.size(); ++s) {
    const size_t at = position.at({read[s].desc, read[s].tensor});
    if (!flat[at].empty()) {  // one value fetched under two names
      proto::FetchAlias* alias = builder_.task(sink).add_fetch_aliases();
      alias->set_name(facts_.sinks[s].first);
      alias->set_of(flat[at]);
      continue;
    }
    flat[at] = facts_.sinks[s].first;
  }
  for (const std::string& name : flat) builder_.task(sink).add_fetch_names(name);
  out_.sink_names = std::move(flat);
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
