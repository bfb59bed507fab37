#pragma once
// A Communicator over gloo's TCP transport, for CPU devices in different
// processes (DESIGN.md §9). ConnectGloo joins one rank to a group through a
// KvStore (the master's KV in a cluster); the returned Communicator keeps the
// contract of communicator.h.
//
// Concurrency design (why nothing deadlocks):
// - Collectives run on one collective thread, in issue order; every rank runs
//   the same sequence, so the k-th collective meets the k-th of its peers.
// - Point-to-point runs on its own threads, one per (peer, direction), started
//   on first use, over a second gloo context (its own TCP connections and
//   slots). A Send or Recv is therefore never queued behind a collective
//   waiting for a peer, nor behind a transfer with another peer or in the
//   other direction; within one (sender, receiver) lane the k-th transfer
//   cannot complete before the (k-1)-th anyway, so serving a lane in order
//   adds no wait. `done` is called from these threads (or inline for argument
//   errors and sends to self).
//
// Every op starts with an exchange of descriptors (kind, dtype, counts, root,
// reduce op; Send/Recv: dtype and count) so every rank decides the same way
// whether the call matches: a mismatch or an invalid call on one rank fails
// that op on every rank with one message naming both calls, and later ops stay
// aligned. Then the data moves:
// - AllReduce: the n elements are cut into p balanced chunks; every rank sends
//   chunk c to its owner c (a direct reduce-scatter), the owner combines the p
//   contributions in rank order 0, 1, ..., p-1 and sends the result to every
//   rank (a direct all-gather). Segments of `segment_bytes` pipeline the two
//   phases. Each rank sends and receives (p-1)/p of the data twice, as in a
//   ring, with no rotation of the reduction order.
// - ReduceScatter: the same first phase over the caller's counts.
// - AllGather, AllToAll: direct sends to every peer. Broadcast: the root
//   sends to every peer (fine for the small groups of one gloo communicator
//   per process; a chain would be better for many ranks).
// - Fusion: AllReduces, ReduceScatters or AllGathers of one dtype queued
//   behind the op about to run go with it as one op (packed into one buffer,
//   unpacked after), up to `fuse_bytes`. The descriptor message carries the
//   counts of the ops each rank has queued; all ranks fuse the longest run
//   every rank has with the same counts, so they decide alike. Many small
//   gradient reductions then cost one descriptor exchange and one message per
//   peer and segment instead of one each.
// Numerics: exactly ShmHub's (shm_communicator.h): f32/f16/bf16 accumulate in
// f32 and round once, i32/i64 wrap, max propagates NaN, ranks combined in rank
// order, so results are bit-identical on every rank, across runs, and to
// ShmHub's for the same inputs.
//
// Failure and abort:
// - Abort(reason) fails this rank's pending and future ops with `reason` at
//   once, and closes every connection of the communicator (TCP reset). A peer
//   blocked on this rank then sees its connection fail within milliseconds;
//   any transport failure (a peer's abort, its death, a timeout) makes the
//   rank abort itself with an Unavailable (DeadlineExceeded for a timeout)
//   error naming the op and the peer, which in turn closes its connections,
//   so the failure reaches every rank of the group. gloo cannot carry the
//   first rank's reason to its peers: they learn that the connection was lost.
// - `timeout` bounds every wait on a peer. gloo treats a timeout as fatal to
//   the connections of its context, so a timeout aborts the whole group: it
//   must exceed the longest time one rank may wait for another to issue its
//   matching op.
// - Every gloo exception is caught at the op's boundary and becomes a Status.
// - ConnectGloo sets SIGPIPE to ignored if it is at its default (gloo writes
//   with writev, and a write to a dead peer must fail the op, not kill the
//   process); a handler the program installed is left alone.
//
// Lifetime: destroying the communicator fails ops still pending with
// Cancelled, joins its threads and closes its connections (peers waiting on
// it then fail). Tensors handed to an op are kept until its `done`.
//
// Thread-safety: as communicator.h; every method may be called from any
// thread, `done` callbacks run with no lock held and may issue further ops
// (but must not destroy the communicator).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective/communicator.h"
#include "comm/collective/kv_store.h"

namespace tessera::comm {

struct GlooOptions {
  std::string group;                   // unique per job and communicator: every KV key is "<group>/..."
  int rank = 0;
  int size = 1;
  std::string hostname = "127.0.0.1";  // the address this rank's gloo transport listens on
  absl::Duration timeout = absl::Seconds(30);  // rendezvous and per-op timeout
  // Reductions move in pieces of this many bytes, so one piece is combined
  // while the next is on the wire. Must be positive.
  int64_t segment_bytes = int64_t{4} << 20;
  // Queued AllReduces, ReduceScatters or AllGathers of one dtype (and reduce
  // op) behind the one about to run are fused with it into one op of up to
  // this many bytes (0: never). The ranks agree on what to fuse as they go;
  // results do not change.
  int64_t fuse_bytes = int64_t{16} << 20;
  // If set, counts the ops that ran fused with others (tests, benchmarks).
  std::shared_ptr<std::atomic<int64_t>> fused_ops;
};

// Connects rank `options.rank` of the group (blocks for the rendezvous through
// `store`, which must outlive the call only). Errors name the group, the rank
// and the cause: InvalidArgument for bad options or ranks that disagree on the
// size, DeadlineExceeded naming the ranks that never came, Unavailable when
// the transport cannot connect.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KvStore& store,
                                                                        const GlooOptions& options);

}  // namespace tessera::comm
