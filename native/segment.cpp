// The shared segment, futex waits, and the round protocol (Exchange).
//
// Segment: rank 0 creates a POSIX shared-memory object under a fresh name and
// publishes the name in the group's store; the others open it; once every rank
// has mapped it, rank 0 unlinks the name. From then on the memory lives only as
// long as some rank maps it: nothing is left in /dev/shm whether the group is
// destroyed or a rank is killed.
//
// Rounds: each rank owns two collective buffers (double buffering). In round r
// a rank writes what it sends each peer into buffer r % 2, publishes r, waits
// until every rank published r, reads what the peers wrote for it, and marks r
// consumed. Before writing round r it waits until every rank consumed round
// r - 2, the last user of that buffer. "Every rank published/consumed r" is a
// Gate: an arrival counter (n per round) and a futex word that only the last
// arrival bumps, so a sleeping rank is woken once per round, when it can go
// on. Per-rank posted/consumed marks stay for the diagnosis (who is missing).
// The first round of a collective also carries the rank's fingerprint and its
// total send/receive sizes per peer: every rank checks them all, so a
// disagreement raises the same error everywhere and never hangs.
//
// Every wait (rounds, p2p ring space, the p2p progress thread) checks, each
// kSlice of sleep, whether the peers' processes are alive (pidfd): a rank
// killed mid-collective fails the others' Works at once, naming it, instead
// of at the group timeout; the group is unusable afterwards.
#include "native.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sched.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

namespace native {

namespace {
constexpr uint64_t kMagic = 0x646973636f6e6632ull;  // "discon f2"
constexpr size_t kPage = 4096;
size_t roundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// Whether a process has exited without a pidfd: signal 0 fails for a reaped
// process, and a zombie (exited, its parent has not waited yet) reads 'Z'.
bool exitedByProc(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char buf[512];
  size_t got = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[got] = 0;
  const char* close = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}
}  // namespace

long futexWait(std::atomic<uint32_t>* word, uint32_t expected, Ms limit) {
  timespec ts{static_cast<time_t>(limit.count() / 1000), static_cast<long>((limit.count() % 1000) * 1000000)};
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Measured on the 2-core CI host with other jobs running (suites/stress/
// collectives.py, all_reduce, native vs gloo): yielding beats spinning at 2 and
// at 4 ranks, for 8 B (about half the latency) and for 16 MiB. On an idle core
// sched_yield returns at once, so the yields act as a short spin; on a busy one
// they hand the core to whoever runs next, often the very peer we wait for.
WaitPolicy WaitPolicy::forHost(int ranksOnHost) {
  WaitPolicy p;
  p.spinMicros = ranksOnHost > usableCpus() ? 0 : 2;
  p.yields = 20;
  // tuning knobs for measurements, not for users
  p.spinMicros = envInt("DISTCONFORM_NATIVE_SPIN_US", p.spinMicros);
  p.yields = envInt("DISTCONFORM_NATIVE_YIELDS", p.yields);
  return p;
}

const char* opName(int32_t op) {
  switch (op) {
    case kBarrier: return "barrier";
    case kBroadcast: return "broadcast";
    case kAllreduce: return "all_reduce";
    case kReduce: return "reduce";
    case kAllgather: return "all_gather";
    case kGather: return "gather";
    case kScatter: return "scatter";
    case kReduceScatter: return "reduce_scatter";
    case kAlltoall: return "all_to_all";
    default: return "unknown";
  }
}

// ------------------------------------------------------------------ waiting
void ring(std::atomic<uint32_t>& bell, std::atomic<uint32_t>* sleepers) {
  bell.fetch_add(1);
  if (sleepers == nullptr || sleepers->load() > 0) futexWake(&bell);
}

// ------------------------------------------------------------------ segment
Segment::Segment(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Ms timeout)
    : rank_(rank), size_(size) {
  ctlOffset_ = kPage;
  bufOffset_ = roundUp(ctlOffset_ + sizeof(RankControl) * size, kPage);
  size_t perBuffer = roundUp(sizeof(BufferHeader), kPage) + kSlotBytes;
  ringCtlOffset_ = bufOffset_ + perBuffer * 2 * size;
  ringOffset_ = roundUp(ringCtlOffset_ + sizeof(RingControl) * size * size, kPage);
  bytes_ = ringOffset_ + kRingBytes * size * size;

  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    std::ostringstream name;
    name << "/distconform-native-" << getpid() << "-" << std::hex << rd() << rd();
    name_ = name.str();
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    TORCH_CHECK(fd >= 0, "native: shm_open(", name_, ") failed: ", strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(name_.c_str());
      TORCH_CHECK(false, "native: sizing the shared segment to ", bytes_, " bytes failed: ", strerror(err));
    }
  } else {
    auto value = store->get("native/segment");
    name_.assign(value.begin(), value.end());
    fd = shm_open(name_.c_str(), O_RDWR, 0600);
    TORCH_CHECK(fd >= 0, "native: rank ", rank, " cannot open the group's segment ", name_, ": ",
                strerror(errno));
  }
  void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the memory; no descriptor stays open
  if (base == MAP_FAILED) {
    if (rank == 0) shm_unlink(name_.c_str());
    TORCH_CHECK(false, "native: mmap of ", bytes_, " bytes failed: ", strerror(err));
  }
  base_ = static_cast<char*>(base);
  header_ = reinterpret_cast<SegmentHeader*>(base_);
  if (rank == 0) {
    header_->magic = kMagic;
    header_->size = size;
    store->set("native/segment", std::vector<uint8_t>(name_.begin(), name_.end()));
  }
  control(rank)->pid.store(getpid());
  store->set("native/attached/" + std::to_string(rank), std::vector<uint8_t>{'1'});
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back("native/attached/" + std::to_string(r));
    try {
      store->wait(keys, timeout);
    } catch (...) {
      shm_unlink(name_.c_str());  // a rank never came: leave nothing behind
      munmap(base_, bytes_);
      throw;
    }
    shm_unlink(name_.c_str());
    unlinked_ = true;
  } else {
    TORCH_CHECK(header_->magic == kMagic && header_->size == size, "native: segment ", name_,
                " belongs to a group of ", header_->size, " ranks, this group has ", size);
  }
}

Segment::~Segment() {
  if (rank_ == 0 && !unlinked_) shm_unlink(name_.c_str());
  if (base_) munmap(base_, bytes_);
}

bool Segment::alive(int r) {
  if (r == rank_) return true;
  const int pid = control(r)->pid.load();
  if (pid <= 0) return true;  // not attached yet: the store's wait covers that
  // A pidfd is readable once the process exited, zombie or not. Opened and
  // closed per check: a group holds no descriptor (the life-cycle clauses
  // count them), and a check is a slow-path event (every kSlice of sleep).
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    if (errno == ESRCH) return false;
    return !exitedByProc(pid);  // no pidfd_open here (old kernel, sandbox)
  }
  pollfd p{fd, POLLIN, 0};
  const bool exited = poll(&p, 1, 0) > 0;
  close(fd);
  return !exited;
}

RankControl* Segment::control(int r) const {
  return reinterpret_cast<RankControl*>(base_ + ctlOffset_) + r;
}

BufferHeader* Segment::bufferHeader(int r, uint64_t round) const {
  size_t perBuffer = roundUp(sizeof(BufferHeader), kPage) + kSlotBytes;
  return reinterpret_cast<BufferHeader*>(base_ + bufOffset_ + perBuffer * (2 * r + round % 2));
}

char* Segment::bufferData(int r, uint64_t round) const {
  return reinterpret_cast<char*>(bufferHeader(r, round)) + roundUp(sizeof(BufferHeader), kPage);
}

RingControl* Segment::ringControl(int src, int dst) const {
  return reinterpret_cast<RingControl*>(base_ + ringCtlOffset_) + (src * size_ + dst);
}

char* Segment::ringData(int src, int dst) const {
  return base_ + ringOffset_ + kRingBytes * (src * size_ + dst);
}

// ------------------------------------------------------------------ rounds
void NativeBackend::initSync() {
  const int n = getSize();
  // the world has at least as many ranks as the largest global rank of this group says
  int ranksOnHost = n;
  for (int64_t g : globalRanks_) ranksOnHost = std::max<int>(ranksOnHost, static_cast<int>(g) + 1);
  policy_ = WaitPolicy::forHost(ranksOnHost);
  // Per stream and round, kRoundBytes (exchange() caps it so that the
  // collective's streams fit the slot): what a round publishes is read by
  // the peers while it is still in the shared cache. Measured at 16 MiB,
  // 4 ranks on 2 cores: 128-512 KiB rounds about 1.3x faster than 2-8 MiB ones.
  const uint64_t want = static_cast<uint64_t>(envInt("DISTCONFORM_NATIVE_ROUND_KB", 0)) << 10;
  roundBytes_ = want ? std::max<uint64_t>(64, want & ~uint64_t(63)) : kRoundBytes;
  for (int r = 0; r < n; ++r)
    if (r != getRank()) peers_.push_back(r);
}

std::string NativeBackend::describeRanks(const std::vector<int>& ranks) const {
  std::ostringstream out;
  out << "group ranks [";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "] (global ranks [";
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << (ranks[i] < (int)globalRanks_.size() ? globalRanks_[ranks[i]] : ranks[i]);
  out << "])";
  return out.str();
}

void NativeBackend::timedOut(uint64_t round, const Fingerprint& fp, bool waitingForConsumers) {
  std::vector<int> missing;
  for (int r = 0; r < getSize(); ++r) {
    auto* c = segment_->control(r);
    uint64_t have = waitingForConsumers ? c->consumed.load() : c->posted.load();
    uint64_t want = waitingForConsumers ? round - 2 : round;
    if (have < want) missing.push_back(r);
  }
  std::ostringstream msg;
  msg << "native: " << opName(fp.op) << " (collective #" << fp.seq << ") timed out after "
      << running_.count() / 1000.0 << " s on rank " << getRank() << ": "
      << (waitingForConsumers ? "still waiting for " : "no message from ") << describeRanks(missing)
      << (waitingForConsumers ? " to finish the previous collective" : "");
  broken_ = true;
  brokenWhy_ = msg.str();
  int32_t none = 0;  // the first timeout of the group is the one its members are told about
  if (segment_->header()->timedOutRank.compare_exchange_strong(none, getRank() + 1))
    segment_->header()->timedOutSeq.store(fp.seq);
  TORCH_CHECK(false, brokenWhy_);
}

void NativeBackend::noticePeerTimeout() {
  const int32_t by = segment_->header()->timedOutRank.load();
  if (broken_ || by == 0) return;
  std::ostringstream msg;
  msg << "native: collective #" << segment_->header()->timedOutSeq.load() << " timed out on group rank " << by - 1
      << " (a timeout makes the group unusable on every member)";
  broken_ = true;
  brokenWhy_ = msg.str();
}

std::vector<int> NativeBackend::deadAmong(const std::vector<int>& ranks) {
  std::vector<int> dead;
  for (int r : ranks)
    if (!segment_->alive(r)) dead.push_back(r);
  return dead;
}

// An aborted group ends the collective now, not at its deadline; so does a dead peer.
void NativeBackend::checkAbortedOrDead(const Fingerprint& fp) {
  // planted: an abort leaves the collective waiting until its deadline
  if (aborted_.load() && !planted(PlantedBug::abort_waits)) {
    std::ostringstream msg;
    msg << "native: " << opName(fp.op) << " (collective #" << fp.seq << ") aborted on rank " << getRank()
        << ": the group was aborted";
    broken_ = true;
    brokenWhy_ = msg.str();
    TORCH_CHECK(false, brokenWhy_);
  }
  checkPeersAlive(peers_, fp);
}

// Every peer, not only the ones this wait is for: a peer that failed because a
// third rank died does not post either, and its waiters must not sit out the
// whole timeout for it.
void NativeBackend::checkPeersAlive(const std::vector<int>& ranks, const Fingerprint& fp) {
  std::vector<int> dead = deadAmong(ranks);
  if (dead.empty()) return;
  std::ostringstream msg;
  msg << "native: " << opName(fp.op) << " (collective #" << fp.seq << ") failed on rank " << getRank()
      << ": " << describeRanks(dead) << " died (" << (dead.size() == 1 ? "its process has" : "their processes have")
      << " exited)";
  broken_ = true;
  brokenWhy_ = msg.str();
  TORCH_CHECK(false, brokenWhy_);
}

void NativeBackend::publishAndWait(uint64_t round, Clock::time_point deadline, const Fingerprint& fp) {
  auto* seg = segment_->header();
  const uint64_t n = getSize();
  segment_->control(getRank())->posted.store(round);
  arrive(seg->posted, n * round);
  waitUntil(
      seg->posted.word, &seg->posted.sleepers, policy_, [&] { return seg->posted.count.load() >= n * round; },
      deadline, [&] { timedOut(round, fp, false); }, [&] { checkAbortedOrDead(fp); });
}

namespace {
bool sameCall(const Fingerprint& a, const Fingerprint& b) {
  if (a.seq != b.seq || a.op != b.op || a.reduce != b.reduce || a.dtype != b.dtype || a.root != b.root ||
      a.ndim != b.ndim)
    return false;
  for (int d = 0; d < 6; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}
}  // namespace

void NativeBackend::checkAgreement(uint64_t round, const Fingerprint& fp) {
  const int n = getSize();
  // the common case, without building a single string: everybody agrees
  bool agree = true;
  for (int i = 0; i < n && agree; ++i) {
    const BufferHeader* hi = segment_->bufferHeader(i, round);
    agree = sameCall(hi->fp, fp);
    for (int j = 0; j < n && agree; ++j) agree = hi->sendBytes[j] == segment_->bufferHeader(j, round)->recvBytes[i];
  }
  if (agree) return;
  std::vector<std::string> problems;
  auto compare = [&](const char* field, auto get, auto show) {
    std::map<std::string, std::vector<int>> byValue;
    std::vector<std::string> order;
    for (int r = 0; r < n; ++r) {
      std::string value = show(get(segment_->bufferHeader(r, round)->fp));
      if (!byValue.count(value)) order.push_back(value);
      byValue[value].push_back(r);
    }
    if (byValue.size() < 2) return;
    std::ostringstream out;
    out << field;
    for (size_t i = 0; i < order.size(); ++i) {
      out << (i ? ", " : " ") << order[i] << " on ranks [";
      auto& ranks = byValue[order[i]];
      for (size_t k = 0; k < ranks.size(); ++k) out << (k ? ", " : "") << ranks[k];
      out << "]";
    }
    problems.push_back(out.str());
  };
  compare("collective", [](const Fingerprint& f) { return f.op; }, [](int32_t v) { return std::string(opName(v)); });
  compare("seq", [](const Fingerprint& f) { return f.seq; }, [](uint64_t v) { return "#" + std::to_string(v); });
  compare("dtype", [](const Fingerprint& f) { return f.dtype; }, [](int32_t v) { return dtypeName(v); });
  compare("reduce op", [](const Fingerprint& f) { return f.reduce; }, [](int32_t v) { return std::to_string(v); });
  compare("root", [](const Fingerprint& f) { return f.root; }, [](int32_t v) { return std::to_string(v); });
  compare("tensor count", [](const Fingerprint& f) { return f.tensors; }, [](int32_t v) { return std::to_string(v); });
  compare("layout", [](const Fingerprint& f) { return f.layout; }, [](int32_t v) {
    return v == 0 ? std::string("strided") : "sparse_coo with " + std::to_string(v - 1) + " sparse dims";
  });
  compare("premul_sum factor", [](const Fingerprint& f) { return f.factor; }, [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  });
  compare("shape", [](const Fingerprint& f) { return f; }, [](const Fingerprint& f) {
    std::ostringstream s;
    s << "[";
    for (int d = 0; d < f.ndim && d < 6; ++d) s << (d ? ", " : "") << f.shape[d];
    s << (f.ndim > 6 ? ", ...]" : "]");
    return s.str();
  });
  if (problems.empty()) {
    // what rank i sends rank j must be what j expects from i
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        uint64_t sent = segment_->bufferHeader(i, round)->sendBytes[j];
        uint64_t expected = segment_->bufferHeader(j, round)->recvBytes[i];
        if (sent != expected)
          problems.push_back("rank " + std::to_string(i) + " sends " + std::to_string(sent) + " bytes to rank " +
                             std::to_string(j) + ", which expects " + std::to_string(expected));
      }
  }
  if (problems.empty()) return;
  std::ostringstream msg;
  msg << "native: ranks disagree on collective #" << fp.seq << " (" << opName(fp.op) << "): ";
  for (size_t i = 0; i < problems.size(); ++i) msg << (i ? "; " : "") << problems[i];
  // every rank read every header: mark this round consumed so the group stays usable
  segment_->control(getRank())->consumed.store(round);
  arrive(segment_->header()->consumed, static_cast<uint64_t>(n) * round);
  TORCH_CHECK(false, msg.str());
}

uint64_t NativeBackend::beginRound(Clock::time_point deadline, const Fingerprint& fp) {
  const uint64_t r = ++round_;
  if (r > 2) {  // my buffer r % 2 was last read in round r - 2
    auto* seg = segment_->header();
    const uint64_t target = static_cast<uint64_t>(getSize()) * (r - 2);
    waitUntil(
        seg->consumed.word, &seg->consumed.sleepers, policy_, [&] { return seg->consumed.count.load() >= target; },
        deadline, [&] { timedOut(r, fp, true); }, [&] { checkAbortedOrDead(fp); });
  }
  return r;
}

void NativeBackend::endRound(uint64_t r) {
  segment_->control(getRank())->consumed.store(r);
  arrive(segment_->header()->consumed, static_cast<uint64_t>(getSize()) * r);
}

void NativeBackend::exchange(const Exchange& x, const Fingerprint& fp, Clock::time_point deadline) {
  const int n = getSize(), me = getRank();
  const int streams = x.streams > 0 ? std::min(x.streams, std::max(1, n - 1)) : std::max(1, n - 1);
  // a round carries up to `streams` chunks of every stream: as few rounds as the slot allows
  const uint64_t chunk = chunkBytes(streams);
  uint64_t rounds = 1;
  std::vector<const char*> srcs(n);
  const bool skipLastRank = x.reduce && planted(PlantedBug::skip_last_rank);
  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t r = beginRound(deadline, fp);
    const uint64_t lo = k * chunk;
    BufferHeader* h = segment_->bufferHeader(me, r);
    char* data = segment_->bufferData(me, r);
    if (k == 0) {
      h->fp = fp;
      for (int j = 0; j < n; ++j) {
        h->sendBytes[j] = x.sendBytes[j];
        h->recvBytes[j] = x.recvBytes[j];
      }
    }
    uint64_t used = 0;
    for (int j = 0; j < n; ++j) {
      h->offset[j] = 0;
      h->length[j] = 0;
      if (j == me || x.sendBytes[j] <= lo) continue;
      uint64_t len = std::min(chunk, x.sendBytes[j] - lo);
      int same = -1;  // a stream identical to an earlier one (broadcast, all_gather) is written once
      for (int e = 0; e < j && same < 0; ++e)
        if (e != me && x.sendPtr[e] == x.sendPtr[j] && x.sendBytes[e] == x.sendBytes[j]) same = e;
      if (same >= 0) {
        h->offset[j] = h->offset[same];
      } else {
        h->offset[j] = used;
        TORCH_CHECK(used + len <= kSlotBytes, "native: internal error: ", opName(fp.op), " declared ", streams,
                    " distinct streams per round and writes more");
        std::memcpy(data + used, x.sendPtr[j] + lo, len);
        used += (len + 63) & ~uint64_t(63);
      }
      h->length[j] = len;
    }
    publishAndWait(r, deadline, fp);
    if (k == 0) {
      checkAgreement(r, fp);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          uint64_t b = segment_->bufferHeader(i, r)->sendBytes[j];
          rounds = std::max(rounds, (b + chunk - 1) / chunk);
        }
    }
    if (x.reduce) {
      uint64_t total = x.recvBytes[me];
      if (total > lo) {
        uint64_t len = std::min(chunk, total - lo);
        srcs.resize(n);
        for (int i = 0; i < n; ++i)
          srcs[i] = i == me ? x.sendPtr[me] + lo
                            : segment_->bufferData(i, r) + segment_->bufferHeader(i, r)->offset[me];
        if (skipLastRank) srcs.pop_back();  // planted: the last rank's contribution is left out of every reduction
        reduceInto(x.reduceOut + lo, srcs, len / c10::elementSize(x.how.dtype), x.how);
      }
    } else {
      for (int i = 0; i < n; ++i) {
        if (x.recvBytes[i] <= lo) continue;
        uint64_t len = std::min(chunk, x.recvBytes[i] - lo);
        const char* src = i == me ? x.sendPtr[me] + lo
                                  : segment_->bufferData(i, r) + segment_->bufferHeader(i, r)->offset[me];
        if (x.recvPtr[i] + lo != src) std::memmove(x.recvPtr[i] + lo, src, len);
      }
    }
    endRound(r);
  }
}

}  // namespace native
