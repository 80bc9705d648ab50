"""Seeded bug: the reference RPC agent sends each reply to the worker whose request arrived last.

A callee that keeps "the current caller" in one field instead of per request:
with one caller at a time it is right, with several callers in flight a reply
goes to another worker, which (message ids being per caller) completes its
own pending call of the same id with a value that is not its answer, while
the real caller waits. Caught by the concurrency clause, where every worker
calls every worker at once and each reply must carry the caller's own value,
and by the call-to-self clause once a remote call came first (the reply to a
worker's call to itself goes to its last remote caller: a timeout); in an
agent no other worker has called yet, a call to self is answered right.
"""

from tests.seeded.rpc_base import bind, plant


def _remember_last_caller(original):
    def deliver(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        self.seeded_last_caller = bound.arguments["src"]  # BUG: one field for every request in flight
        return original(*bound.args, **bound.kwargs)
    return deliver


def _answer_last_caller(original):
    def answer(self, *args, **kwargs):
        bound = bind(original, self, args, kwargs)
        bound.arguments["dst"] = getattr(self, "seeded_last_caller", bound.arguments["dst"])
        return original(*bound.args, **bound.kwargs)
    return answer


plant("rpc_reply_wrong_caller", "_deliver", _remember_last_caller)
DISTCONFORM_SPEC = plant("rpc_reply_wrong_caller", "_answer", _answer_last_caller)
