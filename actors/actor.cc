// The base of every actor: register bookkeeping, the message protocol,
// termination (actors/actor.h). The kinds are in actors/kinds/.
#include "actors/actor.h"

#include "actors/actor_id.h"
#include "actors/kinds/kinds.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::actors {

Actor::Actor(const proto::Task& task, const ActorEnvironment& env) : task_(task), env_(env) {}

absl::StatusOr<std::unique_ptr<Actor>> Actor::Create(const proto::Task& task, const ActorEnvironment& env) {
  switch (task.kind()) {
    case proto::ACTOR_KIND_SOURCE: return internal::MakeSourceActor(task, env);
    case proto::ACTOR_KIND_COMPUTE: return internal::MakeComputeActor(task, env);
    case proto::ACTOR_KIND_PARAMETER: return internal::MakeParameterActor(task, env);
    case proto::ACTOR_KIND_REPEAT: return internal::MakeRepeatActor(task, env);
    case proto::ACTOR_KIND_ACC: return internal::MakeAccActor(task, env);
    case proto::ACTOR_KIND_SINK: return internal::MakeSinkActor(task, env);
    case proto::ACTOR_KIND_COLLECTIVE: return internal::MakeCollectiveActor(task, env);
    case proto::ACTOR_KIND_SEND:
    case proto::ACTOR_KIND_RECV: return internal::MakeTransferActor(task, env);
    default: break;
  }
  return absl::InvalidArgumentError(StrCat("task '", task.name(), "' has unknown kind ", static_cast<int>(task.kind())));
}

absl::Status Actor::Init() {
  if (task_.async_acts() && env_.stream == nullptr) {
    return absl::FailedPreconditionError("the task acts asynchronously, but the executor gave it no stream");
  }
  for (int64_t desc_id : task_.consumed_register_desc_ids()) {
    auto it = env_.registers->find(desc_id);
    if (it == env_.registers->end()) return absl::InvalidArgumentError(StrCat("no registers for desc ", desc_id));
    Consumed c;
    c.desc_id = desc_id;
    c.producer = it->second.desc->producer();
    c.registers = &it->second;
    consumed_.push_back(std::move(c));
  }
  for (int64_t desc_id : task_.produced_register_desc_ids()) {
    auto it = env_.registers->find(desc_id);
    if (it == env_.registers->end()) return absl::InvalidArgumentError(StrCat("no registers for desc ", desc_id));
    Produced p;
    p.desc_id = desc_id;
    p.registers = &it->second;
    p.consumers.assign(it->second.desc->consumers().begin(), it->second.desc->consumers().end());
    p.reading_count.assign(it->second.registers.size(), 0);
    for (size_t i = 0; i < it->second.registers.size(); ++i) p.free.push_back(static_cast<int32_t>(i));
    produced_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

std::string Actor::Describe() const {
  const ActorId actor_id = DecodeActorId(id());
  std::string out = StrCat("actor '", name(), "'");
  if (!task_.op().empty()) out += StrCat(" (op '", task_.op(), "')");
  return StrCat(out, " on ", actor_id.device().ToString(), " [", actor_id.ToString(), "]");
}

std::string Actor::DescribeWait(const std::function<std::string(uint64_t)>& name_of) const {
  std::vector<std::string> parts;
  if (!started_) parts.push_back("its start");
  for (const Consumed& c : consumed_) {
    if (c.ready.empty() && !c.eord) parts.push_back(StrCat("a ready register of desc ", c.desc_id, " from ", name_of(c.producer)));
  }
  for (const Produced& p : produced_) {
    const size_t out = p.reading_count.size() - p.free.size();
    if (eord_sent_ ? out == 0 : !p.free.empty()) continue;
    std::vector<std::string> readers;
    for (uint64_t consumer : p.consumers) readers.push_back(name_of(consumer));
    parts.push_back(StrCat(eord_sent_ ? "its registers of desc " : "a free register of desc ", p.desc_id, " (", out, " of ",
                           p.reading_count.size(), " held by ", Join(readers, ", "), ")"));
  }
  if (!deferred_.empty()) parts.push_back(StrCat(deferred_.size(), " act(s) in flight on ", env_.stream->name()));
  std::string kind = DescribeKindWait();
  if (!kind.empty()) parts.push_back(std::move(kind));
  return Join(parts, ", ");
}

absl::Status Actor::Annotate(const absl::Status& status) const {
  if (IsSelfDescribed(status)) return status;
  return absl::Status(status.code(), StrCat(Describe(), ": ", status.message()));
}

bool Actor::ShouldEnd() const { return !consumed_.empty() && AllConsumedExhausted(); }

bool Actor::AllConsumedReady() const {
  for (const Consumed& c : consumed_) {
    if (c.ready.empty()) return false;
  }
  return true;
}
bool Actor::AllProducedFree() const {
  for (const Produced& p : produced_) {
    if (p.free.empty()) return false;
  }
  return true;
}
bool Actor::AllConsumedExhausted() const {
  for (const Consumed& c : consumed_) {
    if (!c.exhausted()) return false;
  }
  return true;
}

int32_t Actor::TakeFree(Produced& p) {
  const int32_t index = p.free.front();
  p.free.pop_front();
  if (env_.arena != nullptr) env_.arena->Claim(p.desc_id, index);
  return index;
}

void Actor::SendReady(Produced& p, int32_t index) {
  if (p.consumers.empty()) {
    if (env_.arena != nullptr) env_.arena->Release(p.desc_id, index);
    p.free.push_back(index);
    return;
  }
  p.reading_count[static_cast<size_t>(index)] = static_cast<int32_t>(p.consumers.size());
  for (uint64_t consumer : p.consumers) env_.bus->Send(Message::Ready(id(), consumer, p.desc_id, index));
}

void Actor::AckFront(Consumed& c) {
  const int32_t index = c.ready.front();
  c.ready.pop_front();
  if (env_.arena != nullptr) env_.arena->Release(c.desc_id, index);
  env_.bus->Send(Message::Ack(id(), c.producer, c.desc_id, index));
}

void Actor::AckAll() {
  if (env_.arena != nullptr) {
    for (Consumed& c : consumed_) env_.arena->Release(c.desc_id, c.ready.front());
  }
  for (Consumed& c : consumed_) {
    const int32_t index = c.ready.front();
    c.ready.pop_front();
    env_.bus->Send(Message::Ack(id(), c.producer, c.desc_id, index));
  }
}

void Actor::Defer(std::function<void()> handoff) {
  deferred_.push_back(std::move(handoff));
  env_.stream->OnComplete([completions = completions_, bus = env_.bus, actor = id()](absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(completions->mu);
      if (status.ok()) {
        ++completions->completed;
      } else if (completions->error.ok()) {
        completions->error = std::move(status);
      }
    }
    bus->Send(Message::Cmd(actor, Command::kResume));
  });
}

absl::StatusOr<bool> Actor::Retire() {
  int64_t completed = 0;
  {
    std::lock_guard<std::mutex> lock(completions_->mu);
    if (!completions_->error.ok()) return completions_->error;
    completed = completions_->completed;
  }
  if (retired_ == completed) return false;
  for (; retired_ < completed; ++retired_) {
    std::function<void()> handoff = std::move(deferred_.front());
    deferred_.pop_front();
    handoff();
  }
  return true;
}

void Actor::AckRegister(const Consumed& c, int32_t index) {
  if (env_.arena != nullptr) env_.arena->Release(c.desc_id, index);
  env_.bus->Send(Message::Ack(id(), c.producer, c.desc_id, index));
}

absl::Status Actor::Apply(const Message& message) {
  switch (message.type) {
    case MessageType::kCommand:
      if (message.command == Command::kStart) started_ = true;
      return absl::OkStatus();
    case MessageType::kRegisterReady:
    case MessageType::kEord:
      for (Consumed& c : consumed_) {
        if (c.desc_id != message.register_desc_id) continue;
        if (c.eord) return absl::InternalError(StrCat("message after Eord: ", message.ToString()));
        if (message.type == MessageType::kEord) {
          c.eord = true;
        } else {
          c.ready.push_back(message.register_index);
        }
        return absl::OkStatus();
      }
      break;
    case MessageType::kRegisterAck:
      for (Produced& p : produced_) {
        if (p.desc_id != message.register_desc_id) continue;
        const auto index = static_cast<size_t>(message.register_index);
        if (index >= p.reading_count.size() || p.reading_count[index] <= 0) {
          return absl::InternalError(StrCat("ack of a register nobody reads: ", message.ToString()));
        }
        if (--p.reading_count[index] == 0) p.free.push_back(message.register_index);
        return absl::OkStatus();
      }
      break;
  }
  return absl::InternalError(StrCat("message for a desc the actor does not have: ", message.ToString()));
}

absl::Status Actor::MaybeEnd() {
  if (!eord_sent_ && ShouldEnd()) {
    RETURN_IF_ERROR(CheckEnd());
    for (const Produced& p : produced_) {
      for (uint64_t consumer : p.consumers) env_.bus->Send(Message::Eord(id(), consumer, p.desc_id));
    }
    eord_sent_ = true;
  }
  bool all_eord = true;
  for (const Consumed& c : consumed_) all_eord &= c.eord;
  bool all_returned = true;
  for (const Produced& p : produced_) all_returned &= p.all_free();
  if (eord_sent_ && all_eord && AllConsumedExhausted() && all_returned && !Busy()) {
    RETURN_IF_ERROR(CheckEnd());
    done_ = true;
  } else if (all_eord && !consumed_.empty() && !AllConsumedExhausted() && all_returned && !Busy()) {
    // Nothing can arrive any more that would let the actor act again.
    return absl::FailedPreconditionError("inputs ended with unmatched registers (uneven register streams)");
  }
  return absl::OkStatus();
}

absl::Status Actor::Handle(const Message& message) {
  absl::Status status = Apply(message);
  if (status.ok() && started_ && !done_) {
    while (true) {
      absl::StatusOr<bool> progressed = ActOnce();
      if (!progressed.ok()) {
        status = progressed.status();
        break;
      }
      if (!*progressed) break;
    }
    if (status.ok()) status = MaybeEnd();
  }
  if (!status.ok()) return Annotate(status);
  return absl::OkStatus();
}

std::string Message::ToString() const {
  // (Actors by their fields: the packed ids read as 68719476736.)
  const std::string to = ActorIdToString(dst);
  switch (type) {
    case MessageType::kRegisterReady:
      return StrCat("ready(desc ", register_desc_id, ", #", register_index, ") ", ActorIdToString(src), " -> ", to);
    case MessageType::kRegisterAck:
      return StrCat("ack(desc ", register_desc_id, ", #", register_index, ") ", ActorIdToString(src), " -> ", to);
    case MessageType::kEord:
      return StrCat("eord(desc ", register_desc_id, ") ", ActorIdToString(src), " -> ", to);
    case MessageType::kCommand:
      return StrCat(command == Command::kStart ? "start" : command == Command::kStop ? "stop" : "resume", " -> ", to);
  }
  return "?";
}

}  // namespace tessera::actors
