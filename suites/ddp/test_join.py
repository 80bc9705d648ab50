"""Contract: uneven inputs with Join.

Ranks that run out of inputs early join; the rest keep training and the
joined ranks shadow their collectives, so nobody hangs (spec B1-B3, D8, D9):

* while some ranks have joined, gradients are the sum over the active ranks
  divided by the initial world size (``divide_by_initial_world_size=True``,
  the default) or by the number of active ranks (False);
* afterwards every rank holds the parameters and buffers of the
  authoritative rank, the highest rank among the last joiners
  (``ddp._authoritative_rank``);
* ``throw_on_early_termination``: the first rank to run out raises
  "Rank {r} exhausted all inputs.", every other rank "Detected at least one
  rank that exhausted inputs. Throwing across all ranks.";
* a custom Joinable works with the same protocol: its main hook shadows the
  active ranks' all-reduces, ``post_hook(is_last_joiner)`` is true exactly on
  the last joiners; Join's own argument checks and exception pass-through.

Iteration maps generalise spec D8 (ranks 0 and 1: 3 and 5 iterations) to any
world size: rank r runs 3 + 2r iterations.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from fixtures.rank import ctx
from suites.ddp import common, impls, models

pytestmark = pytest.mark.needs(feature="ddp")

EXHAUSTED = "Rank {rank} exhausted all inputs."
DETECTED = "Detected at least one rank that exhausted inputs. Throwing across all ranks."
INPUT_VALUE = 50.0  # spec D8: every gradient entry is 50 per contributing rank


def iterations_of(rank: int) -> int:
    return 3 + 2 * rank


# ---------------------------------------------------------------- rank side
def uneven_training(impl, divide_by_initial_world_size, lr=0.0, options=None):
    """Spec D8 model and input; per iteration this rank's gradient; then buffers, params, authoritative rank."""
    model = models.CountingLinear(weight=1.0 + ctx.rank)  # rank-specific until DDP broadcasts rank 0's
    ddp = impls.wrap(impl, model, **(options or {}))
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    x = torch.full((1, 5), INPUT_VALUE, device=common.device())
    grads = []
    with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for _ in range(iterations_of(ctx.rank)):
            opt.zero_grad(set_to_none=True)
            ddp(x).sum().backward()
            grads.append(ddp.module.lin.weight.grad.detach().cpu().clone())
            opt.step()
    return {
        "grads": grads,
        "forwards": ddp.module.forwards.item(),
        "weight": ddp.module.lin.weight.detach().cpu().clone(),
        "authoritative": ddp._authoritative_rank,
    }


def throwing_training(impl, iterations):
    ddp = impls.wrap(impl, models.CountingLinear())
    x = torch.full((1, 5), INPUT_VALUE, device=common.device())
    done = 0
    try:
        with ddp.join(throw_on_early_termination=True):
            for _ in range(iterations[ctx.rank]):
                ddp(x).sum().backward()
                done += 1
    except RuntimeError as exc:
        return done, str(exc)
    return done, "no error"


class CountingJoinable(Joinable):
    """Each step all-reduces ones: the result is the number of ranks still stepping."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group
        self.is_last_joiner = None
        self.shadowed = 0
        self.hook_kwargs = None

    def step(self) -> float:
        Join.notify_join_context(self)
        t = torch.ones(1, device=self.join_device)
        dist.all_reduce(t)
        return t.item()

    def join_hook(self, **kwargs) -> JoinHook:
        self.hook_kwargs = dict(kwargs)
        return _ShadowAllReduce(self)

    @property
    def join_device(self) -> torch.device:
        return common.device()

    @property
    def join_process_group(self):
        return dist.group.WORLD if self.group is None else self.group


class _ShadowAllReduce(JoinHook):
    """A joined rank's stand-in for one step: an all-reduce of zeros."""

    def __init__(self, joinable: CountingJoinable):
        self.joinable = joinable

    def main_hook(self) -> None:
        dist.all_reduce(torch.zeros(1, device=self.joinable.join_device))
        self.joinable.shadowed += 1

    def post_hook(self, is_last_joiner: bool) -> None:
        self.joinable.is_last_joiner = is_last_joiner


def custom_joinable():
    joinable = CountingJoinable()
    with Join([joinable], marker="passed through"):
        seen = [joinable.step() for _ in range(iterations_of(ctx.rank))]
    return seen, joinable.shadowed, joinable.is_last_joiner, joinable.hook_kwargs


class NotInitialised(Joinable):
    def __init__(self):  # forgets Joinable.__init__
        pass

    def join_hook(self, **kwargs):
        return JoinHook()

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


class BodyError(Exception):
    pass


def join_argument_checks():
    key = "ddp_join_other_group"
    if key not in ctx.scratch:  # a second group of the same ranks (new_group is collective: every rank calls it)
        ctx.scratch[key] = dist.new_group(ranks=list(range(ctx.world_size)))
    other = ctx.scratch[key]
    outcomes = {}
    for name, make in (("empty", lambda: Join([])),
                       ("two groups", lambda: Join([CountingJoinable(), CountingJoinable(other)])),
                       ("uninitialised", lambda: Join.notify_join_context(NotInitialised()))):
        try:
            make()
            outcomes[name] = "accepted"
        except Exception as exc:  # noqa: BLE001 - the type is the finding
            outcomes[name] = type(exc).__name__
    try:
        with Join([CountingJoinable()]):
            raise BodyError("from the body")
    except BodyError as exc:
        outcomes["body"] = f"BodyError: {exc}"
    except Exception as exc:  # noqa: BLE001
        outcomes["body"] = f"{type(exc).__name__}: {exc}"
    t = torch.ones(1, device=common.device())  # the group still works afterwards
    dist.all_reduce(t)
    outcomes["all_reduce after"] = t.item()
    return outcomes


# ------------------------------------------------------------------ clauses
def expected_grad(iteration: int, world_size: int, divide_by_initial: bool) -> float:
    active = sum(1 for r in range(world_size) if iterations_of(r) > iteration)
    return INPUT_VALUE * active / world_size if divide_by_initial else INPUT_VALUE


def divide_params() -> list:
    """(impl, divide_by_initial_world_size) pairs; torch's divide-by-active path also needs impls.WORK_HELD_BY_CPP."""
    params = []
    for impl_param in impls.impl_params():
        impl = impl_param.values[0]
        for divide in (True, False):
            marks = list(impl_param.marks)
            need = impls.needs_of(impl, divide)
            if need:
                marks.append(pytest.mark.needs(**need))
            params.append(pytest.param(impl, divide, marks=marks,
                                       id=f"{'divide_initial' if divide else 'divide_active'}-{impl}"))
    return params


@pytest.mark.parametrize("find_unused", [False, True], ids=["", "find_unused"])
@pytest.mark.parametrize("impl,divide_by_initial", divide_params())
def test_join_gradients_per_iteration(world, impl, divide_by_initial, find_unused):
    """Spec D8: rank r runs 3+2r iterations; each iteration's gradient entries are 50 x active/world_size (divide_by_initial_world_size=True) or 50 (False), with and without find_unused_parameters (whose used-map all-reduce joined ranks shadow too)."""
    n = world.world_size
    options = {"find_unused_parameters": find_unused}
    for rank, result in enumerate(world.run(uneven_training, impl, divide_by_initial, 0.0, options)):
        got = result["grads"]
        assert len(got) == iterations_of(rank), f"{impl} DDP rank {rank} ran {len(got)} iterations"
        expected = [expected_grad(i, n, divide_by_initial) for i in range(iterations_of(rank))]
        values = [g.unique().tolist() for g in got]
        assert all(len(v) == 1 for v in values) and [v[0] for v in values] == pytest.approx(expected, abs=1e-5), \
            f"{impl} DDP rank {rank}: per-iteration gradient entries {values}, expected {expected}"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_join_syncs_from_the_authoritative_rank(world, impl):
    """Spec B3/D8: after Join every rank reports _authoritative_rank = the last joiner (world_size - 1) and holds its parameters and buffers (its forward count)."""
    n = world.world_size
    results = world.run(uneven_training, impl, True, 0.01)
    last = results[n - 1]
    for rank, result in enumerate(results):
        what = f"{impl} DDP rank {rank}"
        assert result["authoritative"] == n - 1, f"{what}: _authoritative_rank {result['authoritative']}, expected {n - 1}"
        assert result["forwards"] == iterations_of(n - 1), \
            f"{what}: buffer 'forwards' {result['forwards']}, expected the last joiner's {iterations_of(n - 1)}"
        assert torch.equal(result["weight"], last["weight"]), f"{what}: weights differ from rank {n - 1}'s"


@pytest.mark.min_world_size(2)  # early termination: one rank runs out of inputs before another
@pytest.mark.parametrize("impl", impls.impl_params())
def test_throw_on_early_termination_messages(world, impl):
    """Spec D9: rank 0 runs 2 iterations, the others 3: rank 0 raises "Rank 0 exhausted all inputs.", every other rank "Detected at least one rank that exhausted inputs. Throwing across all ranks."."""
    iterations = [2] + [3] * (world.world_size - 1)
    for rank, (done, error) in enumerate(world.run(throwing_training, impl, iterations)):
        expected = EXHAUSTED.format(rank=0) if rank == 0 else DETECTED
        assert error == expected, f"{impl} DDP rank {rank}: raised {error!r} after {done} iterations, expected {expected!r}"
        assert done == 2, f"{impl} DDP rank {rank}: completed {done} iterations before the throw, expected 2"


def test_custom_joinable(world):
    """A custom Joinable: each step's all-reduce of ones counts the ranks still stepping, joined ranks shadow every remaining step, only the last joiners see is_last_joiner, Join's kwargs reach join_hook."""
    n = world.world_size
    longest = iterations_of(n - 1)
    for rank, (seen, shadowed, is_last, kwargs) in enumerate(world.run(custom_joinable)):
        expected = [sum(1 for r in range(n) if iterations_of(r) > i) for i in range(iterations_of(rank))]
        assert seen == expected, f"rank {rank}: step all-reduces gave {seen}, expected {expected}"
        assert shadowed == longest - iterations_of(rank), \
            f"rank {rank}: shadowed {shadowed} steps, expected {longest - iterations_of(rank)}"
        assert is_last == (rank == n - 1), f"rank {rank}: is_last_joiner {is_last}"
        assert kwargs == {"marker": "passed through"}, f"rank {rank}: join_hook got {kwargs}"


def test_join_argument_checks(world):
    """Join([]) and Join over joinables of different process groups raise ValueError, notify_join_context of a Joinable that skipped Joinable.__init__ an AssertionError, and an exception in the body propagates unchanged with the group still usable."""
    for rank, outcomes in enumerate(world.run(join_argument_checks)):
        assert outcomes == {"empty": "ValueError", "two groups": "ValueError", "uninitialised": "AssertionError",
                            "body": "BodyError: from the body", "all_reduce after": float(world.world_size)}, \
            f"rank {rank}: {outcomes}"
