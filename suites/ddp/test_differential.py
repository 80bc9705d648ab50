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

Every run first trains the pinned cases (``pinned_cases``), the runs the
seeded bugs of tests/seeded/ this clause catches need.

Options and reproduction (the runner: suites/differential.py):

* ``--hypothesis-profile ci|thorough|pins``: runs per implementation, backend and
  world size, one per ``RUN_COST`` examples of the profile: 12 (``ci``, the
  default), 125, or the pins alone (fixtures/hypothesis_profiles.py); ``--hypothesis-seed N``
  repeats a session's runs.
* A failure shrinks to a minimal ``Case(...)`` and prints a command that
  replays exactly it through ``DISTCONFORM_REPLAY``.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import strategies as st

from suites.ddp import impls
from suites.ddp.common import expect_close
from suites.ddp.differential import MODES, Case, expected_of, train_case
from suites.differential import REPLAY_ENV, Pin, explore, replay_command, replayed, run_on_world

pytestmark = pytest.mark.needs(feature="ddp")

ATOL = 1e-5
# A generated training run costs about as much as 16-20 generated collective calls (on gloo, 2 cores: 0.6 s
# against 30 ms), so a run is drawn per RUN_COST examples of the profile: 12 runs under ci's 200.
RUN_COST = 16


@st.composite
def cases(draw, world_size: int, divide_modes=(True, False)) -> Case:
    depth = draw(st.integers(1, 3))
    widths = tuple(draw(st.lists(st.integers(1, 6), min_size=depth + 1, max_size=depth + 1)))
    rows = tuple(draw(st.lists(st.integers(1, 4), min_size=world_size, max_size=world_size)))
    iterations = tuple(draw(st.lists(st.integers(1, 4), min_size=world_size, max_size=world_size)))
    return Case(widths=widths, rows=rows, iterations=iterations, loss=draw(st.sampled_from(["mean", "sum"])),
                divide_by_initial_world_size=draw(st.sampled_from(divide_modes)), mode=draw(st.sampled_from(list(MODES))),
                seed=draw(st.integers(0, 2**16)))


def pinned_cases(world_size: int, divide_modes: tuple) -> list[Pin]:
    """The runs the seeded bugs of tests/seeded/ need, each trained before any drawn one, with the bugs each
    catches."""
    n = world_size
    uneven = tuple(min(4, n - rank) for rank in range(n))  # rank 0 trains longest; the others join early
    # one bucket per parameter: 6 all_reduces an iteration over 4 iterations, so one of every 7 is among them
    pins = [Pin(Case(widths=(2, 3, 3, 1), rows=(2,) * n, iterations=(4,) * n, mode="small_buckets", seed=1),
                ("ddp_drop_allreduce",))]
    if False in divide_modes:  # Join dividing by the ranks still running, not by the world size
        pins.append(Pin(Case(widths=(2, 1), rows=(1,) * n, iterations=uneven, divide_by_initial_world_size=False,
                             seed=1), ("ddp_join_divide_factor",)))
    return pins


def check_case(world, impl: str, case: Case) -> None:
    __tracebackhide__ = True
    command = replay_command(case, "'suites/ddp/test_differential.py'", world.spec.name, world.world_size,
                             world.plugins, keyword=impl)
    where = f"\nfailing case: {case!r}\nreplay: {command}"
    results = run_on_world(world, where, train_case, impl, case)
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
def test_generated_runs_match_oracle(world, impl, backend_spec):
    """Generated MLPs, batch sizes, per-rank iteration maps under Join, loss and reducer modes: every rank's gradients and final weights equal the single-process oracle."""
    case = replayed(Case)
    if case is not None:
        if case.world_size != world.world_size:
            pytest.skip(f"{REPLAY_ENV} replays a case for world size {case.world_size}")
        check_case(world, impl, case)
        return

    # a divide mode whose requirements hit one of the backend's declared gaps is never drawn
    divide_modes = tuple(d for d in (True, False)
                         if not impls.needs_of(impl, d) or backend_spec.gap_for(**impls.needs_of(impl, d)) is None)
    explore(cases(world.world_size, divide_modes), lambda case: check_case(world, impl, case),
            pinned_cases(world.world_size, divide_modes), share=Fraction(1, RUN_COST))
