#pragma once
// Bus: the actor bus between worker processes (DESIGN §9). Persistent TCP
// links between nodes carry length-prefixed binary frames; each frame names a
// session (the job it belongs to) and an address (the actor it is for, as the
// actor runtime encodes it). The bus only moves bytes: actors/ encodes its
// messages into payloads, comm/ never sees them.
//
// One Bus per process (per node). It listens on `BusOptions::listen`, and
// Connect opens a link to another node's bus; a link is symmetric and shared
// by every session, so a worker running jobs one after another keeps its
// links. At most one live link per node pair: when both sides connect at once,
// both keep the link opened by the lower node number.
//
// Wire format (all integers little-endian, encoded field by field):
//   header (28 bytes): magic u32 "TSB1" | type u32 | session u64 | address u64
//                      | payload length u32
//   payload: `length` bytes.
// The handshake is the first frame each way: Hello from the connecting side,
// HelloAck (or Reject with a reason) back, each carrying the protocol version,
// the sender's node, the node it expects on the other end, the sender's
// incarnation (random per Bus, so a restarted peer is told apart from a
// duplicate connection) and the shared token, compared in constant time.
// Before the handshake a frame longer than 4 KiB is refused, so an
// unauthenticated peer cannot make the bus allocate much.
//
// Contract:
// - Frames sent to one node arrive in the order sent (per link; a link that is
//   lost loses what was still queued on it).
// - Frames of a session nobody subscribed yet are held, in order, and
//   delivered at Subscribe; held bytes of all sessions together are bounded by
//   max_pending_bytes, and the frame that would exceed it fails its link with
//   ResourceExhausted. Unsubscribe discards what is held for the session and
//   drops its later frames (stats().frames_dropped).
// - A link failure (peer closed or died, read/write error, bad frame, failed
//   handshake, a peer that restarted) is reported once to the on_error of
//   every subscriber, naming the node and the cause (and logged at info:
//   the subscriber judges). Failures of connections whose node was never
//   stated (garbage before a Hello) close that connection only and are
//   logged as warnings. The node of a refused Hello is the one it
//   claimed; while that node has a live link the refusal is only logged, so
//   a stranger claiming a linked node cannot make the link look failed. A
//   local Disconnect or ~Bus is not a failure and is not reported locally;
//   the peer sees the link close. A TCP close is seen at once (a peer
//   process that died included); a host that vanishes without one is the
//   control plane's heartbeats to catch (DESIGN §9).
// - Bad input from the network never crashes, hangs or stops the bus: it
//   closes that one connection. A connection that does not complete its
//   handshake within connect_timeout_s is closed.
// - Send never blocks on the network; the send queue of a link is unbounded
//   (flow control is the actor protocol's register quotas, DESIGN §8).
//
// Threads: the bus runs one I/O thread of its own. FrameHandler and
// LinkErrorHandler run on it, one at a time, and must not block for long
// (no Connect from them; Send, Subscribe, Unsubscribe and Disconnect are
// fine). The payload view is valid only during the call.
//
// Thread-safety: every method may be called from any thread, except that
// Connect and ~Bus must not be called from a handler, and no call may race
// ~Bus.
//
// Connection states (one TCP connection; a link is a live one):
//   handshaking --Hello/HelloAck ok--> live --EOF, error, bad frame--> closed
//        |                               \--Disconnect, ~Bus, restart of the peer--> closed
//        \--refused, timeout, bad frame--> closed

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::comm::bus {

// Called on the bus's I/O thread; must not block for long.
using FrameHandler = std::function<void(uint32_t from_node, uint64_t address, std::string_view payload)>;
// A link to `node` failed (peer closed, read/write error, bad frame, failed handshake): once per failure.
using LinkErrorHandler = std::function<void(uint32_t node, const absl::Status& error)>;

struct BusOptions {
  uint32_t node = 0;                      // this endpoint's node number
  std::string listen = "127.0.0.1:0";     // host:port; port 0 = the OS picks
  std::string token;                      // shared secret checked in the handshake; empty = no auth
  uint32_t max_frame_bytes = 64u << 20;   // a longer frame fails the link
  uint64_t max_pending_bytes = 64u << 20; // frames held for a session nobody subscribed yet
  double connect_timeout_s = 10;
};

class Bus {
 public:
  // Binds `options.listen` (an IP literal and a port) and starts the I/O
  // thread. InvalidArgument for bad options, Unavailable when the address
  // cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Bus>> Start(BusOptions options);
  ~Bus();  // closes every link, joins its threads
  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;

  // The bound "127.0.0.1:PORT".
  std::string address() const;
  uint32_t node() const;

  // Opens (or reuses) the persistent link to `node` listening at `address`; blocks until the
  // handshake (magic, protocol version, both node numbers, the token) succeeded or failed.
  // Links are symmetric: if the peer connected to us first, the existing link is used.
  // Errors: PermissionDenied (token refused, by either side), FailedPrecondition (protocol
  // version, node number mismatch), DeadlineExceeded (no handshake within connect_timeout_s),
  // Unavailable (cannot connect, link closed), InvalidArgument (bad address, own node).
  [[nodiscard]] absl::Status Connect(uint32_t node, const std::string& address);

  // Frames of `session` go to on_frame, link failures to on_error, until Unsubscribe.
  // Frames held for the session are delivered first, in order, on the I/O thread.
  // AlreadyExists if the session is subscribed; InvalidArgument for empty handlers.
  [[nodiscard]] absl::Status Subscribe(uint64_t session, FrameHandler on_frame, LinkErrorHandler on_error);

  // After it returns no handler of `session` runs; frames for it are dropped from then on.
  // (From inside a handler: the running handler finishes, no other one starts.)
  // Subscribe may open the session again.
  void Unsubscribe(uint64_t session);

  // Queues one frame for `node`; frames to one node arrive in the order sent. Thread-safe,
  // never blocks on the network. Error (FailedPrecondition/Unavailable naming the node) if no live link.
  // InvalidArgument if the payload is longer than max_frame_bytes.
  [[nodiscard]] absl::Status Send(uint32_t node, uint64_t session, uint64_t address, std::string_view payload);

  // Closes the link to `node` once the frames queued on it are written; no-op without one.
  void Disconnect(uint32_t node);
  // Waits until every frame queued so far on every live link has been handed
  // to its socket (the kernel delivers it even if the bus closes next), or
  // `timeout_s` passes: DeadlineExceeded naming the nodes still writing. Not
  // from a handler.
  [[nodiscard]] absl::Status Flush(double timeout_s);

  // Counters since Start. frames_* count data frames; bytes_* count them on
  // the wire (header and payload). frames_sent/bytes_sent count at Send.
  // frames_dropped: frames of unsubscribed sessions (held ones Unsubscribe
  // discarded included) and frames refused because max_pending_bytes was
  // reached. links: live links now. Held frames count header and payload
  // against max_pending_bytes.
  struct Stats {
    int64_t frames_sent, frames_received, frames_dropped, bytes_sent, bytes_received;
    int links;
  };
  Stats stats() const;

 private:
  class Impl;
  explicit Bus(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::comm::bus
