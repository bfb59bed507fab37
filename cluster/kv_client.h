#pragma once
// A comm::KvStore over the master's KvPut / KvGet / KvWait RPCs: the
// rendezvous of a job's nodes in a cluster. Every key is prefixed with
// `prefix` (the worker passes "<job id>/<session>/"), so jobs never see each
// other's keys and the master can drop a finished job's keys.
//
// Wait is the master's blocking wait: one RPC that returns when every key is
// set, or DEADLINE_EXCEEDED after `timeout`. A lost master comes back as
// UNAVAILABLE (or DEADLINE_EXCEEDED), never an abort.
//
// CancelCalls ends the calls in flight and refuses later ones (CANCELLED):
// a job stopped at once waits on no master that stopped answering (a Set
// held its stop agreement for the whole RPC timeout).
//
// Thread-safety: thread-safe. Shares `channel`.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cluster/transport.h"
#include "comm/collective/kv_store.h"
#include "comm/proto/control.grpc.pb.h"

namespace tessera::cluster {

class KvClient final : public comm::KvStore {
 public:
  KvClient(std::shared_ptr<grpc::Channel> channel, Security security, std::string prefix,
           absl::Duration rpc_timeout = absl::Seconds(10));

  absl::Status Set(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  void CancelCalls();

 private:
  // Registers a call's context (false: the calls were cancelled).
  bool Begin(grpc::ClientContext& context);
  void End(grpc::ClientContext& context);

  std::unique_ptr<control::Master::Stub> stub_;
  const Security security_;
  const std::string prefix_;
  const absl::Duration rpc_timeout_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::cluster
