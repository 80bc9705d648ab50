// What device.cpp (the dcdev device and the Python module) and staged.cpp (the staging c10d backend) share.
#pragma once

#include <torch/extension.h>

#include <atomic>

namespace dcdev {

extern std::atomic<int64_t> gKernels;    // device kernels run by this process (copies and fills)
extern std::atomic<int64_t> gLiveBytes;  // device memory mapped now

// Adds wrap() and the staged backend's planted bugs to the Python module.
void bindStaged(pybind11::module_& m);

}  // namespace dcdev
