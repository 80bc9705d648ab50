// dcdev: distconform's test accelerator, PyTorch's PrivateUse1 device renamed (device/__init__.py).
//
// A device whose memory the host cannot read. Every allocation is its own anonymous mapping with
// PROT_NONE: a host load or store of device memory (a backend handing data_ptr() to memcpy, a clause
// wrapping it as a CPU tensor) is a SIGSEGV at the first byte, never a silently right answer. Only the
// device's own kernels (copies in and out, fill_) open a mapping, do their work through a CPU tensor laid
// over the same bytes, and close it again, all under one lock: the device runs one kernel at a time, so no
// other thread ever finds a mapping open. Everything else (arithmetic, comparisons, factories that write)
// runs through torch's CPU fallback, which reaches the data through the device's copy only.
//
// kDeviceCount devices: rank r of a world uses dcdev:r. The current device is per thread, as on CUDA.
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "device.hpp"

namespace dcdev {

std::atomic<int64_t> gKernels{0};
std::atomic<int64_t> gLiveBytes{0};

namespace {

constexpr c10::DeviceIndex kDeviceCount = 8;
thread_local c10::DeviceIndex tCurrent = 0;
std::mutex gKernelLock;  // the device runs one kernel at a time: no mapping is ever open to another thread

size_t pageRound(size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

struct Mapping {
  void* base;
  size_t length;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->base, m->length);
  gLiveBytes.fetch_sub(static_cast<int64_t>(m->length));
  delete m;
}

void checkIndex(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kDeviceCount, "dcdev: no device ", static_cast<int>(index), "; this machine has ",
              static_cast<int>(kDeviceCount), " (dcdev:0..", static_cast<int>(kDeviceCount - 1), ")");
}

// Device memory: a PROT_NONE mapping per allocation, opened only by Kernel below.
struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device device(c10::DeviceType::PrivateUse1, tCurrent);
    if (nbytes == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, device};
    const size_t length = pageRound(nbytes);
    void* base = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(base != MAP_FAILED, "dcdev: out of device memory: cannot map ", length, " bytes: ", strerror(errno));
    gLiveBytes.fetch_add(static_cast<int64_t>(length));
    return {base, new Mapping{base, length}, &unmap, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::lock_guard<std::mutex> guard(gKernelLock);
    mprotect(pageFloor(dest), pageRound(count + pageOffset(dest)), PROT_READ | PROT_WRITE);
    mprotect(pageFloor(src), pageRound(count + pageOffset(src)), PROT_READ | PROT_WRITE);
    std::memcpy(dest, src, count);
    mprotect(pageFloor(dest), pageRound(count + pageOffset(dest)), PROT_NONE);
    mprotect(pageFloor(src), pageRound(count + pageOffset(src)), PROT_NONE);
  }
  static size_t pageOffset(const void* p) {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return reinterpret_cast<uintptr_t>(p) % page;
  }
  static void* pageFloor(const void* p) { return static_cast<char*>(const_cast<void*>(p)) - pageOffset(p); }
};

Allocator gAllocator;

// "Pinned" host memory (DDP's reducer stages its used-parameter map in it and asserts is_pinned()): host memory
// this device remembers handing out, since its copies are synchronous anyway
std::mutex gPinnedLock;
std::unordered_set<const void*> gPinned;

void freePinned(void* p) {
  {
    std::lock_guard<std::mutex> guard(gPinnedLock);
    gPinned.erase(p);
  }
  c10::free_cpu(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, c10::Device(c10::kCPU)};
    void* p = c10::alloc_cpu(nbytes);
    {
      std::lock_guard<std::mutex> guard(gPinnedLock);
      gPinned.insert(p);
    }
    return {p, p, &freePinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

PinnedAllocator gPinnedAllocator;

// One device kernel: the mappings of the device tensors it touches are open while it runs.
class Kernel {
 public:
  explicit Kernel(std::initializer_list<const at::Tensor*> tensors) : guard_(gKernelLock) {
    for (const at::Tensor* t : tensors) {
      if (!t->is_privateuseone() || !t->has_storage()) continue;
      const c10::Storage& s = t->storage();
      if (s.data() == nullptr || s.nbytes() == 0) continue;
      open_.push_back({const_cast<void*>(s.data()), pageRound(s.nbytes())});
      TORCH_CHECK(mprotect(open_.back().base, open_.back().length, PROT_READ | PROT_WRITE) == 0,
                  "dcdev: cannot open device memory: ", strerror(errno));
    }
    gKernels.fetch_add(1);
  }
  ~Kernel() {
    for (const Mapping& m : open_) mprotect(m.base, m.length, PROT_NONE);
  }

 private:
  std::lock_guard<std::mutex> guard_;
  std::vector<Mapping> open_;
};

// The bytes of a device tensor seen as a CPU tensor: only inside a Kernel.
at::Tensor hostView(const at::Tensor& t) {
  if (!t.is_privateuseone()) return t;
  if (t.numel() == 0) return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

// ------------------------------------------------------------------ device guard and hooks
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, tCurrent}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "dcdev: not a dcdev device: ", d);
    const c10::DeviceIndex index = d.has_index() ? d.index() : 0;
    checkIndex(index);
    tCurrent = index;
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < kDeviceCount) tCurrent = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  // one stream per device (kernels are synchronous): every new or pooled stream is it (FSDP2 asks for several)
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0.0; }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
  // kernels run synchronously: an event is always reached, a stream always idle
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    checkIndex(d);
    tCurrent = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return tCurrent; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = tCurrent;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // "pinned" host memory of a device whose copies are synchronous is host memory (DDP's reducer asks for it)
  at::Allocator* getPinnedMemoryAllocator() const override { return &gPinnedAllocator; }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> guard(gPinnedLock);
    return gPinned.count(data) > 0;
  }
  at::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, tCurrent}; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();  // random factories run through the CPU fallback
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resizeStorage(storage, newsize);
  }
  static void resizeStorage(const c10::Storage& storage, size_t newsize) {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    const size_t old = impl->nbytes();
    c10::DeviceGuard guard(impl->data_ptr().device());
    c10::DataPtr fresh = gAllocator.allocate(newsize);
    if (old > 0 && newsize > 0) gAllocator.copy_data(fresh.get(), impl->data(), std::min(old, newsize));
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

// ------------------------------------------------------------------ kernels
at::Tensor emptyMemoryFormat(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool>, std::optional<c10::MemoryFormat> memoryFormat) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "dcdev: only strided tensors, not ", *layout);
  c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1, tCurrent)));
  return at::detail::empty_generic(size, &gAllocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memoryFormat);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout, std::optional<c10::Device> device, std::optional<bool>) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "dcdev: only strided tensors, not ", *layout);
  c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1, tCurrent)));
  return at::detail::empty_strided_generic(size, stride, &gAllocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// host -> device, device -> host, device -> device (any two indices): the device's only way in and out
at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking: kernels are synchronous*/) {
  TORCH_CHECK(self.is_cpu() || self.is_privateuseone(), "dcdev: cannot copy from ", self.device());
  TORCH_CHECK(dst.is_cpu() || dst.is_privateuseone(), "dcdev: cannot copy to ", dst.device());
  Kernel kernel({&self, &dst});
  hostView(dst).copy_(hostView(self));
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());  // dst is ours: resize_ below
  return copyFrom(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memoryFormat) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const int64_t needed = impl->numel() == 0 ? 0
      : static_cast<int64_t>((impl->storage_offset() + impl->numel()) * self.dtype().itemsize());
  if (static_cast<int64_t>(self.storage().nbytes()) < needed) Hooks::resizeStorage(self.storage(), needed);
  if (memoryFormat && *memoryFormat != c10::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memoryFormat);
  return self;
}

at::Tensor& fillScalar(at::Tensor& self, const c10::Scalar& value) {
  Kernel kernel({&self});
  hostView(self).fill_(value);
  return self;
}

at::Tensor& zero(at::Tensor& self) { return fillScalar(self, 0); }

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", emptyMemoryFormat);
  m.impl("empty_strided", emptyStrided);
  m.impl("_copy_from", copyFrom);
  m.impl("_copy_from_and_resize", copyFromAndResize);
  m.impl("resize_", resize);
  m.impl("fill_.Scalar", fillScalar);
  m.impl("zero_", zero);
  // views share the device's storage: metadata only, never data
  m.impl("view", at::native::view);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_cpu_);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// autograd's PrivateUse1 key needs no kernels of its own: the CompositeImplicit ones apply
struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
} gRegisterHooks;

}  // namespace
}  // namespace dcdev

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dcdev: distconform's PrivateUse1 test device (host memory the host cannot read without the device)";
  m.def("device_count", [] { return static_cast<int>(dcdev::kDeviceCount); });
  m.def("current_device", [] { return static_cast<int>(dcdev::tCurrent); });
  m.def("set_device", [](int index) {
    dcdev::checkIndex(static_cast<c10::DeviceIndex>(index));
    dcdev::tCurrent = static_cast<c10::DeviceIndex>(index);
  });
  m.def("kernels_run", [] { return dcdev::gKernels.load(); }, "device kernels run by this process (copies, fills)");
  m.def("live_bytes", [] { return dcdev::gLiveBytes.load(); }, "device memory mapped now");
  dcdev::bindStaged(m);
}
