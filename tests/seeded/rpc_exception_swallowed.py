"""Seeded bug: the reference RPC agent swallows a remote function's exception and answers None.

The callee logs the exception (as it should) but then sends an ordinary
reply with no value, so the caller's call "succeeds". Caught by the RPC
error clauses: the caller gets None instead of the remote ValueError.
"""

from tests.seeded.rpc_base import agent_module, bind, plant


def _swallow(original):
    def respond_error(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        # BUG: an ordinary reply carrying None goes back instead of the exception
        self._respond(bound.arguments["dst"], bound.arguments["msg_id"], agent_module.K_PYTHON_RET, None, None)
    return respond_error


DISTCONFORM_SPEC = plant("rpc_exception_swallowed", "_respond_error", _swallow)
