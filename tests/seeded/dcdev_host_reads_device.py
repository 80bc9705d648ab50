"""Seeded bug in the dcdev backend: it reads the device's memory from the host instead of the device's copy.

The staging backend (native/device/staged.cpp, planted bug ``host_reads_device``) takes a device tensor's
bytes through ``data_ptr()`` as if they were host memory, what a backend written for a unified-memory device
does. dcdev's memory is PROT_NONE outside its own kernels, so the rank dies with SIGSEGV at its first
collective: caught by the first all_reduce clause, with the rank's death as the finding.
"""

from tests.seeded.dcdev_base import register_dcdev_bug

DISTCONFORM_SPEC = register_dcdev_bug("dcdev_host_reads_device", "host_reads_device",
                                      "device memory read from the host")
