#pragma once
// Communicator: one rank's handle on a group of devices that exchange tensors
// through collectives and point-to-point transfers. One interface for every
// transport (shared memory for CPU devices in one process, gloo across
// processes, NCCL for GPUs), shaped for asynchronous launch: every call
// returns at once and reports completion through a callback, so an actor can
// launch a transfer and release its registers from the callback (DESIGN.md
// §8, §9).
//
// Contract common to every call:
// - `done` is called exactly once, on any thread (possibly inline, inside the
//   call), when the output is complete or the op has failed. It must not
//   block on another op of the same group finishing.
// - Tensors are contiguous by construction (core/tensor.h) and must live on a
//   device the transport handles (CPU for shared memory). The caller keeps the
//   bytes unchanged (inputs) and unread (outputs) until `done`; the
//   communicator keeps the Tensor handles, so storage stays allocated.
// - Errors (bad arguments, mismatched calls, abort) arrive through `done` as
//   a Status with a one-line message naming the op, the group and the cause;
//   nothing crashes on bad input.
// - Collective ordering: every rank of the group must issue the same sequence
//   of collectives. The k-th collective call of each rank matches the k-th of
//   every other rank. A mismatch (kind, dtype, counts, root, reduce op) fails
//   that op on every rank with one error naming both ranks' calls; a call that
//   fails argument checks on one rank still takes its place in the sequence
//   and fails the matching op of the other ranks, so later ops stay aligned.
// - Point-to-point: Send and Recv are matched in order per (sender, receiver)
//   pair, independently of the collective sequence. A rank may send to itself.
// - Counts are in elements and describe the tensors flat (row-major), so
//   uneven splits (including zero-element chunks) need no padding.
//
// Thread-safety: every method may be called from any thread. Calls of one
// rank issued concurrently from several threads are ordered as they reach the
// communicator; a rank that needs a particular order issues from one thread.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace tessera::comm {

enum class ReduceOp { kSum, kMax };

// "sum" / "max".
inline const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

using DoneFn = std::function<void(absl::Status)>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // index in the group, 0 .. size() - 1
  virtual int size() const = 0;
  // E.g. "shm group 'ranks:0,2' rank 1/2".
  virtual std::string Describe() const = 0;

  // output = element-wise reduction over ranks of input; same dtype and shape
  // on every rank. `output` may be `input` itself (in place) but must not
  // partially overlap it.
  virtual void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) = 0;

  // output (flat) = concatenation of every rank's input (flat), rank order;
  // counts[r] = elements from rank r (uneven and zero allowed), so input has
  // counts[rank()] elements and output sum(counts). Same counts on every rank.
  virtual void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts,
                         DoneFn done) = 0;

  // input (flat) holds size() consecutive chunks of counts[0 .. p-1] elements;
  // rank r's output (counts[r] elements) is the reduction over ranks of chunk r.
  virtual void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts,
                             ReduceOp op, DoneFn done) = 0;

  // input = consecutive chunks for ranks 0 .. p-1 of send_counts elements;
  // output = consecutive chunks from ranks 0 .. p-1 of recv_counts elements.
  // Rank s's send_counts[d] must equal rank d's recv_counts[s].
  virtual void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output,
                        std::vector<int64_t> recv_counts, DoneFn done) = 0;

  // Every rank's buffer receives root's buffer (same dtype and element count
  // on every rank).
  virtual void Broadcast(Tensor buffer, int root, DoneFn done) = 0;

  // Point-to-point: the k-th Send from a to b pairs with the k-th Recv on b
  // from a; both must have the same dtype and element count.
  virtual void Send(const Tensor& input, int peer, DoneFn done) = 0;
  virtual void Recv(Tensor output, int peer, DoneFn done) = 0;

  // Fails every pending and future op of the whole group (every rank) with
  // `reason`, e.g. on a job abort: nothing waiting on a peer may hang. The
  // first reason sticks; an OK reason is replaced by a Cancelled error.
  virtual void Abort(absl::Status reason) = 0;
};

}  // namespace tessera::comm
