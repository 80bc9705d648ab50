"""The RPC contract: the same clauses for every agent speaking torch.distributed.rpc's API.

``pytest suites/rpc --rpc-agent tensorpipe,reference-pg,reference-tp --world-size 2,3,4``
(the default is every agent). Agents are data in backends/rpc_agents.py
(module, timeout text, gaps with reasons); the agent axis, gaps and ordering
are fixtures/rpc_plugin.py; the rank side (one shared agent per world and
agent, private agents for clauses that configure or shut one down) is
fixtures/rpc_lifecycle.py; remote functions live in udfs.py so every rank can import them.

Files, one contract area each: test_calls (builtin / Python / TorchScript,
to self, tensors, concurrency), test_addressing (``to=``), test_errors
(remote exceptions, callee log), test_async_execution, test_futures,
test_rrefs, test_timeouts (fault injection), test_shutdown.
"""
