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


_STR_FIELDS = ("nodeid", "area", "clause", "backend", "outcome", "reason", "error", "cause", "rpc_agent")


def _checked_case(index: int, case) -> dict:
    """A case of a conformance.json with the types the reports rely on, or ValueError naming the field."""
    if not isinstance(case, dict):
        raise ValueError(f"case {index} is {type(case).__name__}, not an object")
    if not isinstance(case.get("nodeid"), str) or not case["nodeid"]:
        raise ValueError(f"case {index} has no 'nodeid' string")
    for name in _STR_FIELDS:
        if name in case and not isinstance(case[name], str):
            raise ValueError(f"case {index} ({case['nodeid']}): '{name}' must be a string")
    size = case.get("world_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
        raise ValueError(f"case {index} ({case['nodeid']}): 'world_size' must be an integer or null")
    duration = case.get("duration", 0.0)
    if not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration != duration:
        raise ValueError(f"case {index} ({case['nodeid']}): 'duration' must be a number")
    findings = case.get("findings", [])
    if not isinstance(findings, list) or not all(isinstance(f, str) for f in findings):
        raise ValueError(f"case {index} ({case['nodeid']}): 'findings' must be a list of strings")
    return {**case, "duration": float(duration)}


def read_json(path: str):
    """(records, meta) of a conformance.json; ValueError naming the problem for a file that is not one."""
    from .records import CaseRecord

    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable conformance.json ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("cases"), list):
        raise ValueError(f"{path}: not a conformance.json (no 'cases' list)")
    meta = document.get("meta") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: 'meta' must be an object")
    try:
        records = [CaseRecord.from_dict(_checked_case(i, case)) for i, case in enumerate(document["cases"])]
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return records, meta
