// StagedBackend: a c10d backend for dcdev tensors that stages every operation through host memory.
//
// It wraps a host backend (native's, in device/__init__.py) the way a vendor's backend wraps its
// transport: the inputs are copied off the device with the device's own copy, the host backend runs its
// shared-memory algorithm on those host tensors, and once it has finished the results are copied back onto
// the device, before the Work (its wait(), is_completed(), get_future()) reports completion. Host tensors
// handed to it pass through unstaged.
#include "device.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mutex>

namespace dcdev {
namespace {

// Seeded bugs (tests/seeded/dcdev_*.py), planted for the whole process by wrap(planted_bug=...).
enum class PlantedBug { none, host_reads_device, early_completion };
constexpr const char* kPlantedBugNames[] = {"none", "host_reads_device", "early_completion"};
std::atomic<PlantedBug> gPlanted{PlantedBug::none};

using TensorList = std::vector<at::Tensor>;
using Pairs = std::vector<std::pair<at::Tensor, at::Tensor>>;  // (host copy, device tensor) to copy back

// The host tensors a host backend works on; device tensors are copied off the device (the device's copy)
at::Tensor toHost(const at::Tensor& t) {
  if (!t.is_privateuseone()) return t;
  if (gPlanted.load() == PlantedBug::host_reads_device && t.numel() > 0)  // planted: the device's bytes, read
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU)).clone();
  return t.to(at::kCPU);
}

TensorList toHost(const TensorList& ts, Pairs* back) {
  TensorList out;
  out.reserve(ts.size());
  for (const auto& t : ts) {
    out.push_back(toHost(t));
    if (back && t.is_privateuseone()) back->emplace_back(out.back(), t);
  }
  return out;
}

std::vector<TensorList> toHost(const std::vector<TensorList>& lists, Pairs* back) {
  std::vector<TensorList> out;
  for (const auto& l : lists) out.push_back(toHost(l, back));
  return out;
}

at::Tensor toHost(const at::Tensor& t, Pairs* back) {
  at::Tensor host = toHost(t);
  if (back && t.is_privateuseone()) back->emplace_back(host, t);
  return host;
}

// Data only, as a device's own collective writes: on a worker thread grad mode is on, and an autograd-recorded copy_
// would rebase a tensor with history onto CopyBackwards (suites/c10d/test_all_reduce.py, history clause)
void copyBack(const Pairs& back) {
  at::NoGradGuard noGrad;
  for (const auto& [host, device] : back) device.copy_(host);
}

// Completes when the host backend's Work has completed and its results are back on the device.
class StagedWork : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> inner, Pairs back, TensorList deviceOutputs)
      : c10d::Work(-1, inner->retrieveOpType()),
        inner_(std::move(inner)), state_(std::make_shared<State>()) {
    state_->back = std::move(back);
    state_->outputs = std::move(deviceOutputs);
    state_->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    auto state = state_;
    inner_->getFuture()->addCallback([state](c10::ivalue::Future& done) {
      if (done.hasError()) {
        state->future->setError(done.exception_ptr());
        return;
      }
      if (gPlanted.load() == PlantedBug::early_completion) {  // planted: completes now, copies back at destruction
        state->future->markCompleted(c10::IValue(state->outputs));
        return;
      }
      try {
        copyBack(state->back);
        state->back.clear();
      } catch (...) {
        state->future->setError(std::current_exception());
        return;
      }
      state->future->markCompleted(c10::IValue(state->outputs));
    });
  }
  ~StagedWork() override {
    if (!state_->back.empty() && state_->future->completed() && !state_->future->hasError()) {
      try {
        copyBack(state_->back);  // only the planted early completion leaves anything here
      } catch (...) {
      }
    }
  }
  bool isCompleted() override { return state_->future->completed(); }
  bool isSuccess() const override { return state_->future->completed() && !state_->future->hasError(); }
  std::exception_ptr exception() const override {
    return state_->future->completed() && state_->future->hasError() ? state_->future->exception_ptr() : nullptr;
  }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override {
    wait(std::chrono::milliseconds(0));
    return state_->outputs;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);  // raises the host backend's error or timeout
    state_->future->wait();
    if (state_->future->hasError()) std::rethrow_exception(state_->future->exception_ptr());
    return true;
  }
  void synchronize() override {}
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return state_->future; }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  struct State {
    Pairs back;
    TensorList outputs;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<State> state_;
};

TensorList flat(const std::vector<TensorList>& lists) {
  TensorList out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

class StagedBackend : public c10d::Backend {
 public:
  StagedBackend(c10::intrusive_ptr<c10d::Backend> host, std::string name)
      : c10d::Backend(host->getRank(), host->getSize()), host_(std::move(host)), name_(std::move(name)) {}

  const std::string getBackendName() const override { return name_; }
  void setGroupUid(const std::string& pgUid) override {
    c10d::Backend::setGroupUid(pgUid);
    host_->setGroupUid(pgUid);
  }
  c10::intrusive_ptr<Options> getBackendOptions() override { return host_->getBackendOptions(); }
  void setTimeout(std::chrono::milliseconds timeout) override { host_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { host_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return host_->getSequenceNumberForGroup(); }
  void shutdown() override { host_->shutdown(); }
  void abort() override { host_->abort(); }
  void enableCollectivesTiming() override { host_->enableCollectivesTiming(); }

  // Coalescing: the host backend coalesces; what its calls write lands on the device when the coalesced Work
  // completes (endCoalescing's), not when each call's does
  bool supportsCoalescing() const override { return host_->supportsCoalescing(); }
  void startCoalescing() override {
    host_->startCoalescing();
    std::lock_guard<std::mutex> guard(lock_);
    coalescing_ = true;
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    Pairs back;
    TensorList outputs;
    {
      std::lock_guard<std::mutex> guard(lock_);
      coalescing_ = false;
      back.swap(coalescedBack_);
      outputs.swap(coalescedOutputs_);
    }
    return c10::make_intrusive<StagedWork>(host_->endCoalescing(), std::move(back), std::move(outputs));
  }
  // shrink and merge make host groups: each is staged like this one
  bool supportsShrinking() const override { return host_->supportsShrinking(); }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
                                           const c10::intrusive_ptr<Options>& optsOverride) override {
    return c10::make_intrusive<StagedBackend>(host_->shrink(ranksToExclude, shrinkFlags, optsOverride), name_);
  }
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override {
    return c10::make_intrusive<StagedBackend>(host_->merge(store, opts, rank, size), name_);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->broadcast(host, opts), std::move(back), tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->allreduce(host, opts), std::move(back), tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(TensorList& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->allreduce_coalesced(host, opts), std::move(back), tensors);
  }
  c10::intrusive_ptr<c10d::Work> reduce(TensorList& tensors, const c10d::ReduceOptions& opts) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->reduce(host, opts), std::move(back), tensors);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<TensorList>& outputs, TensorList& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->allgather(hostOut, hostIn, opts), std::move(back), flat(outputs));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(output, &back);
    auto hostIn = toHost(input);
    return staged(host_->_allgather_base(hostOut, hostIn, opts), std::move(back), {output});
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<TensorList>& outputs, TensorList& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->allgather_coalesced(hostOut, hostIn, opts), std::move(back), flat(outputs));
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->allgather_into_tensor_coalesced(hostOut, hostIn, opts), std::move(back), outputs);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<TensorList>& outputs, TensorList& inputs,
                                        const c10d::GatherOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->gather(hostOut, hostIn, opts), std::move(back), flat(outputs));
  }
  c10::intrusive_ptr<c10d::Work> scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->scatter(hostOut, hostIn, opts), std::move(back), outputs);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->reduce_scatter(hostOut, hostIn, opts), std::move(back), outputs);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(output, &back);
    auto hostIn = toHost(input);
    return staged(host_->_reduce_scatter_base(hostOut, hostIn, opts), std::move(back), {output});
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->reduce_scatter_tensor_coalesced(hostOut, hostIn, opts), std::move(back), outputs);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(output, &back);
    auto hostIn = toHost(input);
    return staged(host_->alltoall_base(hostOut, hostIn, outputSplits, inputSplits, opts), std::move(back), {output});
  }
  c10::intrusive_ptr<c10d::Work> alltoall(TensorList& outputs, TensorList& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    Pairs back;
    auto hostOut = toHost(outputs, &back);
    auto hostIn = toHost(inputs, nullptr);
    return staged(host_->alltoall(hostOut, hostIn, opts), std::move(back), outputs);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    c10d::BarrierOptions hostOpts = opts;
    hostOpts.device = at::Device(at::kCPU);
    return staged(host_->barrier(hostOpts), {}, {});
  }
  c10::intrusive_ptr<c10d::Work> send(TensorList& tensors, int dst, int tag) override {
    auto host = toHost(tensors, nullptr);
    return staged(host_->send(host, dst, tag), {}, tensors);
  }
  c10::intrusive_ptr<c10d::Work> recv(TensorList& tensors, int src, int tag) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->recv(host, src, tag), std::move(back), tensors);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(TensorList& tensors, int tag) override {
    Pairs back;
    auto host = toHost(tensors, &back);
    return staged(host_->recvAnysource(host, tag), std::move(back), tensors);
  }

 private:
  c10::intrusive_ptr<c10d::Work> staged(c10::intrusive_ptr<c10d::Work> inner, Pairs back, TensorList outputs) {
    {
      std::lock_guard<std::mutex> guard(lock_);
      if (coalescing_) {  // copied back when the coalesced Work completes
        coalescedBack_.insert(coalescedBack_.end(), back.begin(), back.end());
        coalescedOutputs_.insert(coalescedOutputs_.end(), outputs.begin(), outputs.end());
        back.clear();
      }
    }
    return c10::make_intrusive<StagedWork>(std::move(inner), std::move(back), std::move(outputs));
  }
  c10::intrusive_ptr<c10d::Backend> host_;
  std::string name_;
  std::mutex lock_;
  bool coalescing_ = false;  // between startCoalescing and endCoalescing
  Pairs coalescedBack_;
  TensorList coalescedOutputs_;
};

PlantedBug plantedNamed(const std::string& name) {
  std::string known;
  for (size_t i = 0; i < std::size(kPlantedBugNames); ++i) {
    if (name == kPlantedBugNames[i]) return static_cast<PlantedBug>(i);
    known += std::string(i ? ", " : "") + "'" + kPlantedBugNames[i] + "'";
  }
  throw pybind11::value_error("dcdev: unknown planted bug '" + name + "'; known: " + known);
}

}  // namespace

void bindStaged(pybind11::module_& m) {
  m.def(
      "wrap",
      [](const c10::intrusive_ptr<c10d::Backend>& host, const std::string& name,
         const std::string& plantedBug) -> c10::intrusive_ptr<c10d::Backend> {
        gPlanted.store(plantedNamed(plantedBug));
        return c10::make_intrusive<StagedBackend>(host, name);
      },
      pybind11::arg("host"), pybind11::arg("name"), pybind11::arg("planted_bug") = "none",
      "a backend for dcdev tensors staging every operation of the host backend ``host`` through host memory");
  pybind11::list names;
  for (const char* name : kPlantedBugNames) names.append(name);
  m.attr("PLANTED_BUGS") = pybind11::tuple(names);
}

}  // namespace dcdev
