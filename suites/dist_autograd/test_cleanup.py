"""Contract: when a context's ``with`` block exits, every worker that took part releases it.

The creator forgets the context at once (its id becomes unknown there) and
tells every worker it reached, which forwards the release to the workers it
reached in turn (a nested chain is released end to end). This holds whether
the messages carried tensors requiring grad, tensors without grad, or no
tensors at all (a Python function always carries the context). Release is
asynchronous: leaving the block never waits for a peer (even one whose
request threads are all busy), and a callee's context disappears shortly
after (polled up to 10 s, as torch's own suite does); a clean-up send that fails is retried (torch's
sendWithRetries: after 1 s, then x1.5). After a backward pass no pass is left
running.
"""

import threading

import pytest
import torch

from backends.rpc_agents import Faults
from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.dist_autograd.common import (autograd, chain, constant_len, has_context, leaves, mul, peer_name, rpc,
                                         sleep_and_mark, wait_until)
from suites.rpc.common import barrier


FAILED_SENDS = 3  # 1 + 1.5 + 2.25 s of retries: within the 10 s poll


def _gone_everywhere(context_id, names):
    """Poll, from a thread without context (the probe must not carry one), until no worker in ``names`` has it."""
    result = {}

    def probe():
        result["gone"] = wait_until(lambda: not any(rpc().rpc_sync(n, has_context, args=(context_id,))
                                                    for n in names))
        result["left"] = [n for n in names if rpc().rpc_sync(n, has_context, args=(context_id,))]
    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(60)
    return result


# ---------------------------------------------------------------- rank side
def released_after(kind):
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        if kind == "grad":
            rpc().rpc_sync(peer_name(), mul, args=(t1, t2))
        elif kind == "no_grad":
            rpc().rpc_sync(peer_name(), mul, args=(torch.ones(2), torch.ones(2)))
        else:
            rpc().rpc_sync(peer_name(), constant_len)
        had = rpc().rpc_sync(peer_name(), has_context, args=(context_id,))
    here = has_context(context_id)
    return had, here, _gone_everywhere(context_id, [peer_name()])


def chain_released():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    hops = [peer_name(k) for k in range(2, ctx.world_size)]
    with mod.context() as context_id:
        out = rpc().rpc_sync(peer_name(), chain, args=(hops, t1, t2))
        mod.backward(context_id, [out.sum()])
        reached = [n for n in [peer_name()] + hops if rpc().rpc_sync(n, has_context, args=(context_id,))]
    return reached, _gone_everywhere(context_id, [peer_name()] + hops)


def released_despite_failed_sends():
    with lifecycle.private_agent(faults=Faults(fail=("CLEANUP_AUTOGRAD_CONTEXT_REQ",), num_fail_sends=FAILED_SENDS)):
        return released_after("grad")


def passes_after_backward():
    mod = autograd()
    t1, t2 = leaves([1.0, 2.0], [3.0, 4.0])
    with mod.context() as context_id:
        loss = rpc().rpc_sync(peer_name(), mul, args=(t1, t2)).sum()
        mod.backward(context_id, [loss])
        barrier("backward-done")  # other callers' passes run here too
        wait_until(lambda: mod._get_debug_info()["num_current_backward_passes"] == 0)
        return mod._get_debug_info()["num_current_backward_passes"]


# ---------------------------------------------------------------- clauses
@pytest.mark.parametrize("carried", ["grad", "no_grad", "no_tensors"])
def test_callee_releases_the_context(rpc_agent, carried):
    """After the with block exits the creator has no such context and the callee loses it too (grad tensors, tensors without grad, no tensors)."""
    for rank, (had, here, result) in enumerate(rpc_agent.run(released_after, carried)):
        if carried != "no_grad":  # a builtin without grad tensors never carried the context
            assert had, f"rank {rank}: the callee never had the context"
        assert not here, f"rank {rank}: the creator still has the context after the with block"
        assert result.get("gone"), f"rank {rank}: still holding the context after 10 s: {result.get('left')}"


@pytest.mark.min_world_size(3)
def test_nested_chain_is_released_end_to_end(rpc_agent):
    """w0 -> w1 -> w2 [-> w3]: every worker of the chain had the context and loses it after the with block."""
    for rank, (reached, result) in enumerate(rpc_agent.run(chain_released)):
        assert len(reached) == rpc_agent.world_size - 1, f"rank {rank}: only {reached} had the context"
        assert result.get("gone"), f"rank {rank}: still holding the context after 10 s: {result.get('left')}"


@pytest.mark.rpc_private_agent
@pytest.mark.waits  # torch's retry back-off: 1 s, then 1.5 s, then 2.25 s
def test_release_is_retried_when_sends_fail(rpc_agent):
    """The first three clean-up sends to the callee fail (fault injection): retried as torch does (1 s, then x1.5), the callee still loses the context."""
    for rank, (had, here, result) in enumerate(rpc_agent.run(released_despite_failed_sends)):
        assert had and not here, f"rank {rank}: callee had it {had}, creator still has it {here}"
        assert result.get("gone"), f"rank {rank}: still holding the context after 10 s: {result.get('left')}"


def test_no_backward_pass_left_running(rpc_agent):
    """Once every worker's backward returned, _get_debug_info() soon counts no backward pass in progress (polled up to 10 s)."""
    for rank, running in enumerate(rpc_agent.run(passes_after_backward)):
        assert running == 0, f"rank {rank}: {running} backward passes still counted"


BUSY_CALLS = 24  # more than any agent's request threads (16 by default): the peer cannot serve anything else
BUSY_S = 1.5


def exit_while_the_peer_is_busy():
    mod = autograd()
    keys = [f"busy/{ctx.rank}/{i}" for i in range(BUSY_CALLS)]
    with mod.context() as context_id:
        rpc().rpc_sync(peer_name(), constant_len)  # the peer now has the context
        # sent from a thread without a context: a queued request carrying the context would re-create it on
        # the callee after the release (torch's getOrCreateContext), and that orphan is not this clause's subject
        sleepers = []
        thread = threading.Thread(target=lambda: sleepers.extend(
            rpc().rpc_async(peer_name(), sleep_and_mark, args=(BUSY_S, key)) for key in keys))
        thread.start()
        thread.join(30)
    # the with block has exited while every request thread of the peer still sleeps: the release did not wait
    exited_first = not any(ctx.store.check([key]) for key in keys)
    for fut in sleepers:
        fut.wait()
    return exited_first, _gone_everywhere(context_id, [peer_name()])


@pytest.mark.waits  # the peer's request threads sleep 1.5 s, twice over
def test_exit_does_not_wait_for_the_peers(rpc_agent):
    """Leaving the with block while the callee's request threads are all busy returns before any of them is free; the callee releases the context once it can."""
    for rank, (exited_first, result) in enumerate(rpc_agent.run(exit_while_the_peer_is_busy)):
        assert exited_first, f"rank {rank}: the with block only exited after the busy callee freed a thread"
        assert result.get("gone"), f"rank {rank}: still holding the context after 10 s: {result.get('left')}"
