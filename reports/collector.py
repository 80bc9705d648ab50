"""pytest plugin gathering one record per test case and writing the reports.

The files are written by the controlling pytest process only (under xdist,
worker reports are forwarded to it by pytest-xdist), so a run writes one set:

* ``<report-dir>/conformance.json``  every case (reports/json_report.py)
* ``<report-dir>/junit.xml``          pytest's own junitxml, switched on here
* ``<report-dir>/summary.md``         short: table, failures by cause, gaps, findings (reports/markdown.py)
* ``<report-dir>/report.html``        self-contained, for a browser (reports/html_report.py)

Where a harness exception wraps the ranks' own exceptions, the cause (the
ranks' exception type and message) is recorded while the exception object is
still at hand, and becomes the first line of the failure everywhere:
pytest's short summary, junit.xml's failure message and both reports.
"""

from __future__ import annotations

import os
import time

import pytest

from . import runfacts, views
from .causes import cause_of_exception
from .html_report import write_html
from .json_report import write_json
from .markdown import write_markdown
from .records import record_from_report


def pytest_addoption(parser):
    parser.getgroup("distconform").addoption(
        "--report-dir", default=os.path.join("reports", "out"),
        help="where conformance.json, junit.xml, summary.md and report.html go (default: reports/out, git-ignored)")


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def report_dir(config) -> str:
    path = config.getoption("report_dir")
    return path if os.path.isabs(path) else os.path.join(str(config.invocation_params.dir), path)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _is_xdist_worker(config):
        return
    # Use pytest's JUnit writer rather than a home-made one; only choose its path.
    if not getattr(config.option, "xmlpath", None):
        config.option.xmlpath = os.path.join(report_dir(config), "junit.xml")
    config.pluginmanager.register(ReportCollector(config), "distconform-report-collector")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    # user_properties travel with xdist reports, so area and clause reach the controller.
    for item in items:
        area, clause = area_and_clause(item)
        item.user_properties.append(("area", area))
        item.user_properties.append(("clause", clause))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    excinfo = call.excinfo
    cause = cause_of_exception(excinfo.value) if excinfo is not None else ""
    if cause:
        # Travels to an xdist controller with the report; records.py reads it.
        report.user_properties.append(("cause", cause))
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None and not crash.message.startswith(cause):
            # The first line pytest's short summary and junit.xml show: the cause, then the wrapper's text.
            crash.message = f"{cause}\n{crash.message}"
    return report


def area_and_clause(item) -> tuple[str, str]:
    """Area = the suites/ sub-folder; clause = the first line of the test's docstring."""
    parts = os.path.relpath(str(item.path), str(item.config.rootpath)).split(os.sep)
    area = parts[1] if len(parts) > 2 and parts[0] == "suites" else parts[0]
    function = getattr(item, "function", None)
    doc = (function.__doc__ or "").strip() if function is not None else ""
    clause = doc.splitlines()[0] if doc else getattr(item, "originalname", item.name)
    return area, clause


class ReportCollector:
    def __init__(self, config):
        self.config = config
        self.records: dict = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report):
        record = record_from_report(report, self.records.get(report.nodeid))
        if record is not None:
            self.records[report.nodeid] = record

    def _has_conformance_cases(self) -> bool:
        # A run of the project's own tests (tests/) has no backend cases: no report.
        return not self.config.option.collectonly and any(r.backend for r in self.records.values())

    def meta(self, exitstatus) -> dict:
        config = self.config
        meta = {
            "backends": config.getoption("backend"),
            "world_sizes": config.getoption("world_size"),
            # what the run's default forms left out (fixtures/hookspecs.py: pytest_distconform_left_out)
            "left_out": [line for lines in config.hook.pytest_distconform_left_out(config=config) for line in lines],
            "debug_levels": ",".join(sorted({r.debug_level for r in self.records.values() if r.debug_level})),
            # per world, why its debug level did not take effect (a DETAIL that torch did not wrap)
            "debug_levels_not_in_effect": views.levels_not_in_effect(self.records.values()),
            "inits": ",".join(sorted({r.init for r in self.records.values() if r.init})),
            "plugins": config.getoption("backend_plugin"),
            "rpc_agents": config.getoption("rpc_agent", None),
            "wall_seconds": round(time.time() - self.started, 3),
            "exit_status": int(exitstatus),
        }
        repeat = config.getoption("repeat", 1)
        if repeat and repeat > 1:  # a plain run's facts stay as they were
            meta["repeat"] = repeat
        meta.update(runfacts.collect(started=self.started, root=str(config.rootpath),
                                     plugins=config.getoption("backend_plugin"), args=config.invocation_params.args))
        return meta

    # trylast: other plugins' session-end files (profiling/parity.json) exist before report.html reads them.
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if not self._has_conformance_cases():
            return
        out = report_dir(self.config)
        os.makedirs(out, exist_ok=True)
        # session.exitstatus: a plugin may have changed it this hook (fixtures/repeat.py, a gap that closed)
        meta = self.meta(session.exitstatus)
        records = list(self.records.values())
        write_json(os.path.join(out, "conformance.json"), records, meta)
        write_markdown(os.path.join(out, "summary.md"), records, meta)
        write_html(os.path.join(out, "report.html"), records, meta, started=self.started)

    def pytest_terminal_summary(self, terminalreporter):
        if not self._has_conformance_cases():
            return  # nothing was written (see pytest_sessionfinish): do not point at stale files
        out = report_dir(self.config)
        terminalreporter.write_sep("-", "distconform report")
        terminalreporter.write_line(f"report: {os.path.join(out, 'summary.md')} and {os.path.join(out, 'report.html')} "
                                    f"(conformance.json and junit.xml beside them)")
