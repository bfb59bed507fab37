#pragma once
// The static coordinator (DESIGN §7): every communicator gets its
// collectives and point-to-point transfers in one order derived from the
// plan alone, the same on each of its members, so no member waits on a peer
// that issued something else.
//
// A collective's act n (piece k = n mod m of iteration i = start + n / m, m
// its pieces per iteration) has the key
//
//   (i, epoch, per-micro-batch, time, order)
//
// epoch counts the gradient-accumulation boundaries upstream (a gradient
// all-reduce after acc comes after every micro-batch); once-per-iteration
// collectives come before the per-micro-batch ones of their epoch (time 0);
// order is the conversion's place in the plan's global order (topological).
// time is when the collective's stage runs (forward or backward, k) in one
// global one-forward-one-backward schedule, OneFOneBClock: every stage runs
// its 1F1B sequence (OneFOneBSlot) as early as its data allows, each
// forward and backward taking one step. The keys of one collective's acts
// increase, and every member of a collective computes the same key, so each
// communicator gets one sequence on all its members. 1F1B is also the order
// the register quotas let the actors run in (DESIGN §7).
//
// A transfer (Send / Recv, TransferDesc.launch and .order) of a value of
// micro-batch k gets the time of the step that reads it on the receiving
// stage (TransferDesc.peer_stage for the Send), on both sides: the value
// arrives just before its reader runs. Every transfer from global rank a
// to rank b goes over the pair's one communicator "p2p/a->b", whose k-th
// Send pairs with its k-th Recv (comm/collective/communicator.h). In
// gpt2_nano over p stages the tied token embedding lives on stage 0 and the
// head on stage p-1 reads it: it crosses 0 -> p-1 once per iteration in
// epoch 0 (stage p-1 has a repeat of its own), and the head's gradient of
// it, accumulated on stage p-1, crosses back once per iteration in epoch 1
// (graph::AccumulateGradients). The learning rate crosses once per
// iteration in epoch 0, the clipping's norms and factors in epoch 1.
// Activations and their gradients cross per micro-batch between
// neighbours. Build refuses a per-micro-batch transfer the
// schedule cannot place: a forward value to an earlier stage, a backward
// value to a later one.
//
// Lanes. A lane issues its launches one at a time in key order: a launch is
// admitted when it is the lane's head and the lane's previous launch has
// been issued. With LaneScope::kCommunicator each (device, communicator) is
// a lane, as suits communicators that run concurrently (CPU: shared memory
// and gloo, each on threads of its own). Collective step i of a routine is
// admitted on its lane when it is the lane's head and the lane's previous
// step has been issued; the first step when the actor launches, a later one
// when the previous step completed (BoxingRoutine's StepGate). Step i >= 1
// of a multi-step n-D routine has a communicator of its own ("<group>#i"),
// shared only with other routines' step i over the same ranks, so a routine
// waiting for its first step's peers holds up no single-step collective.
// With LaneScope::kDevice (GPUs) a device's collectives and transfers on all
// its communicators form one lane, steps ordered after their act: NCCL asks
// that a GPU's operations on different communicators be issued in one order
// on every rank, since a GPU may run only one of its NCCL kernels at a time,
// and the GPU's NcclSequence runs them one at a time in the order they were
// issued (comm/collective/nccl_communicator.h). The keys give that order:
// two ranks that share several communicators issue what they share in the
// same sequence.
// Conversions that communicate nothing use no lane.
//
// No deadlock: the global schedule with every collective and transfer at its
// key's time is an execution that respects the data (a forward of k reads
// values of earlier steps; a transfer's value was made before its reader's
// step; a collective's input comes from its step's earlier nodes, of lower
// order) and the register quotas: a receive holds its register from its
// reader's step on, like the reader's own outputs (p - s per stage for
// values kept for backward); a sender keeps its register until the reader's
// step, which for a neighbour comes no later than the step of the sender's
// next write of it, and for a stage further on (a value that skips
// stages) may come later: GPU plans give every sender the registers
// that takes (comm::SenderRegisters, scheduler/lowering/transfers.cc), one
// more where the writer is a collective, which must launch after the send,
// not in the same step. So the
// launch with the least key not yet done can always go once its inputs
// exist, which they can without any launch of a larger key, whatever the
// actors ran ahead. CPU plans keep their quotas: their lanes are per
// communicator, each in the sequence it had with the stage's own 1F1B slots
// (one direction of a pair is one reading stage's, in micro-batch order),
// so a send waits only behind transfers of its own pair.
//
// Thread-safe: actors may run on any thread.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "comm/proto/pipeline_schedule.h"
#include "comm/proto/plan.pb.h"

namespace tessera::actors {

using comm::OneFOneBClock;
using comm::OneFOneBSlot;

// (iteration, epoch, per-micro-batch, time, order).
using LaunchKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;

// Which launches share a lane (see above).
enum class LaneScope { kCommunicator, kDevice };

class CollectiveCoordinator {
 public:
  // Orders the plan's collectives, sends and receives. Errors: a launch
  // order that does not fit the plan (stage outside [0, num_stages),
  // negative epoch); a per-micro-batch transfer against the schedule (see
  // above).
  static absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> Build(const proto::Plan& plan,
                                                                      LaneScope scope = LaneScope::kCommunicator);

  // Task `actor_id` (a collective, send or recv) issues its collective step
  // i on the communicator named lanes[i] (names distinct per device; a
  // transfer has one step, on its pair's group); call once per task before
  // the run starts. Tasks that never call it go whenever ready. Errors
  // (internal): two steps on one communicator; with LaneScope::kDevice, two
  // tasks of one conversion on a device (their keys would tie).
  absl::Status Use(uint64_t actor_id, const std::vector<std::string>& lanes);
  // Whether `actor_id` may issue step `step` of its act `act` now: it heads
  // that step's lane and the lane is not issuing. On true the lane waits for
  // Issued.
  bool TryLaunch(uint64_t actor_id, int64_t act, int step = 0);
  // `actor_id` has issued step `step`; returns the lane's new head (to
  // wake), unless it is that same step of `actor_id`.
  std::vector<uint64_t> Issued(uint64_t actor_id, int step = 0);
  // "cpu:1 <lane>: 'boxing:x:3@1' act 2 next" for every lane with work left.
  std::string Describe() const;
  // Describe() of the lanes `actor_id` waits on: "" when it heads each lane
  // it has work left on (or uses none).
  std::string DescribeWait(uint64_t actor_id) const;

 private:
  struct Entry {
    LaunchKey key;
    int step = 0;
    uint64_t actor_id = 0;
    bool operator>(const Entry& other) const { return std::tie(key, step) > std::tie(other.key, other.step); }
  };
  struct Lane {
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heads;  // each step's next act
    bool issuing = false;  // an admitted launch has not issued all its collectives yet
    std::map<int64_t, uint64_t> orders;  // LaneScope::kDevice: conversion order -> task using the lane
  };
  // A collective, send or recv task.
  struct Launcher {
    const proto::Task* task = nullptr;
    int64_t acts = 0;
    int64_t pieces = 1;                    // per iteration
    const OneFOneBClock* clock = nullptr;  // per-micro-batch tasks
    int32_t key_stage = 0;                 // the stage whose schedule times its acts
    std::vector<Lane*> lanes;              // per collective step
    std::vector<int64_t> next_act;         // per collective step
  };

  LaunchKey Key(const Launcher& l, int64_t act) const;
  std::string DescribeHead(const std::string& name, const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const proto::Plan* plan_ = nullptr;
  LaneScope scope_ = LaneScope::kCommunicator;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<OneFOneBClock>> clocks_;  // (stages, micro-batches)
  mutable std::mutex mu_;
  std::map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);  // "cpu:0 <communicator>", or "cpu:0"
  std::map<uint64_t, Launcher> launchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::actors
