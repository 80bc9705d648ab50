"""The reference DDP under Join (uneven inputs) and over a subgroup, against torch 2.13's DDP and the spec.

The divide modes' values, unused-parameter search and comm hooks while other
ranks are shadowed, throw_on_early_termination, another Joinable next to DDP,
a rank that joins before its first iteration, and training over a subgroup of
global ranks (/work/shared/specs/ddp-join-rpc-profiling.md, part D).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fixtures.rank import ctx
from tests.reference_cases.ddp_common import IMPLS, Mixture, describe_difference, error_text, grads, wrap
from tests.reference_cases.ddp_common import registry, world2, world3  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.timeout(300)


# ================================================================ rank side
def rank_join(divide_by_initial_world_size, iterations_by_rank, find_unused=False, hook=False):
    """D8: Linear(5,5,bias=False), input ones*50, sum loss, uneven iterations; grads of the last iteration."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, nn.Linear(5, 5, bias=False), find_unused_parameters=find_unused)
        if hook:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        per_iteration = []
        with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
            for _ in range(iterations_by_rank[ctx.rank]):
                ddp.zero_grad(set_to_none=True)
                ddp(torch.ones(1, 5) * 50).sum().backward()
                per_iteration.append(ddp.module.weight.grad[0].tolist())
        out[impl] = (per_iteration, ddp._authoritative_rank, ddp.module.weight.detach().sum().item())
    return out


def rank_join_throw(iterations_by_rank):
    """D9: throw_on_early_termination: the first rank out of inputs raises, and so do the others."""
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        ddp = wrap(impl, nn.Linear(5, 5, bias=False))

        def loop():
            with ddp.join(throw_on_early_termination=True):
                for _ in range(iterations_by_rank[ctx.rank]):
                    ddp(torch.ones(1, 5)).sum().backward()

        out[impl] = error_text(loop)
    return out


class CountingJoinable:
    """A second Joinable next to DDP in one Join: counts the shadowed iterations."""

    def __new__(cls, *args):
        from torch.distributed.algorithms.join import Joinable, JoinHook

        class Counter(Joinable):
            def __init__(self, device, group):
                super().__init__()
                self.device, self.group, self.shadowed, self.last = device, group, 0, None

            def join_hook(self, **kwargs):
                counter = self

                class Hook(JoinHook):
                    def main_hook(self):
                        counter.shadowed += 1

                    def post_hook(self, is_last_joiner):
                        counter.last = is_last_joiner

                return Hook()

            @property
            def join_device(self):
                return self.device

            @property
            def join_process_group(self):
                return self.group

        return Counter(*args)


def rank_join_with_other_joinable():
    from torch.distributed.algorithms.join import Join

    torch.manual_seed(0)
    ddp = wrap("reference", nn.Linear(5, 5, bias=False))
    counter = CountingJoinable(torch.device("cpu"), dist.group.WORLD)
    with Join([ddp, counter], divide_by_initial_world_size=False):
        for _ in range(1 + 2 * ctx.rank):
            ddp(torch.ones(1, 5)).sum().backward()
    return counter.shadowed, counter.last, ddp._authoritative_rank, ddp.module.weight.grad[0].tolist()


def rank_join_before_first_iteration():
    """Rank 1 joins at once; rank 0 trains twice with branches m2, m3 unused: their grads stay None."""
    torch.manual_seed(0)
    ddp = wrap("reference", Mixture(double_branch=False), find_unused_parameters=True)
    with ddp.join():
        for _ in range(2 if ctx.rank == 0 else 0):
            out = ddp(torch.ones(3, 6), [True, True, False, False], False)
            sum(v.sum() for v in out).backward()
    return [p.grad is None for p in ddp.module.parameters()]


def rank_subgroup_training():
    """Ranks 1 and 2 of 3 train over a subgroup with uneven inputs; rank 0 is not in it."""
    group = dist.new_group([1, 2])
    if ctx.rank == 0:
        return None
    out = {}
    for impl in IMPLS:
        torch.manual_seed(ctx.rank)  # different init: the broadcast from group rank 0 (global rank 1) shows
        ddp = wrap(impl, Mixture(double_branch=False), process_group=group, bucket_cap_mb=0.0002)
        records = []
        with ddp.join(divide_by_initial_world_size=False):
            for it in range(2 + ctx.rank):
                x = torch.randn(3, 6, generator=torch.Generator().manual_seed(it + 10 * ctx.rank))
                sum(v.sum() for v in ddp(x, [True] * 4, False)).backward()
                records.append(grads(ddp.module))
        records.append([p.detach().clone() for p in ddp.module.parameters()])
        out[impl] = (records, ddp._authoritative_rank)
    return (describe_difference(out["reference"][0], out["torch"][0]), out["reference"][1], out["torch"][1])


# ================================================================ pytest side
@pytest.mark.parametrize("divide_by_initial", [False, True])
def test_join_divide_modes(world2, divide_by_initial):
    """D8: iterations {0: 3, 1: 5}: every entry 50 (active ranks) or 25 alone (initial world size); authoritative rank 1."""
    results = world2.run(rank_join, divide_by_initial, {0: 3, 1: 5})
    for result in results:
        assert result["reference"] == result["torch"]
    rank1 = [row[0] for row in results[1]["reference"][0]]
    assert rank1 == ([50.0] * 5 if not divide_by_initial else [50.0, 50.0, 50.0, 25.0, 25.0])
    assert [r["reference"][1] for r in results] == [1, 1]


def test_join_with_find_unused_and_comm_hook(world3):
    """Shadowing with find_unused_parameters and a comm hook, three ranks joining at different times: equal to torch."""
    for result in world3.run(rank_join, False, {0: 1, 1: 4, 2: 2}, True, True):
        assert result["reference"] == result["torch"]
        assert result["reference"][1] == 1


def test_join_throw_on_early_termination(world2):
    """D9: iterations {0: 2, 1: 3}: rank 0 "Rank 0 exhausted all inputs.", rank 1 "Detected at least one rank ..."."""
    results = world2.run(rank_join_throw, {0: 2, 1: 3})
    assert results[0]["reference"] == results[0]["torch"] == "Rank 0 exhausted all inputs."
    assert results[1]["reference"] == results[1]["torch"] == \
        "Detected at least one rank that exhausted inputs. Throwing across all ranks."


def test_join_with_another_joinable(world3):
    """torch's Join([ddp, other]): the other's hooks run as often as rank 2 trains alone; the last joiner is rank 2."""
    results = world3.run(rank_join_with_other_joinable)
    assert [r[0] for r in results] == [4, 2, 0]
    assert [r[1] for r in results] == [False, False, True]
    assert {r[2] for r in results} == {2}


def test_join_before_first_iteration_find_unused(world2):
    """A rank that joins before training adds zeros to the used-map all-reduce: unused parameters elsewhere keep grad None.

    torch 2.13 all-reduces its never-written used-map there (``at::empty`` in
    Reducer::initialize_local_used_map, garbage), so its active ranks may get
    zero gradients for parameters no rank used; the reference defines it.
    """
    results = world2.run(rank_join_before_first_iteration)
    assert results[0] == [False] * 4 + [True] * 3


def test_subgroup(world3):
    """Over a subgroup of global ranks [1, 2]: group ranks for sources and the authoritative rank, same results as torch."""
    results = world3.run(rank_subgroup_training)
    assert results[0] is None
    for difference, reference_authoritative, torch_authoritative in results[1:]:
        assert difference is None
        assert reference_authoritative == torch_authoritative == 1  # group rank of global rank 2, the last joiner
