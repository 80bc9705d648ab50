"""Remote profiling over RPC: what the legacy profiler shows of remote work, on every agent, versus TensorPipe."""
