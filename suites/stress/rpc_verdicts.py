"""What the RPC benchmark's figures are held to: the headline targets (benchmark figures, never assertions)
and the regression check against a baseline (which does fail the run)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from suites.stress.records import Baseline, RpcRecord
from suites.stress.rpc_figures import BASE_AGENT
from suites.stress.rpc_options import TRAIN_MODE


@dataclass(frozen=True)
class Target:
    """A headline figure: ``agent``'s ``metric`` against a bound (relative: x tensorpipe's)."""

    agent: str
    backend: str | None  # None: whichever backends ran
    benchmark: str
    mode: str
    metric: str  # "rpcs_per_s" or "p50_us"
    sense: str  # ">=" or "<="
    bound: float
    relative: bool

    def describe(self) -> str:
        over = f" over {self.backend}" if self.backend else ""
        bound = f"{self.bound:g}x {BASE_AGENT}" if self.relative else f"{self.bound:g} us"
        return f"{self.agent}{over} {self.benchmark} {self.mode} {self.metric} {self.sense} {bound}"

    def value(self, record: RpcRecord) -> float | None:
        """The record's figure this target reads: its ratio to tensorpipe, or the metric itself."""
        if self.relative:
            return record.x_tensorpipe
        return record.rpcs_per_s if self.metric == "rpcs_per_s" else record.p50_us


TARGETS = (
    Target("reference-tp", None, "light", "async", "rpcs_per_s", ">=", 1.5, True),
    Target("reference-tp", None, "light", "sync", "rpcs_per_s", ">=", 1.5, True),
    Target("reference-tp", None, "light", "sync", "p50_us", "<=", 60.0, False),
    Target("reference-pg", "gloo", "light", "async", "rpcs_per_s", ">=", 0.5, True),
    Target("reference-pg", "gloo", "light", "sync", "rpcs_per_s", ">=", 0.5, True),
    Target("reference-tp", None, "train", TRAIN_MODE, "rpcs_per_s", ">=", 1.0, True),  # steps/s per trainer
)


def headline(records: list[RpcRecord], args: argparse.Namespace, unavailable: list[dict]) -> list[dict]:
    """The reference agents' targets (benchmark figures, never assertions)."""
    reasons = {u["agent"]: u["reason"] for u in unavailable if u["agent"]}
    lines = []
    for t in TARGETS:
        entry = {"target": t.describe(), "agent": t.agent, "benchmark": t.benchmark, "mode": t.mode,
                 "metric": t.metric, "sense": t.sense, "bound": t.bound, "relative": t.relative,
                 "value": None, "status": "NOT MEASURED", "why": ""}
        match = [r for r in records if r.key.agent == t.agent and r.key.benchmark == t.benchmark
                 and r.key.mode == t.mode and not r.key.profiled and (t.backend is None or r.key.backend == t.backend)]
        values = [v for v in (t.value(r) for r in match) if v is not None]
        if values:
            value = min(values) if t.sense == ">=" else max(values)  # the worst world counts
            entry["value"] = value
            entry["status"] = "PASS" if (value >= t.bound if t.sense == ">=" else value <= t.bound) else "MISS"
        elif t.agent not in args.agents or (t.relative and BASE_AGENT not in args.agents):
            entry["why"] = f"needs --agent {BASE_AGENT + ',' if t.relative else ''}{t.agent}"
        elif t.agent in reasons or (t.relative and BASE_AGENT in reasons):
            who = t.agent if t.agent in reasons else BASE_AGENT
            entry["why"] = f"{who} unavailable: {reasons[who]}"
        elif t.backend and t.backend not in args.backends:
            entry["why"] = f"needs --backend {t.backend}"
        elif t.benchmark not in args.benchmark_list or t.mode not in args.mode_list:
            entry["why"] = "benchmark or mode not in this run"
        else:
            entry["why"] = "no result (see the errors)"
        lines.append(entry)
    return lines


def check_regressions(records: list[RpcRecord], baseline: Baseline,
                      max_pct: float) -> tuple[list[dict], list[dict]]:
    """(regressions, records without a comparable baseline record) against ``baseline``'s records.

    A record regressed when its RPCs/s is lower, or its p50 higher, than the
    baseline's same (agent, backend, world size, benchmark, mode, profiled) by
    more than ``max_pct`` percent. A baseline record with another call count
    is not comparable: the record is listed as missing, not failed.
    """
    base = {b.key: b for b in baseline.records}
    regressions, missing = [], []
    for r in records:
        b = base.get(r.key)
        if b is None or b.calls != r.calls:
            why = "not in the baseline" if b is None else f"baseline has {b.calls} calls, this run {r.calls}"
            missing.append(dict(r.key.to_json(), why=why))
            continue
        found: list[tuple[str, float, float, str]] = []
        if r.rpcs_per_s is not None and b.rpcs_per_s:
            change = 100.0 * (b.rpcs_per_s - r.rpcs_per_s) / b.rpcs_per_s
            if change > max_pct:
                found.append(("rpcs_per_s", b.rpcs_per_s, r.rpcs_per_s, f"{change:.1f}% lower"))
        if r.p50_us is not None and b.p50_us:
            change = 100.0 * (r.p50_us - b.p50_us) / b.p50_us
            if change > max_pct:
                found.append(("p50_us", b.p50_us, r.p50_us, f"{change:.1f}% higher"))
        for metric, was, now, change in found:
            regressions.append(dict(r.key.to_json(), metric=metric, baseline=was, value=now,
                                    change=change, max_regression_pct=max_pct))
    return regressions, missing
