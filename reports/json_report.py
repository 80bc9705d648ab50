"""conformance.json: every case with its backend, world size, contract area and clause."""

from __future__ import annotations

import json
from collections import Counter


def write_json(path: str, records, meta: dict) -> None:
    totals = Counter(r.outcome for r in records)
    document = {
        "meta": meta,
        "totals": dict(sorted(totals.items())),
        "cases": [r.to_dict() for r in sorted(records, key=lambda r: r.nodeid)],
    }
    with open(path, "w") as fh:
        json.dump(document, fh, indent=1)
        fh.write("\n")
