"""Inputs for fuzzing the reference backend's wire format: how many, from which seed, and how they are made.

Shared by tests/test_reference_transport.py (outsiders on a group's listener)
and tests/test_reference_wire.py (the wire functions called directly).
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from backends.reference import wire

# How much the fuzz tests send. Hypothesis explores structured inputs (and shrinks a failure to
# a small example) but costs a few ms per example here; seeded random mutation loops add volume.
OUTSIDER_EXAMPLES = 400  # hypothesis: outsider connections
OUTSIDER_MUTANTS = 2000  # seeded loop: outsider connections with mutated frames
WIRE_EXAMPLES = 300  # hypothesis: inputs per wire function (decode_header, decode_meta, tensor_from)
WIRE_MUTANTS = 10_000  # seeded loop: inputs per wire function
SEED = 20240611


# hypothesis strategies: unsigned / signed integers of the header's field widths, and any JSON value
U8, U32 = st.integers(0, 255), st.integers(0, 2**32 - 1)
U64, I64 = st.integers(0, 2**64 - 1), st.integers(-2**63, 2**63 - 1)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)


# header fields (by position in wire.HEADER) and the values at and around their limits
EDGE_VALUES = {
    1: [0, wire.VERSION + 1, 255],
    2: [0, wire.HELLO, wire.P2P, wire.COLL, 4, 255],
    3: [-2**63, -1, 0, 1, 2**63 - 1],
    4: [0, 1, 7, wire.MAX_META - 1, wire.MAX_META, wire.MAX_META + 1, 2**32 - 1],
    5: [0, 1, 8, wire.MAX_DATA, wire.MAX_DATA + 1, 2**64 - 1],
}


def mutate(rng: random.Random, raw: bytes) -> bytes:
    """raw with 1 to 4 random edits: a flipped bit, a replaced byte, a cut, an insertion, a deleted
    slice, or one header field set to a value at or around its limit."""
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        edit = rng.randrange(6)
        if edit == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif edit == 1 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif edit == 2:
            del data[rng.randrange(len(data) + 1):]
        elif edit == 3:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        elif edit == 4 and data:
            at = rng.randrange(len(data))
            del data[at:at + rng.randint(1, 8)]
        elif edit == 5 and len(data) >= wire.HEADER.size:
            fields = list(wire.HEADER.unpack(bytes(data[:wire.HEADER.size])))
            field = rng.choice(sorted(EDGE_VALUES))
            fields[field] = rng.choice(EDGE_VALUES[field])
            data[:wire.HEADER.size] = wire.HEADER.pack(*fields)
    return bytes(data)
