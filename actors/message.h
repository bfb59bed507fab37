#pragma once
// Actor messages (DESIGN §8) and the bus that carries them. A message is a
// small value type: registers are named by (register desc id, index), never
// by pointer, so the same message can cross a process boundary unchanged.

#include <cstdint>
#include <string>

namespace tessera::actors {

enum class MessageType : uint8_t {
  kRegisterReady,  // producer -> consumer: register (desc, index) holds data
  kRegisterAck,    // consumer -> producer: done reading register (desc, index)
  kEord,           // producer -> consumer: no more registers of desc
  kCommand,        // runtime -> actor
};

// kResume: an asynchronous operation of the actor (a collective, a
// transfer) completed; sent by its completion callback, from any thread.
enum class Command : uint8_t { kStart, kStop, kResume };

struct Message {
  MessageType type = MessageType::kCommand;
  Command command = Command::kStart;  // kCommand only
  int32_t register_index = 0;         // kRegisterReady / kRegisterAck
  int64_t register_desc_id = 0;       // all but kCommand
  uint64_t src = 0;                   // actor id (0 for the runtime)
  uint64_t dst = 0;                   // actor id

  static Message Ready(uint64_t src, uint64_t dst, int64_t desc_id, int32_t index) {
    return Message{MessageType::kRegisterReady, Command::kStart, index, desc_id, src, dst};
  }
  static Message Ack(uint64_t src, uint64_t dst, int64_t desc_id, int32_t index) {
    return Message{MessageType::kRegisterAck, Command::kStart, index, desc_id, src, dst};
  }
  static Message Eord(uint64_t src, uint64_t dst, int64_t desc_id) {
    return Message{MessageType::kEord, Command::kStart, 0, desc_id, src, dst};
  }
  static Message Cmd(uint64_t dst, Command command) {
    return Message{MessageType::kCommand, command, 0, 0, 0, dst};
  }
  // "ready(desc 3, #1) 5 -> 7" for logs and test failures.
  std::string ToString() const;
};

// Delivers messages to actors by id. Implementations: the threaded in-process
// bus (runtime.cc), the stepped executor's queue; a network bus later.
// Send may be called from any actor thread; implementations are thread-safe
// as far as their executor needs.
class MessageBus {
 public:
  virtual ~MessageBus() = default;
  virtual void Send(const Message& message) = 0;
};

}  // namespace tessera::actors
