#pragma once
// Hierarchical collectives (DESIGN.md §9): a group whose members sit on
// several nodes, some node holding more than one of them. The members on one
// node meet in memory; one connection per node (the "leaders" communicator,
// gloo in a cluster, rank = the node's index among the group's nodes) carries
// everything between nodes. Compared with one gloo rank per member: no
// loopback TCP between members of one node, fewer gloo ranks to meet at
// rendezvous, fewer connections, and less traffic between nodes (each node
// receives a reduced chunk's result once, not once per member).
//
// Results are bit-identical to ShmHub's and the flat gloo communicator's:
// reductions combine the raw contributions of every member strictly in rank
// order 0, 1, ..., p-1 (internal/reduce.h). That is why a node sends its
// members' contributions, not their partial sum: summing on the node first
// would change the order whenever a node's members are not ranks next to
// each other at the front of the sum.
//
//   AllReduce      leaders AllToAll: node m gets every member's slice of
//                  chunk m (one chunk per node), reduces it in rank order;
//                  leaders AllGather of the reduced chunks
//   ReduceScatter  leaders AllToAll: node m gets every member's chunk of each
//                  of its members; reduced in rank order into their outputs
//   AllGather      leaders AllGather of each node's members' inputs
//   AllToAll       leaders AllToAll of the pieces between the nodes' members
//   Broadcast      the root's buffer to the other leaders, then in memory
//
// Every collective starts with a leaders AllGather of every member's call
// (kind, dtype, reduce op, root, counts), so an invalid or mismatched call
// fails that op on every member of every node with the same message, and
// later ops stay aligned. Point-to-point is not offered (pipeline edges use
// groups of two members of their own): Send and Recv fail with
// Unimplemented.
//
// Abort fails every pending and future op of the members on this node and
// aborts the leaders, so the other nodes' members fail at their next exchange
// between nodes (a job stop aborts the communicators of every node).
//
// Thread-safety: as communicator.h. The members on one node share one
// HierarchicalGroup; its own thread runs each collective once all local
// members have issued it, one after another, and calls their callbacks,
// which may issue further ops but must not release the last member (as with
// the gloo communicator, a callback must not destroy its communicator).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective/communicator.h"

namespace tessera::comm {

struct HierarchicalLayout {
  // node_of[r]: the index (0 .. nodes - 1) of the node that holds member r.
  std::vector<int> node_of;
  int this_node = 0;  // the node these members are on
  // How long a local member's call waits for the other local members' before
  // the group fails (the leaders' ops have their transport's own timeout).
  absl::Duration timeout = absl::Seconds(30);
};

class HierarchicalGroup;

// The local members' communicators (one per member r with node_of[r] ==
// this_node, in rank order) over `leaders` (size = number of nodes, rank =
// this_node). `name` is used in Describe and errors. Errors: a layout whose
// node indices are not 0 .. nodes - 1 each used, a timeout that is not
// positive, a leaders communicator of the wrong size or rank.
absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> MakeHierarchical(std::string name, HierarchicalLayout layout,
                                                                            std::shared_ptr<Communicator> leaders);

// Whether a group with members on these nodes (node ids, any values) needs
// hierarchical collectives: it spans several nodes and one of them holds more
// than one member. The same answer on every node, from the plan alone.
bool NeedsHierarchy(const std::vector<uint32_t>& node_of_member);

}  // namespace tessera::comm
