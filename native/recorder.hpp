// The native backend's flight recorder: what torch's recorder would hold of its calls.
//
// torch 2.13 cannot be recorded into from an extension (native/__init__.py's
// gap quotes the undefined symbol), so, like the reference backend, native
// keeps a recorder of its own: one per process, a ring of the last N entries
// (N from Python, backends/flight_recorders.recorder_size: torch's variables,
// 0 = off), one entry per collective and p2p call with torch's fields. The
// extension hands a snapshot to Python (register.cpp, flight_records), which
// formats it as torch's dumps (native/flight_recorder.py).
//
// Recording is a mutex-protected ring write and never throws into the call it
// records: an error is counted and shown in the dump.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace native {

enum class EntryState : uint8_t { scheduled, started, completed };

// One process group as the recorder knows it; counters under FlightRecorder's lock.
struct RecordedGroup {
  int64_t pgId = 0;              // creation number in this process
  std::string name, desc = "undefined";
  std::vector<int64_t> ranks;    // global ranks
  const c10d::Backend* owner = nullptr;  // the live group (desc refreshed from it), nullptr once destroyed
  int64_t p2pSeq = 0, opId = 0;
  int64_t enqueued = -1, started = -1, completed = -1;  // collective_seq_id of the last one; -1: none
};

struct RecordedEntry {
  int64_t recordId = -1;
  std::shared_ptr<RecordedGroup> group;
  std::string pgName, pgDesc;    // as the group was named when the call was issued
  std::string threadName, threadId;
  int64_t collectiveSeqId = 0, p2pSeqId = 0, opId = 0;
  std::string profilingName;
  int64_t timeCreatedNs = 0, timeStartedNs = 0, timeCompletedNs = 0;  // 0: not yet
  std::vector<std::vector<int64_t>> inputSizes, outputSizes;
  std::vector<std::string> inputDtypes, outputDtypes;
  EntryState state = EntryState::scheduled;
  bool retired = false;  // its Work ended: completed, or failed (then its state stays as it was)
  int64_t timeoutMs = 0;
  bool isP2p = false;
};

class FlightRecorder {
 public:
  static FlightRecorder& get();  // the process's one

  // The first group of the process sizes it; later calls change nothing (torch reads its size once too).
  void sizeOnce(int64_t capacity);
  std::shared_ptr<RecordedGroup> addGroup(const c10d::Backend* owner, const std::string& name,
                                          std::vector<int64_t> ranks);
  void rename(const std::shared_ptr<RecordedGroup>& group, const std::string& name);
  void forget(const std::shared_ptr<RecordedGroup>& group);  // its group is being destroyed

  // A call was issued: its record id, or -1 when the recorder is off (or recording failed).
  // seq: the group's collective number (collectives); p2p calls count their own.
  int64_t record(const std::shared_ptr<RecordedGroup>& group, const std::string& desc, std::string name,
                 uint64_t seq, bool p2p, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout) noexcept;
  void started(int64_t id) noexcept;
  void completed(int64_t id) noexcept;
  // The Work ended with an error: retired and counted in pg_status's last completed collective, as torch's recorders
  // count it (ProcessGroupNCCL's watchdog: a Work with an exception isCompleted()), its state left as it was (NCCL's
  // entry stays "started": its end event never came)
  void failed(int64_t id) noexcept;

  struct Snapshot {
    int64_t capacity = 0;
    int64_t errors = 0;
    std::vector<RecordedEntry> entries;  // oldest first
    std::vector<RecordedGroup> groups;   // the newest group of each name
  };
  Snapshot snapshot();

 private:
  RecordedEntry* slot(int64_t id);  // under lock_; nullptr when the ring moved past it

  std::mutex lock_;
  int64_t capacity_ = -1;  // -1: not sized yet (records nothing)
  int64_t nextRecord_ = 0, nextGroup_ = 0, errors_ = 0;
  std::vector<RecordedEntry> ring_;
  std::map<std::string, std::shared_ptr<RecordedGroup>> named_;
};

}  // namespace native
