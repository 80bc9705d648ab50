"""Contract: which parameters share a bucket, in which order buckets are reduced.

DDP assigns managed parameters to buckets by walking them in definition order
and closing a bucket once it holds at least the current size limit (a bucket
may exceed it by one tensor), per dtype; the limits are
``[sys.maxsize]`` (one bucket) unless find_unused_parameters is on, then
``[1 MiB, 25 MiB]``. The reducer gets the buckets reversed: bucket 0 holds
the last-defined parameters, indices inside a bucket stay ascending (spec A2,
D1, D2). With gradient_as_bucket_view every gradient is a view of its
bucket's flat buffer (A9). Observed through the implementation adapter
(suites/ddp/impls.py).
"""

import pytest

from suites.ddp import common, impls, models

pytestmark = pytest.mark.needs(feature="ddp")


# ---------------------------------------------------------------- rank side
def layout_of(impl, model_name, options):
    model = {"spec_net": models.SpecNet, "flat_params": models.FlatParams}[model_name]()
    ddp = impls.wrap(impl, model, **options)
    return impls.bucket_indices(ddp), impls.bucket_numels(ddp)


def gradient_storages(impl, seed, options, steps=2):
    """Per step: for each bucket (reducer order), the storage pointer of each of its gradients."""
    model = models.mlp(seed, (6, 8, 4, 1))
    ddp = impls.wrap(impl, model, **options)
    managed = impls.managed_parameters(ddp)
    per_step = []
    for step in range(steps):
        x, y = common.local_batch(seed, step, 4, 6)
        ddp.zero_grad(set_to_none=False)
        common.mse(ddp(x), y, "mean").backward()
        buckets = impls.bucket_indices(ddp)
        per_step.append([[managed[i].grad.untyped_storage().data_ptr() for i in bucket] for bucket in buckets])
    return per_step


# ------------------------------------------------------------------ clauses
@pytest.mark.parametrize("impl", impls.impl_params())
def test_default_buckets_hold_every_parameter_in_one(world, impl):
    """Spec D2: Linear(512,512)/(512,256)/(256,4) with default options is one bucket of 395012 elements holding indices 0-5."""
    for rank, (indices, numels) in enumerate(world.run(layout_of, impl, "spec_net", {})):
        assert (indices, numels) == ([[0, 1, 2, 3, 4, 5]], [395012]), \
            f"{impl} DDP rank {rank}: buckets {indices} of numels {numels}, expected [[0..5]] of [395012]"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_find_unused_buckets_are_reversed_with_a_small_first_bucket(world, impl):
    """Spec D2: with find_unused_parameters the limits are [1 MiB, 25 MiB]: bucket 0 = every parameter but a.weight (132868 elements), bucket 1 = [a.weight]."""
    options = {"find_unused_parameters": True}
    for rank, (indices, numels) in enumerate(world.run(layout_of, impl, "spec_net", options)):
        assert (indices, numels) == ([[1, 2, 3, 4, 5], [0]], [132868, 262144]), \
            f"{impl} DDP rank {rank}: buckets {indices} of numels {numels}, expected [[1..5], [0]] of [132868, 262144]"


@pytest.mark.parametrize("impl", impls.impl_params())
@pytest.mark.parametrize("find_unused,expected", [
    pytest.param(True, ([[3, 4], [2], [0, 1]], [200005, 10, 301000]), id="limits_1MiB_25MiB"),
    pytest.param(False, ([[2], [0, 1, 3, 4]], [10, 501005]), id="one_limit"),
])
def test_bucket_assignment_by_size_and_dtype(world, impl, find_unused, expected):
    """Spec D1: parameters of 1000, 300000, 10 (float64), 200000, 5 elements bucket as [[0,1],[2],[3,4]] (limits [1 MiB, 25 MiB]) or [[0,1,3,4],[2]] (one limit), reversed for the reducer."""
    options = {"find_unused_parameters": find_unused}
    for rank, got in enumerate(world.run(layout_of, impl, "flat_params", options)):
        assert got == expected, f"{impl} DDP rank {rank}: buckets (indices, numels) {got}, expected {expected}"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_gradient_as_bucket_view_grads_share_their_bucket_storage(world, impl):
    """gradient_as_bucket_view: after each backward (one bucket, then rebuilt small ones) the gradients of one bucket are views of one flat buffer, a different one per bucket."""
    options = {"gradient_as_bucket_view": True, "bucket_cap_mb": 100 / 2**20}
    for rank, per_step in enumerate(world.run(gradient_storages, impl, 21, options)):
        for step, buckets in enumerate(per_step):
            if step == len(per_step) - 1:  # buckets rebuilt after the first backward obey the cap
                assert len(buckets) > 1, f"{impl} DDP rank {rank}: expected several buckets at a 100-byte cap"
            shared = [set(ptrs) for ptrs in buckets]
            assert all(len(s) == 1 for s in shared), \
                f"{impl} DDP rank {rank} step {step}: gradients of one bucket live in different storages {buckets}"
            assert len({next(iter(s)) for s in shared}) == len(buckets), \
                f"{impl} DDP rank {rank} step {step}: two buckets share one storage {buckets}"


@pytest.mark.parametrize("impl", impls.impl_params())
def test_without_bucket_view_each_grad_has_its_own_storage(world, impl):
    """Without gradient_as_bucket_view every .grad is a tensor of its own, not a view into a bucket."""
    options = {"bucket_cap_mb": 100 / 2**20}
    for rank, per_step in enumerate(world.run(gradient_storages, impl, 22, options)):
        for step, buckets in enumerate(per_step):
            pointers = [p for bucket in buckets for p in bucket]
            assert len(set(pointers)) == len(pointers), \
                f"{impl} DDP rank {rank} step {step}: gradients share storage {buckets}"
