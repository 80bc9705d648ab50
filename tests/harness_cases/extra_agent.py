"""An RPC agent added from outside: ``--rpc-agent-plugin tests.harness_cases.extra_agent``.

``reference-tp-extra`` is the reference-tp agent (same API module, same
transport, same start) under a new name with one gap of its own: it
declares that torch.futures.wait_all may not raise the first error to
happen (a skip, where reference-tp's own gap is a strict xfail). Nothing
else is written for it: the RPC clauses are parametrised over it and its
gap is matched like a built-in agent's (tests/test_rpc_plugin.py).
"""

from dataclasses import replace

from backends.rpc_agents import AGENTS, AgentSpec
from backends.spec import Gap

NAME = "reference-tp-extra"

DISTCONFORM_RPC_AGENTS: AgentSpec = replace(
    AGENTS["reference-tp"], name=NAME,
    description="the reference-tp agent under another name, added by a plugin",
    gaps=(Gap({"rpc_feature": "wait_all_early_error"},
              "declared by the extra agent's plugin: it does not promise which failed future wait_all raises",
              outcome="skip"),))
