// Point-to-point: a byte ring per (sender, receiver) pair in the segment, and a
// progress thread per rank that drains every ring into its receives.
//
// A message is a 16-byte header (tag, byte count) and its payload, streamed
// through the ring; a payload larger than the ring flows through it in pieces.
// The sender writes in the calling thread (send completes when the last byte
// is in the ring). The receiver's progress thread always drains: a payload
// whose receive is posted lands straight in the receive's tensor, any other
// waits in a heap buffer (the "unexpected" list) until a receive takes it.
// Matching is by (source, tag) in arrival order, so two messages of one tag
// between one pair never overtake each other; a receive from any source
// takes the first matching message from anyone and reports its sender.
#include "native.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace native {

namespace {
uint64_t ringFree(const RingControl* rc) { return kRingBytes - (rc->head.load() - rc->tail.load()); }

void copyIn(char* ringData, uint64_t at, const char* src, uint64_t len) {
  uint64_t pos = at % kRingBytes, first = std::min(len, kRingBytes - pos);
  std::memcpy(ringData + pos, src, first);
  if (len > first) std::memcpy(ringData, src + first, len - first);
}

void copyOut(char* dst, const char* ringData, uint64_t at, uint64_t len) {
  uint64_t pos = at % kRingBytes, first = std::min(len, kRingBytes - pos);
  if (dst) std::memcpy(dst, ringData + pos, first);
  if (dst && len > first) std::memcpy(dst + first, ringData, len - first);
}

std::string describe(const char* verb, int peer, int64_t tag) {
  std::ostringstream out;
  out << verb << " " << (peer < 0 ? std::string("any rank") : "rank " + std::to_string(peer)) << " (tag " << tag << ")";
  return out.str();
}
}  // namespace

void NativeBackend::checkPeer(int peer, const char* what) const {
  TORCH_CHECK(peer >= 0 && peer < getSize(), "native: ", what, " rank ", peer, " is not a rank of this group (0..",
              getSize() - 1, ")");
}

void NativeBackend::startP2P() {
  readers_.resize(getSize());
  sendLocks_ = std::vector<std::mutex>(getSize());
  progress_ = std::thread([this] { progressLoop(); });
  pthread_setname_np(progress_.native_handle(), "native-p2p");  // before it first runs (see register.cpp)
}

void NativeBackend::progressLoop() {
  pthread_setname_np(pthread_self(), "native-p2p");
  auto& bell = segment_->control(getRank())->p2pBell;
  while (!p2pStop_.load()) {
    uint32_t seen = bell.load();
    bool moved = false;
    for (int src = 0; src < getSize(); ++src)
      if (src != getRank()) moved |= drainRing(src);
    if (moved) continue;
    waitUntil(
        bell, nullptr, policy_, [&] { return bell.load() != seen || p2pStop_.load(); },
        Clock::now() + std::chrono::hours(24 * 365), [] {}, [&] { failReceivesFromDead(); });
  }
}

bool NativeBackend::drainRing(int src) {
  RingControl* rc = segment_->ringControl(src, getRank());
  const char* data = segment_->ringData(src, getRank());
  const uint64_t head = rc->head.load();
  uint64_t tail = rc->tail.load();
  if (head == tail) return false;
  RingReader& rd = readers_[src];
  while (tail < head) {
    if (!rd.current) {
      uint64_t take = std::min<uint64_t>(16 - rd.headerGot, head - tail);
      copyOut(rd.header + rd.headerGot, data, tail, take);
      rd.headerGot += take;
      tail += take;
      if (rd.headerGot < 16) break;
      rd.headerGot = 0;
      auto msg = std::make_shared<Message>();
      msg->src = src;
      std::memcpy(&msg->tag, rd.header, 8);
      std::memcpy(&msg->bytes, rd.header + 8, 8);
      {
        std::lock_guard<std::mutex> guard(p2pLock_);
        for (auto it = posted_.begin(); it != posted_.end(); ++it)
          if (((*it)->src < 0 || (*it)->src == src) && (*it)->tag == msg->tag) {
            msg->taker = *it;
            posted_.erase(it);
            break;
          }
        if (!msg->taker) {
          msg->heap.resize(msg->bytes);
          unexpected_.push_back(msg);
        }
      }
      rd.current = msg;
    } else {
      auto& msg = rd.current;
      uint64_t take = std::min(msg->bytes - msg->arrived, head - tail);
      char* dst = nullptr;
      if (!msg->heap.empty() || msg->bytes == 0) {
        dst = msg->heap.data() + msg->arrived;
      } else if (msg->taker && static_cast<uint64_t>(msg->taker->staging.nbytes()) == msg->bytes) {
        dst = static_cast<char*>(msg->taker->staging.data_ptr()) + msg->arrived;
      }  // else: a receive of the wrong size takes it; the bytes are dropped and the receive fails
      copyOut(take ? dst : nullptr, data, tail, take);
      msg->arrived += take;
      tail += take;
    }
    if (rd.current && rd.current->arrived == rd.current->bytes) {
      deliver(rd.current);
      rd.current.reset();
    }
  }
  rc->tail.store(tail);
  ring(rc->spaceBell, nullptr);
  return true;
}

// Progress thread, while idle: a receive that waits for a rank whose process
// exited fails now, naming it, instead of at the timeout. What the dead rank
// wrote before it died has been drained and delivered already. A receive from
// any source fails too: the group lost a member, and the message may have been
// the dead rank's to send.
void NativeBackend::failReceivesFromDead() {
  std::vector<int> dead;
  {
    std::lock_guard<std::mutex> guard(p2pLock_);
    bool waiting = !posted_.empty();
    for (auto& msg : unexpected_) waiting |= msg->taker && !msg->complete;
    for (auto& rd : readers_) waiting |= rd.current && rd.current->taker;  // progress thread's own state
    if (!waiting) return;
  }
  dead = deadAmong(peers_);
  if (dead.empty()) return;
  for (int src : dead) drainRing(src);  // anything that arrived before the death is delivered
  auto isDead = [&](int r) { return std::find(dead.begin(), dead.end(), r) != dead.end(); };
  std::vector<std::shared_ptr<PostedRecv>> doomed;
  {
    std::lock_guard<std::mutex> guard(p2pLock_);
    for (auto it = posted_.begin(); it != posted_.end();) {
      if ((*it)->src < 0 || isDead((*it)->src)) {
        doomed.push_back(*it);
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
    // a message the dead rank had only partly written never completes
    for (auto it = unexpected_.begin(); it != unexpected_.end();) {
      if (!(*it)->complete && isDead((*it)->src)) {
        if ((*it)->taker) doomed.push_back((*it)->taker);
        it = unexpected_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (int src : dead) {
    auto& current = readers_[src].current;
    if (current && current->taker && std::find(doomed.begin(), doomed.end(), current->taker) == doomed.end())
      doomed.push_back(current->taker);
    current.reset();
  }
  for (auto& recv : doomed) {
    std::ostringstream msg;
    msg << "native: " << recv->work->what << " failed on rank " << getRank() << ": " << describeRanks(dead)
        << " died (" << (dead.size() == 1 ? "its process has" : "their processes have") << " exited)";
    recv->work->fail(std::make_exception_ptr(std::runtime_error(msg.str())));
  }
}

// The whole payload of msg has arrived (progress thread or send-to-self).
void NativeBackend::deliver(const std::shared_ptr<Message>& msg) {
  std::shared_ptr<PostedRecv> taker;
  {
    std::lock_guard<std::mutex> guard(p2pLock_);
    msg->complete = true;
    taker = msg->taker;
    if (taker) unexpected_.remove(msg);
  }
  if (!taker) return;  // stays in unexpected_ until a receive takes it
  const bool direct = msg->heap.empty() && msg->bytes > 0;
  finishRecv(taker, direct ? static_cast<const char*>(taker->staging.data_ptr()) : msg->heap.data(), msg->bytes,
             msg->src);
}

void NativeBackend::finishRecv(const std::shared_ptr<PostedRecv>& recv, const char* data, uint64_t bytes, int src) {
  const uint64_t want = recv->staging.nbytes();
  if (bytes != want) {
    std::ostringstream msg;
    msg << "native: " << recv->work->what << ": the message from rank " << src << " has " << bytes
        << " bytes, the receiving tensor " << recv->user.scalar_type() << " " << recv->user.sizes() << " has " << want;
    recv->work->fail(std::make_exception_ptr(std::runtime_error(msg.str())));
    return;
  }
  try {
    if (data != recv->staging.data_ptr() && bytes) std::memcpy(recv->staging.data_ptr(), data, bytes);
    if (!recv->user.is_same(recv->staging)) recv->user.copy_(recv->staging);
  } catch (...) {
    recv->work->fail(std::current_exception());
    return;
  }
  // planted: a receive from any source reports rank 0 as the sender
  if (planted(PlantedBug::any_source_rank0) && recv->src < 0) src = 0;
  recv->work->complete(src);
}

// torch's analyser reads a p2p call's ranks from its name: "send <from>-><to>", "recv <to><-<from>" (group ranks;
// from any source: -1)
void NativeBackend::recordP2P(NativeWork& work, const std::string& name, const at::Tensor& tensor) {
  auto& recorder = FlightRecorder::get();
  work.recordId = recorder.record(frGroup_, getGroupDesc(), name, 0, true, {tensor}, {tensor}, timeout_);
  recorder.started(work.recordId);
}

c10::intrusive_ptr<c10d::Work> NativeBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  TORCH_CHECK(tensors.size() == 1, "native: send takes exactly one tensor, got ", tensors.size());
  checkPeer(dst, "send to");
  const at::Tensor t = tensors[0];
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, "native: send needs a dense CPU tensor");
  auto work = c10::make_intrusive<NativeWork>(getRank(), c10d::OpType::SEND, describe("send to", dst, tag),
                                              std::vector<at::Tensor>{t});
  recordP2P(*work, "send " + std::to_string(getRank()) + "->" + std::to_string(dst), t);
  track(work);
  const at::Tensor src = t.contiguous();
  const uint64_t bytes = src.nbytes();
  if (dst == getRank()) {  // to myself: straight into the matching engine
    auto msg = std::make_shared<Message>();
    msg->src = dst;
    msg->tag = tag;
    msg->bytes = bytes;
    {
      std::lock_guard<std::mutex> guard(p2pLock_);
      for (auto it = posted_.begin(); it != posted_.end(); ++it)
        if (((*it)->src < 0 || (*it)->src == dst) && (*it)->tag == tag) {
          msg->taker = *it;
          posted_.erase(it);
          break;
        }
      if (!msg->taker) {
        msg->heap.assign(static_cast<const char*>(src.data_ptr()), static_cast<const char*>(src.data_ptr()) + bytes);
        msg->arrived = bytes;
        msg->complete = true;
        unexpected_.push_back(msg);
      }
    }
    if (msg->taker) finishRecv(msg->taker, static_cast<const char*>(src.data_ptr()), bytes, dst);
    work->complete();
    return work;
  }
  try {
    std::lock_guard<std::mutex> guard(sendLocks_[dst]);
    RingControl* rc = segment_->ringControl(getRank(), dst);
    char* data = segment_->ringData(getRank(), dst);
    auto& bell = segment_->control(dst)->p2pBell;
    const auto deadline = Clock::now() + timeout_;
    char header[16];
    int64_t tag64 = tag;
    std::memcpy(header, &tag64, 8);
    std::memcpy(header + 8, &bytes, 8);
    auto push = [&](const char* from, uint64_t len) {
      while (len > 0) {
        waitUntil(
            rc->spaceBell, nullptr, policy_, [&] { return ringFree(rc) > 0; }, deadline,
            [&] {
              TORCH_CHECK(false, "native: ", work->what, " timed out after ", timeout_.count() / 1000.0,
                          " s: rank ", dst, " is not draining its messages");
            },
            [&] {
              TORCH_CHECK(segment_->alive(dst), "native: ", work->what, " failed on rank ", getRank(), ": ",
                          describeRanks({dst}), " died (its process has exited)");
            });
        uint64_t take = std::min(len, ringFree(rc));
        uint64_t head = rc->head.load();
        copyIn(data, head, from, take);
        rc->head.store(head + take);
        ring(bell, nullptr);
        from += take;
        len -= take;
      }
    };
    push(header, 16);
    push(static_cast<const char*>(src.data_ptr()), bytes);
  } catch (...) {
    work->fail(std::current_exception());
    return work;
  }
  work->complete();
  return work;
}

c10::intrusive_ptr<c10d::Work> NativeBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  TORCH_CHECK(tensors.size() == 1, "native: recv takes exactly one tensor, got ", tensors.size());
  checkPeer(src, "recv from");
  return postRecv(tensors[0], src, tag);
}

c10::intrusive_ptr<c10d::Work> NativeBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK(tensors.size() == 1, "native: recv takes exactly one tensor, got ", tensors.size());
  return postRecv(tensors[0], -1, tag);
}

c10::intrusive_ptr<c10d::Work> NativeBackend::postRecv(at::Tensor& tensor, int src, int tag) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.layout() == at::kStrided, "native: recv needs a dense CPU tensor");
  auto recv = std::make_shared<PostedRecv>();
  recv->src = src;
  recv->tag = tag;
  recv->user = tensor;
  recv->staging = tensor.is_contiguous() ? tensor : at::empty(tensor.sizes(), tensor.options());
  recv->work = c10::make_intrusive<NativeWork>(getRank(), src < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV,
                                               describe("recv from", src, tag), std::vector<at::Tensor>{tensor});
  recv->work->waitLimit = timeout_;
  recordP2P(*recv->work, "recv " + std::to_string(getRank()) + "<-" + std::to_string(src), tensor);
  track(recv->work);
  std::weak_ptr<PostedRecv> weak = recv;
  recv->work->cancel = [this, weak] {
    auto mine = weak.lock();
    std::lock_guard<std::mutex> guard(p2pLock_);
    for (auto it = posted_.begin(); it != posted_.end(); ++it)
      if (*it == mine) {
        posted_.erase(it);
        return true;
      }
    return false;  // a message already took it: wait for the data
  };
  std::shared_ptr<Message> ready;
  bool attached = false;
  {
    std::lock_guard<std::mutex> guard(p2pLock_);
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      auto& msg = *it;
      if ((src < 0 || msg->src == src) && msg->tag == tag && !msg->taker) {
        msg->taker = recv;
        attached = true;
        if (msg->complete) {  // complete: take it now
          ready = msg;
          unexpected_.erase(it);
        }  // else the progress thread delivers it when the rest arrives
        break;
      }
    }
    if (!attached) posted_.push_back(recv);
  }
  auto work = recv->work;
  if (ready) finishRecv(recv, ready->heap.data(), ready->bytes, ready->src);
  return work;
}

}  // namespace native
