"""One record per test case, built from pytest's reports (setup, call, teardown)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .causes import cause_of_text, with_cause

ERROR_LINES = 12


@dataclass
class CaseRecord:
    nodeid: str
    area: str = ""
    clause: str = ""
    backend: str = ""
    world_size: int | None = None
    outcome: str = ""  # passed, failed, error, skipped, xfailed, xpassed
    duration: float = 0.0
    reason: str = ""  # skip reason, or the xfail's declared gap
    error: str = ""  # first lines of the error (also for xfail: the backend's actual behaviour); line 1 = cause
    cause: str = ""  # what raised: the ranks' own exception type and message (reports/causes.py)
    findings: list = field(default_factory=list)  # what the backend did, recorded by the test
    # how each rank's operation ended under a network fault (suites/faults; reports/fault_figures.py decodes them)
    fault_figures: list = field(default_factory=list)
    rpc_agent: str = ""  # RPC clauses only (fixtures/rpc_plugin.py): the agent under test
    debug_level: str = ""  # TORCH_DISTRIBUTED_DEBUG of the ranks (OFF, INFO, DETAIL)
    # why the debug level did not take effect in the case's world ('' if it did): a DETAIL world whose backend
    # torch did not wrap (fixtures/debug_level.py); the case then counts at no level it did not run at
    debug_effect: str = ""
    init: str = ""  # --init of the case's world: lazy, or eager (device_id given to init_process_group)
    # --repeat (fixtures/repeat.py): this record's run of its case (1-based) and how many ran; 0 when not repeated
    repeat: int = 0
    repeats: int = 0
    # the declared intermittent gap of the case ('' if none): a passing run has no other trace of it
    intermittent: str = ""
    phases: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("phases")
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CaseRecord":
        """A record read back from conformance.json (unknown keys ignored: newer files load)."""
        known = {name for name in cls.__dataclass_fields__ if name != "phases"}
        record = cls(**{key: value for key, value in data.items() if key in known})
        if record.error and not record.cause:  # a file written before causes were recorded
            record.cause = cause_of_text(record.error)
        return record


def _first_lines(text: str, n: int = ERROR_LINES) -> str:
    """The informative head of a failure: the 'E ' lines pytest marks, else the tail."""
    lines = text.splitlines()
    marked = [line[2:].strip() for line in lines if line.startswith("E ")]
    chosen = marked if marked else lines[-n:]
    return "\n".join(chosen[:n])


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def _set_error(record: CaseRecord, report) -> None:
    """The error text, first line the cause: the collector's structured one, else read from the text."""
    error = _first_lines(report.longreprtext)
    cause = dict(report.user_properties).get("cause") or cause_of_text(error)
    record.cause = cause
    record.error = with_cause(cause, error)


def record_from_report(report, previous: CaseRecord | None) -> CaseRecord | None:
    record = previous or CaseRecord(nodeid=report.nodeid)
    props = dict(report.user_properties)
    record.area = props.get("area", record.area)
    record.clause = props.get("clause", record.clause)
    record.backend = props.get("backend", record.backend)
    record.world_size = props.get("world_size", record.world_size)
    record.debug_level = props.get("debug_level", record.debug_level)
    record.debug_effect = props.get("debug_effect", record.debug_effect)
    record.init = props.get("init", record.init)
    record.rpc_agent = props.get("rpc_agent", record.rpc_agent)
    record.repeat = props.get("repeat", record.repeat)
    record.repeats = props.get("repeats", record.repeats)
    record.intermittent = props.get("intermittent", record.intermittent)
    for name, value in report.user_properties:
        if name == "finding" and value not in record.findings:
            record.findings.append(value)
        elif name == "fault_figure" and value not in record.fault_figures:
            record.fault_figures.append(value)
    record.duration += report.duration
    record.phases[report.when] = report.outcome

    xfail_reason = getattr(report, "wasxfail", None)
    if report.when == "setup" and report.skipped:
        record.outcome = "xfailed" if xfail_reason is not None else "skipped"
        record.reason = xfail_reason if xfail_reason is not None else _skip_reason(report)
    elif report.failed and report.when in ("setup", "teardown"):
        record.outcome = "error"
        _set_error(record, report)
    elif report.when == "call":
        if xfail_reason is not None:
            record.outcome = "xfailed" if report.skipped else "xpassed"
            record.reason = xfail_reason
            if report.skipped:
                _set_error(record, report)
        elif report.skipped:
            record.outcome = "skipped"
            record.reason = _skip_reason(report)
        else:
            record.outcome = report.outcome
            if report.failed:
                _set_error(record, report)
    return record
