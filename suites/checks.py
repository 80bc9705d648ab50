"""Assertions shared by the suites, with messages that name the rank and the element."""

from __future__ import annotations

import torch


def expect_tensor(actual: torch.Tensor, expected: torch.Tensor, what: str, *, exact: bool = True) -> None:
    """``actual`` equals ``expected`` in dtype, shape and value (bitwise unless ``exact=False``)."""
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, expected a tensor"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    actual = actual.cpu()
    if exact:
        if torch.equal(actual, expected):
            return
        wrong = (actual != expected).reshape(-1).nonzero().reshape(-1)
        first = int(wrong[0])
        flat_a, flat_e = actual.reshape(-1), expected.reshape(-1)
        raise AssertionError(
            f"{what}: {wrong.numel()} of {expected.numel()} elements wrong; first at flat index {first}: "
            f"got {flat_a[first].item()!r}, expected {flat_e[first].item()!r}")
    # AVG divides, which may round differently from the oracle: allow two units
    # in the last place of the dtype, nothing more
    eps = torch.finfo(expected.dtype).eps
    wide_a, wide_e = actual.double(), expected.double()
    bad = ((wide_a - wide_e).abs() > 2 * eps * (1 + wide_e.abs())).reshape(-1).nonzero().reshape(-1)
    if bad.numel():
        first = int(bad[0])
        raise AssertionError(
            f"{what}: {bad.numel()} of {expected.numel()} elements beyond 2 ulp; first at flat index {first}: "
            f"got {wide_a.reshape(-1)[first].item()!r}, expected {wide_e.reshape(-1)[first].item()!r}")


def expect_on_every_rank(results, expected, what: str, *, exact: bool = True) -> None:
    for rank, actual in enumerate(results):
        expect_tensor(actual, expected, f"{what} on rank {rank}", exact=exact)
