// The native backend: a c10d::Backend whose ranks (processes of one host) talk
// through one shared-memory segment per process group.
//
// Read in this order:
//   segment.cpp      the segment (named through the store, unlinked as soon as
//                    every rank mapped it), the round protocol every collective
//                    is built on (Gates, Exchange), waits that yield then sleep
//                    on a futex and notice dead peers (pidfd).
//   collectives.cpp  each collective as one or two Exchanges (all_reduce's large
//                    path as its own pipeline of rounds), the reductions (one
//                    Reduction: op, dtype, PREMUL_SUM factor; complex included),
//                    sparse all_reduce, the coalesced entry points and start/end
//                    coalescing.
//   p2p.cpp          send/recv: a byte ring per (sender, receiver) pair and a
//                    progress thread per rank that matches messages to receives.
//   work.cpp         NativeWork: a c10d::Work with a future, completed by the
//                    group's worker thread (or the thread waiting for it) once
//                    the data has landed; its duration under collectives timing.
//   recorder.hpp/cpp the flight recorder: one entry per collective and p2p call
//                    in a ring, marked started/completed as its Work runs.
//   register.cpp     construction/destruction (and shrinking) of a group and the
//                    Python module.
//
// Seeded bugs (tests/seeded/native_*.py) are planted at run time, so one
// build (the slow part of a fresh checkout's first run) serves the real
// backend and every bug: create(..., planted_bug=name) picks one (PlantedBug
// below) for the whole process. Each site asks planted(bug) once per call,
// never per element: the real backend pays a relaxed load per collective.
#pragma once

// Only ATen and c10d here: torch/extension.h (autograd, nn, pybind) is for
// register.cpp alone, which keeps the build a few minutes shorter.
#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "recorder.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace native {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr int kMaxRanks = 64;
// Bytes of one collective buffer of one rank (each rank has two: double buffering).
constexpr uint64_t kSlotBytes = 8ull << 20;
// Bytes of one stream in one round of a large collective (segment.cpp, initSync).
constexpr uint64_t kRoundBytes = 256ull << 10;
// Bytes of the byte ring of one (sender, receiver) pair.
constexpr uint64_t kRingBytes = 1ull << 20;

// ------------------------------------------------------------- planted bugs
// A bug planted on purpose for the seeded-bug gallery (tests/seeded/native_*.py
// says what each does and which clause catches it); none is the real backend.
enum class PlantedBug : int {
  none,
  skip_last_rank,     // reductions leave out the last rank (segment.cpp, collectives.cpp)
  early_completion,   // a Work completes before its data has landed (collectives.cpp)
  no_timeout,         // the group's deadline never fires (collectives.cpp)
  any_source_rank0,   // a receive from any source reports rank 0 (p2p.cpp)
  premul_first_only,  // PREMUL_SUM scales only the first rank's input (collectives.cpp)
  complex_as_real,    // complex tensors are reduced as their real view, whatever the op (collectives.cpp)
  abort_waits,        // abort() leaves a collective waiting until its deadline (segment.cpp)
  shrink_ignores_options,     // a shrunk group keeps its parent's timeout over its options (register.cpp)
  shrink_waits_for_excluded,  // a shrunk group still counts the ranks it excluded (register.cpp)
  fr_never_completed,  // flight-recorder entries are never marked completed (work.cpp)
  merge_ignores_timeout,      // a merged group keeps its parent's timeout over the one merge was given (register.cpp)
};

// Process-wide, not per group: the reduction kernels and makeReduction have no
// group at hand, and a process runs one backend's groups (a seeded run names
// one backend). Each group's creation sets it (register.cpp, create), so the
// last group created decides for every group of the process.
inline std::atomic<PlantedBug> gPlantedBug{PlantedBug::none};

inline bool planted(PlantedBug bug) { return gPlantedBug.load(std::memory_order_relaxed) == bug; }

// ------------------------------------------------------------ segment + sync
// What a rank says about the collective whose first round it publishes: every
// rank reads every rank's fingerprint, so a disagreement raises the same error
// on all of them (like backends/reference/process_group.py's _check_agreement).
struct Fingerprint {
  uint64_t seq;        // collective number in this group
  int32_t op;          // OpCode
  int32_t reduce;      // c10d::ReduceOp::RedOpType, or -1
  int32_t dtype;       // at::ScalarType, or -1
  int32_t root;        // root rank, or -1
  int64_t shape[6];    // the tensor's shape (first dims), -1 padded
  int32_t ndim;
  int32_t tensors;     // coalesced calls: how many tensors (or tensor pairs) the call has
  double factor;       // PREMUL_SUM's factor, 0 for every other collective
  int32_t layout;      // 0 strided; sparse COO: 1 + its sparse dims
  int32_t pad;
};

enum OpCode : int32_t {
  kBarrier = 1, kBroadcast, kAllreduce, kReduce, kAllgather, kGather, kScatter,
  kReduceScatter, kAlltoall
};
const char* opName(int32_t op);

// Header of one collective buffer: where each peer's bytes are this round.
struct BufferHeader {
  Fingerprint fp;                  // valid in the first round of a collective
  uint64_t sendBytes[kMaxRanks];   // first round: total bytes this rank sends each peer
  uint64_t recvBytes[kMaxRanks];   // first round: total bytes this rank expects from each peer
  uint64_t offset[kMaxRanks];      // this round: where the bytes for peer j start in data
  uint64_t length[kMaxRanks];      // this round: how many
};

struct alignas(64) RankControl {
  std::atomic<uint64_t> posted;    // last round this rank published (for diagnosis: who is missing)
  std::atomic<uint64_t> consumed;  // last round this rank has finished reading (idem)
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> p2pBell;   // futex word: bumped when a ring into this rank moved
};

struct alignas(64) RingControl {
  std::atomic<uint64_t> head;      // bytes written by the sender
  std::atomic<uint64_t> tail;      // bytes consumed by the receiver
  std::atomic<uint32_t> spaceBell; // futex word: bumped when the receiver consumed
};

// "Every rank has done step r": one arrival counter (n arrivals per round) and
// one futex word that only the last arrival of a round bumps. A round costs
// each rank one atomic add; at most one wake-up call per round, and only when
// somebody sleeps, so a rank is woken once, when it can go on (not at every
// peer's arrival).
struct alignas(64) Gate {
  std::atomic<uint64_t> count;     // arrivals so far; round r is complete at n * r
  std::atomic<uint32_t> word;      // futex word: bumped by each round's last arrival
  std::atomic<uint32_t> sleepers;  // threads asleep on word
};

struct SegmentHeader {
  uint64_t magic;
  int32_t size;
  Gate posted;    // every rank published round r: its buffer r % 2 may be read
  Gate consumed;  // every rank finished reading round r: buffers r % 2 may be rewritten
  // The first collective of the group that timed out, on any rank: 1 + that group rank (0: none) and its
  // sequence number. Read before each collective starts, so a rank that never saw the timeout (the one that
  // stayed away) fails its next collective at once instead of pairing it with the abandoned one's rounds.
  std::atomic<int32_t> timedOutRank;
  std::atomic<uint64_t> timedOutSeq;
};

// How a rank waits: spin (cheap when the peer it waits for runs on another
// core right now), then yield (on an oversubscribed host this hands the core to
// a runnable peer), then sleep on a futex word in slices of kSlice, checking on
// every slice whether the deadline passed (onTimeout throws) and whether the
// ranks waited for are still alive (onSlow throws).
struct WaitPolicy {
  int spinMicros = 2;
  int yields = 20;
  // More ranks than cores: no spin, it only delays the peer we wait for.
  static WaitPolicy forHost(int ranksOnHost);
};
constexpr Ms kSlice{50};

long futexWait(std::atomic<uint32_t>* word, uint32_t expected, Ms limit);
void futexWake(std::atomic<uint32_t>* word);
void ring(std::atomic<uint32_t>& bell, std::atomic<uint32_t>* sleepers);

inline void cpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

template <class Ready, class OnTimeout, class OnSlow>
void waitUntil(std::atomic<uint32_t>& word, std::atomic<uint32_t>* sleepers, const WaitPolicy& policy, Ready ready,
               Clock::time_point deadline, OnTimeout onTimeout, OnSlow onSlow) {
  if (ready()) return;
  if (policy.spinMicros > 0) {
    const auto until = Clock::now() + std::chrono::microseconds(policy.spinMicros);
    do {
      for (int i = 0; i < 32; ++i) {
        if (ready()) return;
        cpuRelax();
      }
    } while (Clock::now() < until);
  }
  for (int i = 0; i < policy.yields; ++i) {
    sched_yield();
    if (ready()) return;
  }
  auto lastCheck = Clock::now();
  for (;;) {
    const uint32_t seen = word.load();
    if (sleepers) sleepers->fetch_add(1);
    if (ready()) {
      if (sleepers) sleepers->fetch_sub(1);
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      if (sleepers) sleepers->fetch_sub(1);
      onTimeout();  // throws
      return;
    }
    futexWait(&word, seen, std::min(std::chrono::duration_cast<Ms>(deadline - now) + Ms(1), kSlice));
    if (sleepers) sleepers->fetch_sub(1);
    if (ready()) return;
    // by the clock, not by futex timeouts: wake-ups for others must not postpone the check
    if (Clock::now() - lastCheck >= kSlice) {
      lastCheck = Clock::now();
      onSlow();
    }
  }
}

// The last of n arrivals at round r (count reaches target = n r) wakes the sleepers.
inline void arrive(Gate& gate, uint64_t target) {
  if (gate.count.fetch_add(1) + 1 == target) ring(gate.word, &gate.sleepers);
}

class Segment {
 public:
  Segment(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Ms timeout);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentHeader* header() const { return header_; }
  RankControl* control(int r) const;
  BufferHeader* bufferHeader(int r, uint64_t round) const;
  char* bufferData(int r, uint64_t round) const;
  RingControl* ringControl(int src, int dst) const;
  char* ringData(int src, int dst) const;
  const std::string& name() const { return name_; }
  // False once rank r's process has exited (a zombie counts as exited).
  // Thread-safe; a few system calls, for the slow path only.
  bool alive(int r);

 private:
  std::string name_;
  int rank_, size_;
  size_t bytes_ = 0;
  char* base_ = nullptr;
  SegmentHeader* header_ = nullptr;
  size_t ctlOffset_, bufOffset_, ringCtlOffset_, ringOffset_;
  bool unlinked_ = false;
};

// What a reduction computes, checked once in the caller's thread (makeReduction)
// and shared by all_reduce, reduce and reduce_scatter.
struct Reduction {
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
  at::ScalarType dtype = at::kFloat;
  double factor = 1.0;  // PREMUL_SUM: every rank's input is multiplied by it before the sum
  int groupSize = 1;    // AVG divides the sum by it
};

// One stream per peer: what I send to j and where what j sends me lands.
// In reduce mode every stream into me has the same length and the n streams
// are reduced (in rank order) into reduceOut instead of copied.
struct Exchange {
  std::vector<const char*> sendPtr;
  std::vector<uint64_t> sendBytes;
  std::vector<char*> recvPtr;
  std::vector<uint64_t> recvBytes;
  bool reduce = false;
  char* reduceOut = nullptr;
  Reduction how;
  // How many distinct streams (different sendPtr/sendBytes) a rank writes at
  // most, the same number on every rank (it sizes the rounds, which must agree):
  // 1 when every rank sends one buffer to all (broadcast, all_gather), which
  // lets a round carry a whole slot. -1: up to n - 1.
  int streams = -1;
};

// ------------------------------------------------------------------ work
class NativeWork : public c10d::Work {
 public:
  NativeWork(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(Ms timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // Milliseconds from the start of the run to completion; only for Works of a
  // group whose collectives timing was enabled (enableCollectivesTiming).
  float getDuration() const override;
  void markStarted();  // the worker starts running it (timed Works only)
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  bool timed = false;  // set before the Work is queued
  int64_t recordId = -1;  // its flight-recorder entry (recorder.hpp), -1: none; set before anyone can finish it

  // Called by whoever finished the operation, after every byte is in place.
  void complete(int source = -1);
  void fail(std::exception_ptr error);
  // p2p receives: how long wait() may block, and how to withdraw the receive
  // (returns true when it was still pending, so wait() must raise).
  Ms waitLimit{0};
  std::function<bool()> cancel;
  // collectives: run the group's next queued job in the waiting thread (false:
  // nothing to run, or the worker is busy). An async collective waited on at
  // once then runs in its caller's thread, as a blocking one does: two thread
  // hand-offs fewer, most of a small collective's latency on a busy host.
  std::function<bool()> help;
  const std::string what;

 private:
  void recordCompletion();
  mutable std::mutex lock_;
  std::condition_variable doneCv_;
  bool done_ = false;
  bool finishing_ = false;  // complete()/fail() called once; done_ follows the future
  std::exception_ptr error_;
  int source_ = -1;
  Clock::time_point started_{}, ended_{};
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// --------------------------------------------------------------- p2p state
struct PostedRecv;
struct Message {             // a message being or having been received
  int src;
  int64_t tag;
  uint64_t bytes;
  uint64_t arrived = 0;      // progress thread only
  bool complete = false;     // under p2pLock_: every byte is in
  std::vector<char> heap;    // unexpected: the payload lands here
  std::shared_ptr<PostedRecv> taker;  // matched receive; payload lands in its buffer
};
struct PostedRecv {
  int src;                   // -1: any source
  int64_t tag;
  at::Tensor user;           // the caller's tensor
  at::Tensor staging;        // contiguous buffer the payload lands in
  c10::intrusive_ptr<NativeWork> work;
};
struct RingReader {          // receiver-side parse state of one incoming ring
  uint64_t headerGot = 0;
  char header[16];
  std::shared_ptr<Message> current;
};

// ---------------------------------------------------------------- backend
class NativeBackend : public c10d::Backend {
 public:
  // groupName: c10d's name for the group, if known now (setGroupUid names it later otherwise)
  NativeBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Ms timeout,
                std::vector<int64_t> globalRanks, const std::string& groupName = "");
  ~NativeBackend() override;

  const std::string getBackendName() const override { return "native"; }
  // c10d names the group after making it (ProcessGroup::setGroupName): the recorder's entries and pg_config use it
  void setGroupUid(const std::string& pgUid) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(Ms timeout) override { timeout_ = timeout; }
  // c10d sequence numbers: one per collective issued on this group, the same on every rank
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    std::lock_guard<std::mutex> guard(queueLock_);
    return seq_;
  }
  void shutdown() override;
  // abort: what is in flight fails within a slice of its sleep (checkAbortedOrDead), then shutdown as usual;
  // shutdown alone lets queued work run to completion or to its deadline.
  void abort() override;
  // Coalescing (torch's _coalescing_manager(device=...), and batch_isend_irecv
  // once a backend says it supports it): the collectives, sends and receives
  // issued between the two calls run as usual, and endCoalescing returns one
  // Work that completes when all of them have (and fails with the first failure).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // shrink_group: the ranks not excluded get a new group of their own (a new
  // segment, named through this group's store under a key of the excluded set).
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                           const c10::intrusive_ptr<Options>& optsOverride) override;
  // ProcessGroup.merge_remote_group: groups that meet in one store become one
  // group of `size` ranks (c10d numbers them in the order they reached the store),
  // with the timeout merge was given (a new segment, named through that store).
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override;
  // Works of collectives issued from now on report getDuration().
  void enableCollectivesTiming() override { timing_.store(true); }
  std::string segmentName() const { return segment_->name(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  // collectives.cpp
  using Job = std::function<void(const Fingerprint&, Clock::time_point deadline)>;
  // inputs: only for the flight recorder's sizes and dtypes
  c10::intrusive_ptr<c10d::Work> submit(OpCode op, c10d::OpType type, Fingerprint fp, Ms timeout, bool async,
                                        const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
                                        Job job);
  Fingerprint fingerprint(OpCode op, const at::Tensor* t, int reduce, int root) const;
  Fingerprint fingerprint(OpCode op, const at::Tensor* t, const Reduction& how, int root) const;
  void checkRoot(int64_t root, const char* what) const;
  void workerLoop();
  bool runOneQueued();  // the help of NativeWork::wait
  void runAllreduce(const at::Tensor& buf, const Reduction& how, const Fingerprint& fp, Clock::time_point deadline);
  void runSparseAllreduce(const at::Tensor& t, const Fingerprint& fp, Clock::time_point deadline);
  c10::intrusive_ptr<c10d::Work> allreduceSparse(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  // one all_gather_into_tensor / reduce_scatter_tensor / list all_gather, as the jobs of
  // the plain and the coalesced entry points run them
  void runAllgatherInto(const at::Tensor& out, const at::Tensor& in, const Fingerprint& fp, Clock::time_point deadline);
  void runAllgatherList(const std::vector<at::Tensor>& outs, const at::Tensor& in, const Fingerprint& fp,
                        Clock::time_point deadline);
  void runReduceScatterInto(const at::Tensor& out, const at::Tensor& in, const Reduction& how, const Fingerprint& fp,
                            Clock::time_point deadline);

  // segment.cpp: run one exchange; the first round carries fp.
  void exchange(const Exchange& x, const Fingerprint& fp, Clock::time_point deadline);
  // The round protocol for collectives that lay out their own rounds
  // (all_reduce's pipeline): beginRound waits until my next buffer is free and
  // returns the round; fill bufferHeader/bufferData(me, r), publishAndWait,
  // read the peers' buffers of round r, endRound.
  uint64_t beginRound(Clock::time_point deadline, const Fingerprint& fp);
  void endRound(uint64_t r);
  // Bytes per stream and round when a rank writes `streams` streams a round.
  uint64_t chunkBytes(int streams) const {
    return std::min<uint64_t>(roundBytes_, (kSlotBytes / std::max(1, streams)) & ~uint64_t(63));
  }
  void publishAndWait(uint64_t round, Clock::time_point deadline, const Fingerprint& fp);
  void checkAgreement(uint64_t round, const Fingerprint& fp);
  [[noreturn]] void timedOut(uint64_t round, const Fingerprint& fp, bool waitingForConsumers);
  // before a collective: a peer's collective timed out (SegmentHeader::timedOutRank), so this group is broken too
  void noticePeerTimeout();
  std::string describeRanks(const std::vector<int>& ranks) const;
  void checkPeersAlive(const std::vector<int>& ranks, const Fingerprint& fp);
  void checkAbortedOrDead(const Fingerprint& fp);  // every slice of a collective's sleep
  std::vector<int> deadAmong(const std::vector<int>& ranks);
  void initSync();  // after the segment exists: wait policy, round size, peers_
  void failReceivesFromDead();

  // p2p.cpp
  void startP2P();
  void progressLoop();
  bool drainRing(int src);
  void deliver(const std::shared_ptr<Message>& msg);
  void finishRecv(const std::shared_ptr<PostedRecv>& recv, const char* data, uint64_t bytes, int src);
  c10::intrusive_ptr<c10d::Work> postRecv(at::Tensor& tensor, int src, int tag);
  void checkPeer(int peer, const char* what) const;
  void track(const c10::intrusive_ptr<NativeWork>& work);  // joins the coalesced Works, if coalescing
  // the flight-recorder entry of a p2p call just issued, marked started (a p2p call runs at once)
  void recordP2P(NativeWork& work, const std::string& name, const at::Tensor& tensor);

  // state
  c10::intrusive_ptr<c10d::Store> store_;
  std::map<std::string, int> shrinks_;  // shrinks of this group per excluded set (their store keys)
  std::unique_ptr<Segment> segment_;
  WaitPolicy policy_;
  uint64_t roundBytes_ = 0; // at most this many bytes per peer stream per round (cache-sized rounds)
  std::vector<int> peers_;  // every rank but this one: whose liveness a wait checks
  Ms timeout_;
  Ms running_{0};           // the timeout of the collective the worker runs now
  std::vector<int64_t> globalRanks_;
  uint64_t round_ = 0;      // rounds this rank has published (worker thread only)
  uint64_t seq_ = 0;        // collectives issued (caller threads, under queueLock_)
  bool broken_ = false;     // a collective timed out: the group is unusable (worker thread only)
  std::string brokenWhy_;

  std::mutex queueLock_;
  std::condition_variable queueCv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  bool busy_ = false;       // a job runs (in the worker, or inline in a caller's thread)
  std::thread worker_;
  bool coalescing_ = false; // between startCoalescing and endCoalescing (under queueLock_)
  std::vector<c10::intrusive_ptr<NativeWork>> coalesced_;  // the Works issued meanwhile
  std::atomic<bool> timing_{false};
  std::shared_ptr<RecordedGroup> frGroup_;  // how the flight recorder knows this group (recorder.hpp)

  // p2p
  std::mutex p2pLock_;
  std::list<std::shared_ptr<Message>> unexpected_;   // arrival order, all sources
  std::list<std::shared_ptr<PostedRecv>> posted_;     // posting order
  std::vector<RingReader> readers_;
  std::vector<std::mutex> sendLocks_;
  std::atomic<bool> p2pStop_{false};
  std::thread progress_;
  bool shutDown_ = false;
  std::atomic<bool> aborted_{false};  // set by abort() in any thread, read by the worker's waits
  std::mutex shutdownLock_;
};

// collectives.cpp: the reduction `op` asks for on `dtype`, or the error naming
// why that pair is refused (the reference's rules, backends/reference/semantics.py).
Reduction makeReduction(const c10d::ReduceOp& op, at::ScalarType dtype, int groupSize);
// The dtype and shape of `t` (none for nullptr) in fp.
void describe(Fingerprint& fp, const at::Tensor* t);
// Reduce n sources (rank order) into out, `count` elements.
void reduceInto(char* out, const std::vector<const char*>& srcs, uint64_t count, const Reduction& how);
std::string dtypeName(int32_t dtype);

}  // namespace native
