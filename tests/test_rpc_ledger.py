"""The reference agents' graceful-shutdown ledger (backends/reference/rpc/ledger.py): links, and strict decoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.reference.rpc.ledger import Ledger, LedgerError, open_links, quiet


def ledger(sent, received, lost=()):
    return Ledger(tuple(sent), tuple(received), frozenset(lost))


def test_balanced_links_are_quiet():
    """Every message sent on a link was received at its other end."""
    links = open_links([ledger([1, 2], [1, 0]), ledger([0, 0], [2, 0])])
    assert links == {(0, 0): (1, 1), (0, 1): (2, 2), (1, 0): (0, 0), (1, 1): (0, 0)} and quiet(links)


def test_a_message_in_flight_is_not_quiet():
    assert not quiet(open_links([ledger([0, 1], [0, 0]), ledger([0, 0], [0, 0])]))


@pytest.mark.parametrize("lost_by", [0, 1])
def test_a_link_either_end_lost_leaves_the_ledger(lost_by):
    """Rank 0's message to rank 1 went down with their link: it is not waited for (it waited for ever)."""
    ledgers = [ledger([0, 1], [0, 0], {1} if lost_by == 0 else ()), ledger([0, 0], [0, 0], {0} if lost_by == 1 else ())]
    links = open_links(ledgers)
    assert (0, 1) not in links and (1, 0) not in links and quiet(links)


def test_round_trip():
    original = ledger([3, 0, 1], [0, 2, 5], {2})
    assert Ledger.decode(original.encode(), 3) == original


@pytest.mark.parametrize("raw, names", [
    (b"not json", "not JSON"),
    (b"[]", "keys sent, received, lost"),
    (json.dumps({"sent": [1], "received": [0, 0], "lost": []}).encode(), "'sent' must be 2 counts"),
    (json.dumps({"sent": [1, -1], "received": [0, 0], "lost": []}).encode(), "'sent' must be 2 counts"),
    (json.dumps({"sent": [1, 0], "received": [0, True], "lost": []}).encode(), "'received' must be 2 counts"),
    (json.dumps({"sent": [1, 0], "received": [0, 0], "lost": [2]}).encode(), "'lost' must be ranks below 2"),
])
def test_bad_ledgers_are_named(raw, names):
    with pytest.raises(LedgerError, match=names):
        Ledger.decode(raw, 2)


@given(st.binary(max_size=64) | st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["sent", "received", "lost", "x"]),
                                                                inner, max_size=4),
    max_leaves=10).map(lambda doc: json.dumps(doc).encode()))
def test_decode_fuzz(raw):
    """Whatever the store holds, decoding returns a ledger of the world's size or raises LedgerError."""
    try:
        decoded = Ledger.decode(raw, 2)
    except LedgerError:
        return
    assert len(decoded.sent) == len(decoded.received) == 2 and decoded.lost <= {0, 1}
