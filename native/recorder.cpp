// The flight recorder's ring (recorder.hpp says what it holds and why).
#include "recorder.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <pthread.h>

#include <utility>

namespace native {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void shapesOf(const std::vector<at::Tensor>& tensors, std::vector<std::vector<int64_t>>& sizes,
              std::vector<std::string>& dtypes) {
  sizes.reserve(tensors.size());
  dtypes.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    sizes.emplace_back(t.sizes().begin(), t.sizes().end());
    dtypes.emplace_back(c10::toString(t.scalar_type()));  // "Float", as torch's dumps spell it
  }
}

}  // namespace

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: Works may finish during exit
  return *recorder;
}

void FlightRecorder::sizeOnce(int64_t capacity) {
  std::lock_guard<std::mutex> guard(lock_);
  if (capacity_ < 0) capacity_ = std::max<int64_t>(capacity, 0);
}

std::shared_ptr<RecordedGroup> FlightRecorder::addGroup(const c10d::Backend* owner, const std::string& name,
                                                        std::vector<int64_t> ranks) {
  auto group = std::make_shared<RecordedGroup>();
  group->owner = owner;
  group->name = name;
  group->ranks = std::move(ranks);
  std::lock_guard<std::mutex> guard(lock_);
  group->pgId = nextGroup_++;
  if (!name.empty()) named_[name] = group;
  return group;
}

void FlightRecorder::rename(const std::shared_ptr<RecordedGroup>& group, const std::string& name) {
  std::lock_guard<std::mutex> guard(lock_);
  group->name = name;
  if (!name.empty()) named_[name] = group;
}

void FlightRecorder::forget(const std::shared_ptr<RecordedGroup>& group) {
  std::lock_guard<std::mutex> guard(lock_);
  if (!group->owner) return;
  group->desc = group->owner->getGroupDesc().empty() ? group->desc : group->owner->getGroupDesc();
  group->owner = nullptr;
}

int64_t FlightRecorder::record(const std::shared_ptr<RecordedGroup>& group, const std::string& desc,
                               std::string name, uint64_t seq, bool p2p, const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout) noexcept {
  try {
    RecordedEntry entry;  // filled outside the lock: only the counters and the ring write are under it
    shapesOf(inputs, entry.inputSizes, entry.inputDtypes);
    shapesOf(outputs, entry.outputSizes, entry.outputDtypes);
    // asked once per thread: the name is a system call (the worker names itself before it records anything)
    thread_local const std::pair<std::string, std::string> thread = [] {
      char name[16] = {0};
      pthread_getname_np(pthread_self(), name, sizeof(name));
      return std::make_pair(std::string(name), std::to_string(static_cast<uint64_t>(pthread_self())));
    }();
    entry.threadName = thread.first;
    entry.threadId = thread.second;
    entry.profilingName = std::move(name);
    entry.timeCreatedNs = nowNs();
    entry.timeoutMs = timeout.count();
    entry.isP2p = p2p;
    entry.group = group;
    std::lock_guard<std::mutex> guard(lock_);
    if (capacity_ <= 0) return -1;
    if (!desc.empty()) group->desc = desc;
    group->opId += 1;
    if (p2p) {
      group->p2pSeq += 1;
    } else {
      group->enqueued = static_cast<int64_t>(seq);
    }
    // a p2p call carries the group's last collective number, as torch's does
    entry.collectiveSeqId = p2p ? std::max<int64_t>(group->enqueued, 0) : static_cast<int64_t>(seq);
    entry.p2pSeqId = group->p2pSeq;
    entry.opId = group->opId;
    entry.pgName = group->name;
    entry.pgDesc = group->desc;
    entry.recordId = nextRecord_++;
    if (!group->name.empty()) named_.emplace(group->name, group);  // keeps a newer group of that name
    if (static_cast<int64_t>(ring_.size()) < capacity_) {
      ring_.push_back(std::move(entry));
    } else {
      ring_[entry.recordId % capacity_] = std::move(entry);
    }
    return nextRecord_ - 1;
  } catch (...) {  // never into the call: counted, and the dump says so
    std::lock_guard<std::mutex> guard(lock_);
    ++errors_;
    return -1;
  }
}

RecordedEntry* FlightRecorder::slot(int64_t id) {
  if (id < 0 || capacity_ <= 0 || ring_.empty()) return nullptr;
  RecordedEntry& entry = ring_[id % capacity_ % static_cast<int64_t>(ring_.size())];
  return entry.recordId == id ? &entry : nullptr;
}

void FlightRecorder::started(int64_t id) noexcept {
  if (id < 0) return;
  std::lock_guard<std::mutex> guard(lock_);
  RecordedEntry* entry = slot(id);
  if (!entry || entry->state != EntryState::scheduled) return;
  entry->state = EntryState::started;
  entry->timeStartedNs = nowNs();
  if (!entry->isP2p) entry->group->started = std::max(entry->group->started, entry->collectiveSeqId);
}

void FlightRecorder::completed(int64_t id) noexcept {
  if (id < 0) return;
  std::lock_guard<std::mutex> guard(lock_);
  RecordedEntry* entry = slot(id);
  if (!entry || entry->state == EntryState::completed) return;
  const int64_t now = nowNs();
  if (!entry->timeStartedNs) entry->timeStartedNs = now;
  entry->timeCompletedNs = now;
  entry->state = EntryState::completed;
  entry->retired = true;
  if (!entry->isP2p) {
    auto& group = *entry->group;
    group.started = std::max(group.started, entry->collectiveSeqId);
    group.completed = std::max(group.completed, entry->collectiveSeqId);
  }
}

void FlightRecorder::failed(int64_t id) noexcept {
  if (id < 0) return;
  std::lock_guard<std::mutex> guard(lock_);
  RecordedEntry* entry = slot(id);
  if (!entry) return;
  entry->retired = true;
  if (!entry->isP2p) entry->group->completed = std::max(entry->group->completed, entry->collectiveSeqId);
}

FlightRecorder::Snapshot FlightRecorder::snapshot() {
  Snapshot out;
  std::lock_guard<std::mutex> guard(lock_);
  out.capacity = std::max<int64_t>(capacity_, 0);
  out.errors = errors_;
  out.entries.reserve(ring_.size());
  const size_t n = ring_.size();
  const size_t first = n < static_cast<size_t>(std::max<int64_t>(capacity_, 1)) ? 0 : nextRecord_ % capacity_;
  for (size_t i = 0; i < n; ++i) out.entries.push_back(ring_[(first + i) % n]);
  for (auto& [name, group] : named_) {
    // torch sets a group's description after making it, on the Backend (c10d's setGroupDesc, not virtual)
    if (group->owner && !group->owner->getGroupDesc().empty()) group->desc = group->owner->getGroupDesc();
    out.groups.push_back(*group);
  }
  return out;
}

}  // namespace native
