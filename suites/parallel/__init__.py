"""Contracts of the paths FSDP and tensor-parallel users drive: functional collectives,
DeviceMesh and DTensor, FSDP2 training, bitwise determinism."""
