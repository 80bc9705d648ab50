"""The distributed autograd contract: the same clauses for every RPC agent and its autograd module.

``pytest suites/dist_autograd --rpc-agent tensorpipe,reference-pg,reference-tp --world-size 2,3,4``.
Each agent names its ``torch.distributed.autograd`` twin (``AgentSpec.autograd_module``
in backends/rpc_agents.py): torch's own module for TensorPipe, the reference
package's for the reference agents. The rank side reuses the RPC suite's
shared agent (fixtures/rpc_lifecycle.py); ``common.py`` holds the remote
functions and the helpers every clause file shares; differences between
implementations that are not contract violations (node names) are data there,
gaps with reasons in backends/rpc_agents.py.

Expected gradients are closed-form or the same graph run locally in one
process. Files, one contract area each: test_contexts (ids, thread-locality,
nesting, unknown ids, debug info), test_recording (send/recv functions per
RPC kind), test_backward (roots, dtypes, unused and non-grad tensors, hooks,
threads), test_retain_graph, test_chains (nested chains, self calls,
remote + to_here, completion), test_errors (remote backward errors, invalid
arguments, a worker lost mid-backward, FAST mode's unused send function),
test_cleanup (every participant releases the context), test_rref_backward,
test_ddp (DDP inside a context: the averaged gradients land in the context,
each agent paired with its DDP, ``AgentSpec.ddp_module``).
The training stack on top (each agent's ``optim_module`` / ``nn_module``):
test_optimizer (DistributedOptimizer, both of torch's paths), test_remote_module
(RemoteModule and remote-device parsing), test_examples (PyTorch's RPC
examples); their remote side and single-process twins are training.py.
"""
