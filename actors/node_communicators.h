#pragma once
// The communicators of one node's part of a plan (DESIGN §9): a group whose
// members all run on this node gets shared-memory communicators (ShmHub);
// a group that spans nodes gets gloo communicators, one per local member,
// which find their peers through the job's KvStore — or, when some node holds
// several of its members, hierarchical ones (comm/collective/
// hierarchical_communicator.h): members of a node meet in memory and one
// gloo rank per node carries the rest.
//
// A plan on GPUs (`gpus`) gets NCCL communicators for every group instead,
// local or spanning (comm/collective/nccl_communicator.h): rank r's on the
// GPU its Plan.ranks entry names (its index when the plan has none), meeting
// through `kv` — or, without one (a one-process runtime), a KV store of
// this object's own. The communicators of one GPU share its NcclSequence:
// their ops run one at a time, in the order they were issued.
//
// Joining is two-phase because a gloo rendezvous (and an NCCL group's
// creation) blocks until every member
// of the group arrived, and the members on this node are created one after
// another on the loading thread: Join hands out a communicator at once
// (spanning groups: not yet connected), and ConnectAll then connects every
// spanning one in parallel, with a deadline. The runtime calls ConnectAll
// before it starts any actor, so no op reaches an unconnected communicator
// (one that does fails with FailedPrecondition through its callback).
//
// Thread-safety: Join and ConnectAll from one thread (the loader); the
// communicators handed out are thread-safe.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/collective/communicator.h"
#include "comm/collective/kv_store.h"
#include "comm/collective/nccl_communicator.h"
#include "comm/collective/shm_communicator.h"
#include "comm/proto/plan.pb.h"

namespace tessera::actors {

struct NodeCommunicatorOptions {
  uint32_t node = 0;                   // the node this process runs
  comm::ShmHub* hub = nullptr;         // local groups; borrowed, required
  comm::KvStore* kv = nullptr;         // spanning groups' rendezvous; borrowed; null = none allowed
  std::string kv_prefix;               // unique per job: every key is "<kv_prefix>/<group>/..."
  std::string hostname = "127.0.0.1";  // where this node's gloo transport listens
  double timeout_s = 30;               // rendezvous and per-op timeout of gloo communicators
  bool gpus = false;                   // the plan's devices are GPUs: NCCL communicators
  // ConnectAll gives up once this is set (borrowed; null: never): the job
  // was stopped while its groups met.
  const std::atomic<bool>* cancel = nullptr;
};

class NodeCommunicators {
 public:
  // `plan` (for Plan.ranks) must outlive this object.
  NodeCommunicators(const proto::Plan& plan, NodeCommunicatorOptions options);
  ~NodeCommunicators();
  NodeCommunicators(const NodeCommunicators&) = delete;
  NodeCommunicators& operator=(const NodeCommunicators&) = delete;

  // Rank `rank` of group `group` over global ranks `members` (see JoinFn).
  // Errors: a member that is no rank of the plan, `rank` outside members, a
  // spanning group without a KvStore.
  absl::StatusOr<std::shared_ptr<comm::Communicator>> Join(const std::string& group,
                                                           const std::vector<uint32_t>& members, int rank);
  // Connects every spanning communicator handed out (in parallel). Errors
  // name the group and the ranks that never came. The first failure makes
  // the members still waiting for their peers give up (gloo's rendezvous,
  // NCCL's unique id and creation), and the error returned is that cause.
  [[nodiscard]] absl::Status ConnectAll();

 private:
  class Deferred;
  // A spanning group with several members on some node: its members here
  // share one hierarchical group over a gloo group of one rank per node.
  absl::StatusOr<std::shared_ptr<comm::Communicator>> JoinHierarchical(const std::string& group,
                                                                       const std::vector<uint32_t>& node_of, int rank);
  // Any group on GPUs: an NCCL communicator, created by ConnectAll.
  absl::StatusOr<std::shared_ptr<comm::Communicator>> JoinNccl(const std::string& group,
                                                               const std::vector<uint32_t>& members, int rank);
  const proto::Plan& plan_;
  NodeCommunicatorOptions options_;
  std::unique_ptr<comm::KvStore> own_kv_;  // NCCL's rendezvous when the options bring no KV store
  std::vector<std::shared_ptr<Deferred>> pending_;
  // Per GPU: the issue order its NCCL communicators share
  // (comm/collective/nccl_communicator.h), made when the first connects.
  struct GpuSequence {
    std::mutex mu;
    std::shared_ptr<comm::NcclSequence> sequence;  // under mu
  };
  std::map<uint32_t, std::shared_ptr<GpuSequence>> sequences_;
  std::map<std::string, std::vector<std::shared_ptr<comm::Communicator>>> hierarchical_;  // group -> local members
};

}  // namespace tessera::actors
