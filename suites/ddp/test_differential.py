"""Contract: on generated training runs, DDP agrees with the single-process oracle.

hypothesis draws small MLPs (1-3 layers, widths 1-6), per-rank batch sizes
(1-4 samples, unequal across ranks too), per-rank iteration counts (1-4, so
most runs are uneven and go through Join), mean or sum loss, both Join divide
modes and a reducer mode (one bucket, many small buckets,
find_unused_parameters, gradient_as_bucket_view). Each implementation (torch's
DDP, the reference reducer) trains the run in the backend's world with SGD;
every rank's gradient at every iteration and every rank's final weights must
equal the oracle's (suites/ddp/differential.py) within atol 1e-5. Since both
implementations are held to the same oracle, they also agree with each other.
A divide mode whose requirements (impls.needs_of) hit a declared gap of the
backend is never drawn.

Options and reproduction:

* ``--ddp-examples N`` (default 12): runs per implementation,
  backend and world size; ``--hypothesis-seed N`` repeats a session's runs.
* A failure shrinks to a minimal ``Case(...)`` and prints a command that
  replays exactly it through ``DISTCONFORM_DDP_REPLAY``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fixtures.errors import RankError, WorldError
from suites.ddp import impls
from suites.ddp.common import expect_close
from suites.ddp.differential import MODES, Case, expected_of, train_case

pytestmark = pytest.mark.needs(feature="ddp")

REPLAY_ENV = "DISTCONFORM_DDP_REPLAY"
ATOL = 1e-5


class WorldLost(BaseException):
    """The world died or hung: not worth shrinking on (a BaseException, so hypothesis lets it through)."""


class RunFailed(Exception):
    """A rank raised; the world was reset, hypothesis may shrink."""


@st.composite
def cases(draw, world_size: int, divide_modes=(True, False)) -> Case:
    depth = draw(st.integers(1, 3))
    widths = tuple(draw(st.lists(st.integers(1, 6), min_size=depth + 1, max_size=depth + 1)))
    rows = tuple(draw(st.lists(st.integers(1, 4), min_size=world_size, max_size=world_size)))
    iterations = tuple(draw(st.lists(st.integers(1, 4), min_size=world_size, max_size=world_size)))
    return Case(widths=widths, rows=rows, iterations=iterations, loss=draw(st.sampled_from(["mean", "sum"])),
                divide_by_initial_world_size=draw(st.sampled_from(divide_modes)), mode=draw(st.sampled_from(list(MODES))),
                seed=draw(st.integers(0, 2**16)))


def replay_command(world, impl: str, case: Case) -> str:
    plugins = "".join(f" --backend-plugin {p}" for p in world.plugins)
    return (f"{REPLAY_ENV}=\"{case!r}\" python -m pytest 'suites/ddp/test_differential.py' -k {impl} "
            f"--backend {world.spec.name} --world-size {world.world_size}{plugins}")


def check_case(world, impl: str, case: Case) -> None:
    __tracebackhide__ = True
    where = f"\nfailing case: {case!r}\nreplay: {replay_command(world, impl, case)}"
    try:
        results = world.run(train_case, impl, case)
    except RankError as exc:
        if world.alive and world.tainted:
            try:
                world.reset()
            except WorldError as reset_error:
                raise WorldLost(f"{exc}\n(resetting the world failed: {reset_error}){where}") from None
        if not world.alive:
            raise WorldLost(f"{exc}{where}") from None
        raise RunFailed(f"{exc}{where}") from None
    except WorldError as exc:
        raise WorldLost(f"{exc}{where}") from None
    expected_grads, expected_params = expected_of(case)
    try:
        for rank, (grads, params) in enumerate(results):
            assert len(grads) == case.iterations[rank], f"rank {rank} ran {len(grads)} iterations"
            for step, (got, want) in enumerate(zip(grads, expected_grads[rank])):
                expect_close(got, want, f"{impl} DDP rank {rank} iteration {step} grad", atol=ATOL, rtol=1e-4)
            expect_close(params, expected_params, f"{impl} DDP rank {rank} final weights", atol=ATOL, rtol=1e-4)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{where}") from None


@pytest.mark.parametrize("impl", impls.impl_params())
def test_generated_runs_match_oracle(world, impl, backend_spec, request):
    """Generated MLPs, batch sizes, per-rank iteration maps under Join, loss and reducer modes: every rank's gradients and final weights equal the single-process oracle."""
    replay = os.environ.get(REPLAY_ENV)
    if replay:
        case = eval(replay, {"Case": Case})  # noqa: S307 - the user's own reproducer
        if case.world_size != world.world_size:
            pytest.skip(f"{REPLAY_ENV} replays a case for world size {case.world_size}")
        check_case(world, impl, case)
        return

    # a divide mode whose requirements hit one of the backend's declared gaps is never drawn
    divide_modes = tuple(d for d in (True, False)
                         if not impls.needs_of(impl, d) or backend_spec.gap_for(**impls.needs_of(impl, d)) is None)

    @settings(max_examples=request.config.getoption("ddp_examples"), deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate, Phase.shrink),
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(case=cases(world.world_size, divide_modes))
    def differential(case):
        check_case(world, impl, case)

    differential()
