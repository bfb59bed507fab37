#pragma once
// The NCCL communicator (DESIGN §9): one rank of a group of GPUs, behind the
// Communicator interface (comm/collective/communicator.h). Compiled with
// CUDA only (TESSERA_WITH_CUDA).
//
// Creation: rank 0 makes the group's unique id and publishes it in the
// KvStore (the master's KV in a cluster) under "<kv_prefix>/nccl/<group>";
// the others wait for it there (timeout_s). The communicator is created
// non-blocking, so a rank whose peers never come fails after timeout_s
// instead of waiting forever.
//
// Ops: each is enqueued on the communicator's own CUDA stream (the device's
// collective stream, core/stream.h) and `done` runs from the stream's
// completion callback, after the GPU finished it. Uneven AllGather and
// ReduceScatter are grouped broadcasts / reduces (one per rank), AllToAll
// grouped sends and receives. Tensors must be on the communicator's GPU.
//
// Failures: a thread polls ncclCommGetAsyncError while the communicator
// lives; an error (a peer that died, a network failure) aborts it: the
// communicator is aborted with ncclCommAbort, so kernels waiting for a peer
// return, and every pending and later op fails with the reason. Abort (the
// runtime's, on a job failure or cancel) does the same, so no rank stays
// blocked in a collective when another one is gone.
//
// One order per GPU: the communicators of one GPU given one NcclSequence
// (NcclOptions.sequence) run their ops one at a time, in the order they
// were issued, whatever communicator each is on: each op's stream first
// waits, on the GPU, for the op issued before it. NCCL asks for that when
// a GPU uses several communicators: a GPU may run only one of its NCCL
// kernels at a time, and one that waits for peers stuck behind another of
// them hangs the job. With the runtime's one launch lane per GPU
// (actors/launch_order.h) every rank issues what it shares with another in
// the same order, so no op waits for one behind it.
//
// Not detected (unlike the shared-memory and gloo communicators): ranks
// issuing different collectives. The runtime's static launch order
// (actors/launch_order.h) is what keeps them in step.

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/collective/communicator.h"
#include "comm/collective/kv_store.h"

namespace tessera::comm {

// The issue order of one GPU's NCCL ops, shared by its communicators
// (defined with CUDA only).
class NcclSequence;
// A sequence for the communicators of cuda:`device` (an error when CUDA
// fails to make its event; Unimplemented without CUDA).
absl::StatusOr<std::shared_ptr<NcclSequence>> MakeNcclSequence(int device);

struct NcclOptions {
  std::string group;  // names the rendezvous key and Describe()
  int rank = 0;
  int size = 1;
  int device = 0;         // the GPU (cuda:device) of this rank
  KvStore* kv = nullptr;  // borrowed; needed when size > 1
  std::string kv_prefix = "job";
  double timeout_s = 30;  // rendezvous and communicator creation
  // Borrowed, optional: once true, a creation still waiting for its peers
  // gives up with Cancelled (the runtime sets it when another member of the
  // same load failed, so nobody waits out the timeout for it).
  const std::atomic<bool>* cancel = nullptr;
  // Optional, from MakeNcclSequence(device): the ops of every communicator
  // sharing it run one at a time in issue order (see above).
  std::shared_ptr<NcclSequence> sequence;
};

// A communicator for `options` (an error naming the group and rank when the
// GPU, the rendezvous or NCCL fails; Unimplemented on builds without CUDA).
absl::StatusOr<std::shared_ptr<Communicator>> MakeNcclCommunicator(const NcclOptions& options);

// What MakeNcclCommunicator warns (once per process) for a group of several
// ranks when CUDA loads kernels lazily: `mode` is CUDA_MODULE_LOADING's
// value (null: unset). "" for EAGER, which Tessera sets when the variable is
// unset (core/cuda_allocator.cc): under lazy loading a kernel's first launch
// may wait for an NCCL collective that waits for this process, and the job
// hangs.
std::string LazyModuleLoadingWarning(const char* mode);

}  // namespace tessera::comm
