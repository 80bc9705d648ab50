"""An RPC benchmark record from the ranks' results: the slowest rank, the best of --repeat runs, and the
ratios only the whole run gives (x tensorpipe in the same world, profiled over unprofiled time)."""

from __future__ import annotations

import dataclasses

from suites.stress import metrics
from suites.stress.records import RpcKey, RpcProfile, RpcRecord

BASE_AGENT = "tensorpipe"  # what the others are compared with (x_tensorpipe)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def make_record(key: RpcKey, calls: int, results: list[dict]) -> RpcRecord:
    """One row from every rank's rpc_bench.measure (or rpc_train.measure) result.

    Timing comes from the ranks that were timed: every rank, or for ``train``
    the trainers (the parameter server only serves); wrong answers from all.
    """
    wrong = sum(r["wrong"] for r in results)
    results = [r for r in results if r.get("timed", True)]
    seconds = max(r["seconds"] for r in results)
    sync = results[0]["samples_ns"] is not None
    per_rank_p50 = tuple(metrics.percentile(r["samples_ns"], 50) / 1e3 for r in results) if sync else None
    per_rank_p99 = tuple(metrics.percentile(r["samples_ns"], 99) / 1e3 for r in results) if sync else None
    profile = None
    if key.profiled:
        profiles = [r["profile"] for r in results]
        profile = RpcProfile(events=sum(p["events"] for p in profiles),
                             rpc_records=sum(p["rpc_records"] for p in profiles),
                             remote_events=sum(p["remote_events"] for p in profiles),
                             exit_seconds=max(p["exit_seconds"] for p in profiles))
    return RpcRecord(
        key=key, calls=calls, warmup=results[0]["warmup"],
        rpcs_per_s=calls / seconds if seconds > 0 else None,
        p50_us=max(per_rank_p50) if per_rank_p50 is not None else None,
        p99_us=max(per_rank_p99) if per_rank_p99 is not None else None,
        seconds=seconds,
        per_rank_rpcs_per_s=tuple(calls / r["seconds"] if r["seconds"] > 0 else None for r in results),
        per_rank_seconds=tuple(r["seconds"] for r in results),
        per_rank_p50_us=per_rank_p50, per_rank_p99_us=per_rank_p99,
        wrong=wrong, profile=profile)


def best_of(key: RpcKey, calls: int, runs: list[list[dict]], wall_s: float | None = None) -> RpcRecord:
    """The record of the fastest of --repeat runs (least noise from other processes); every run's figures kept,
    every run's wrong answers counted."""
    records = [make_record(key, calls, results) for results in runs]
    best = min(records, key=lambda r: r.seconds)
    return dataclasses.replace(best, repeats=tuple(r.figures() for r in records),
                               wrong=sum(r.wrong for r in records), wall_s=wall_s)


def with_ratios(records: list[RpcRecord]) -> list[RpcRecord]:
    """x_tensorpipe: RPCs/s over tensorpipe's in the same world and mode; overhead: profiled / unprofiled time."""
    by_key = {r.key: r for r in records}
    out = []
    for r in records:
        base = by_key.get(dataclasses.replace(r.key, agent=BASE_AGENT))
        plain = by_key.get(dataclasses.replace(r.key, profiled=False)) if r.key.profiled else None
        out.append(dataclasses.replace(
            r, x_tensorpipe=ratio(r.rpcs_per_s, base.rpcs_per_s) if base else None,
            overhead=ratio(r.seconds, plain.seconds) if plain else None))
    return out
