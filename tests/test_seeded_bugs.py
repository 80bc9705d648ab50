"""The seeded-bug gallery: every contract earns its place by failing on a broken backend.

Each module of ``tests/seeded`` (besides the wrapper, the clean control and
the helpers) registers a backend with one planted bug, declared by a
``SeededBug`` in ``tests/seeded/registry.py``. For each, the suite area its
record names (``suite``) runs in a subprocess exactly as a user would run it::

    python -m pytest suites/c10d/test_barrier.py --backend-plugin tests.seeded.<module> --backend <module> --world-size 2

(forked from a server that has torch imported, tests/harness_cases/warm.py: the same run, 2.4 s of CPU less),
and a case of a clause the record names must fail in that clause's own check
(tests/gallery_verdict.py: an exception raised in the bug's module is a
crash, not a catch). ``-x`` stops at the first failure, which keeps a bug's
run short. A record may add run options (``options``, e.g. the RPC agent to
run). Bugs that hang (``hangs=True``) run with a 5 s harness
deadline, which must kill the hung world and fail the case; every run also
has a subprocess timeout, so a broken harness fails this test instead of
hanging it.

The bugs' runs are independent processes that mostly start worlds and
wait, so the gallery runs GALLERY_JOBS of them at once (``gallery_runs``:
every selected bug's run is started when the first one is asked for, and
each test waits for its own); under pytest-xdist each test runs its own bug
and xdist provides the concurrency.

The control runs plain gloo and the clean wrapper side by side in one
session, with pytest-xdist workers and the RPC agents that send over the
backend (agents_over_the_backend): no failures at all, and the two backends
get the same outcome in every case except where the wrapper's own declared
gaps apply.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from fixtures.workers import default_workers
from tests.gallery_failures import FailedCase, chain_from_text, read_failures
from tests.gallery_record import SeededBug
from tests.gallery_verdict import judge
from tests.seeded.registry import BUGS
from tests.harness_cases import warm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDED_DIR = os.path.join(REPO_ROOT, "tests", "seeded")
NOT_BUGS = {"__init__", "gloo_wrapper", "clean", "reference_base", "planting", "registry"}
BUG_TIMEOUT_S = 300
CONTROL_TIMEOUT_S = 500
HANG_DEADLINE_S = 5
# Bug runs at once: each spends most of its time importing torch into fresh processes and waiting on
# worlds, so more runs than cores keep the cores busy.
GALLERY_JOBS = default_workers() + 1
# Bugs in one run at most: each run costs about 6 s of CPU before its first case (pytest, torch in the run and its
# fork server), which sharing saves; more bugs per run would leave too few runs to spread over the workers.
BUGS_PER_RUN = 8


def gallery() -> list[str]:
    """The bugs, by module: those the registry declares (test_gallery checks that every bug module has a record)."""
    return sorted(RECORDS)


def bug_modules() -> list[str]:
    """The modules of tests/seeded/ that plant a bug: all but the helpers (NOT_BUGS, and *_base shared by several)."""
    return sorted(m.name for m in pkgutil.iter_modules([SEEDED_DIR])
                  if m.name not in NOT_BUGS and not m.name.endswith("_base"))


def run_suite(tmp_path, plugin: str, backend: str, *extra: str, timeout: float,
              suites: tuple[str, ...] = ("suites/",)) -> tuple[dict, str]:
    """Run the conformance suite in a subprocess; return (conformance.json, output tail)."""
    document, tail, why = _run_suite(tmp_path, plugin, backend, *extra, timeout=timeout, suites=suites)
    if document is None:
        pytest.fail(f"{why}; output tail:\n{tail}")
    return document, tail


def _run_suite(tmp_path, plugin: str, backend: str, *extra: str, timeout: float,
               suites: tuple[str, ...]) -> tuple[dict | None, str, str]:
    """(conformance.json, output tail, '') of a run; (None, tail, why) when it wrote no report."""
    report_dir = tmp_path / "report"
    cmd = [sys.executable, "-m", "pytest", *suites, "--backend-plugin", plugin, "--backend", backend,
           "--world-size", "2", "-q", "-p", "no:cacheprovider", "--report-dir", str(report_dir), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    log_path = tmp_path / "pytest.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = warm.popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run we started and its rank processes
            proc.wait()
            pytest.fail(f"`{' '.join(cmd)}` did not finish within {timeout} s (a hang the harness "
                        f"deadline should have caught); output tail:\n{_tail(log_path)}")
    elapsed = time.monotonic() - started
    path = report_dir / "conformance.json"
    if not path.exists():
        return None, _tail(log_path), f"`{' '.join(cmd)}` exited {proc.returncode} after {elapsed:.0f} s without writing {path}"
    with open(path) as fh:
        return json.load(fh), _tail(log_path), ""


def _tail(path, lines: int = 40) -> str:
    with open(path, errors="replace") as fh:
        return "\n".join(fh.read().splitlines()[-lines:])


def cases_with(document: dict, *outcomes: str) -> list[dict]:
    return [case for case in document["cases"] if case["outcome"] in outcomes]


def _sometimes_seen_deviation(a: dict, b: dict) -> bool:
    """One run passed, the other xfailed on a known deviation that shows only in some runs.

    An agent's intermittent gaps (backends/rpc_agents.py, e.g. TensorPipe's
    lost remote events under concurrent profiled calls) depend on timing, not
    on the c10d backend (TensorPipe does not use it), and gloo's own (e.g. its
    merge_remote_group losing a connection) show in the wrapper's run or in
    plain gloo's by chance: two runs of the same case may see it once, and
    that says nothing about the wrapper.
    """
    from backends.builtin import BUILTIN_SPECS
    from backends.rpc_agents import AGENTS

    if {a["outcome"], b["outcome"]} != {"passed", "xfailed"}:
        return False
    xfailed = a if a["outcome"] == "xfailed" else b
    gaps = [gap for agent in AGENTS.values() for gap in agent.gaps] + list(BUILTIN_SPECS["gloo"].gaps)
    reasons = [gap.reason for gap in gaps if gap.outcome == "intermittent"]
    return any(reason in xfailed.get("reason", "") for reason in reasons)


def describe(cases: list[dict]) -> str:
    return "\n".join(f"  {c['nodeid']} [{c['outcome']}]: {(c.get('error') or '').splitlines()[:1]}"
                     for c in cases)


RECORDS = {bug.name: bug for bug in BUGS}


def read_bug(module: str) -> SeededBug:
    """The declared record of the bug in tests/seeded/<module>.py (tests/seeded/registry.py)."""
    try:
        return RECORDS[module]
    except KeyError:
        raise KeyError(f"tests/seeded/{module}.py has no SeededBug in tests/seeded/registry.py") from None


def batches(modules: list[str]) -> list[tuple[str, ...]]:
    """Runs of bugs: those that share a run and need the same run options (and torch) together, BUGS_PER_RUN at most;
    the rest alone.

    Hanging bugs share runs with hanging bugs only (their runs get the short
    harness deadline). A run's bugs are kept in the order of their suites, so
    a run covers few areas.
    """
    groups: dict[tuple, list[SeededBug]] = {}
    for module in modules:
        bug = read_bug(module)
        key = (bug.options, bug.hangs, bug.torch) if bug.shares_a_run else ("alone", module)
        groups.setdefault(key, []).append(bug)
    runs = []
    for bugs in groups.values():
        bugs.sort(key=lambda bug: (bug.suite, bug.name))
        count = -(-len(bugs) // BUGS_PER_RUN)  # as many runs as needed, as even as can be
        runs += [tuple(bug.name for bug in bugs[i::count]) for i in range(count)]
    return runs


def suites_of(bugs: list[SeededBug]) -> tuple[str, ...]:
    """The paths a run collects: every bug's suite, less those inside another's (pytest would collect them twice)."""
    def file_of(suite: str) -> str:
        return suite.split("::", 1)[0]

    paths = sorted({bug.suite for bug in bugs})
    return tuple(path for path in paths if not any(
        other != path and ((other.endswith("/") and path.startswith(other)) or ("::" in path and file_of(path) == other))
        for other in paths))


def run_batch(tmp_path, modules: tuple[str, ...]) -> tuple[dict, str, list[FailedCase]]:
    return run_bugs(tmp_path, tuple(read_bug(module) for module in modules))


# A build under CI's load: the compile of one extension took 2-4 min beside the tests, longer beside other runs.
BUILD_TIMEOUT_S = 900


def finish_builds(bugs: tuple[SeededBug, ...]) -> None:
    """Build (or wait, on the build's file lock, for .ci/run's background build of) every extension these bugs load,
    before their run's clock starts: BUG_TIMEOUT_S bounds a run's cases, and a fresh CI machine's compile counted in
    it made the batch with a native bug time out at 300 s (under load; 214 s idle, most of it the wait)."""
    for build in sorted({build for bug in bugs for build in bug.build_modules}):
        if importlib.import_module(build).finished():
            continue  # nothing to build or wait for (a fresh interpreter to ask would cost 2 s of CPU)
        proc = subprocess.run([sys.executable, "-c", f"import {build} as build; build.load()"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:  # the run itself then fails to load it and says why; keep the compiler's words here
            print(f"{build}: the build failed:\n{proc.stderr[-2000:]}")


def run_bugs(tmp_path, bugs: tuple[SeededBug, ...]) -> tuple[dict, str, list[FailedCase]]:
    """Run the suite areas that should catch these bugs, each planted in its own backend, in one pytest.

    tests/gallery_plugin.py gives each backend only its bug's cases (its
    suite and keyword) and stops it at its first failure, as a run of that bug
    alone with -x would, and records where each failure came from. A run that
    writes no report is asked why: a bug module that fails to import is that
    bug's crash.
    """
    plan = {bug.backend: {"suite": bug.suite, "keyword": bug.keyword, "clauses": list(bug.clauses)} for bug in bugs}
    (tmp_path / "plan.json").write_text(json.dumps(plan, indent=1))
    extra = ["-p", "tests.gallery_plugin", "--gallery-plan", str(tmp_path / "plan.json"),
             "--gallery-failures", str(tmp_path / "failures.json"), *bugs[0].options]
    if bugs[0].hangs:
        extra += ["--deadline", str(HANG_DEADLINE_S)]
    for bug in bugs[1:]:
        extra += ["--backend-plugin", bug.module]
    finish_builds(bugs)  # before the run's clock starts
    document, tail, why = _run_suite(tmp_path, bugs[0].module, ",".join(bug.backend for bug in bugs), *extra,
                                     timeout=BUG_TIMEOUT_S, suites=suites_of(bugs))
    if document is None:
        crashes = [crash for crash in map(import_crash, bugs) if crash is not None]
        if not crashes:
            pytest.fail(f"{why}; output tail:\n{tail}")
        return {"cases": []}, tail, crashes
    return document, tail, read_failures(str(tmp_path / "failures.json"))


def import_crash(bug: SeededBug) -> FailedCase | None:
    """The bug module's failure to import, in a fresh interpreter as a run would import it (None: it imports)."""
    proc = subprocess.run([sys.executable, "-c", f"import {bug.module}"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=BUG_TIMEOUT_S)
    if proc.returncode == 0:
        return None
    return FailedCase(bug.module, bug.backend, "import", chain_from_text(proc.stderr))


BATCHES = batches(gallery())


@pytest.fixture(scope="module")
def gallery_runs(request, tmp_path_factory):
    """batch -> the Future of its run; every selected batch starts on first use, GALLERY_JOBS at a time."""
    selected = [item.callspec.params["modules"] for item in request.session.items
                if item.originalname == "test_seeded_bugs_are_caught" and hasattr(item, "callspec")]
    if hasattr(request.config, "workerinput"):  # xdist runs the tests concurrently; prefetch nothing
        yield {}
        return
    with ThreadPoolExecutor(max_workers=GALLERY_JOBS, thread_name_prefix="seeded") as pool:
        runs: dict[tuple, Future] = {modules: pool.submit(run_batch, tmp_path_factory.mktemp(modules[0]), modules)
                                     for modules in selected if not cannot_run_here(modules)}
        try:
            yield runs
        finally:
            for run in runs.values():
                run.cancel()


def verdict(module: str, document: dict, tail: str, failures: list[FailedCase]) -> str:
    """'' when ``module``'s bug was caught by a clause its record names, else what went wrong (tests/gallery_verdict.py)."""
    judged = judge(read_bug(module), document["cases"], failures)
    print(f"{module}: {judged.kind}: {judged.detail}")  # visible with -rA / -v: which clause caught the bug
    return "" if judged.ok else f"{judged.text()}\n{tail}"


def missing_gpu(modules: tuple[str, ...]) -> str:
    """Why ``modules`` cannot run here ('' when they can): a bug whose clause needs a CUDA GPU, on a machine without."""
    from fixtures.devices import device_count

    needing = [m for m in modules if read_bug(m).needs_cuda]
    if needing and device_count("cuda") == 0:
        return (f"{', '.join(needing)} needs a CUDA GPU (its clause moves CUDA tensors) and this machine has none: "
                f"on a GPU machine, pytest tests/test_seeded_bugs.py -k {needing[0]}")
    return ""


def wrong_torch(modules: tuple[str, ...]) -> str:
    """Why ``modules`` cannot be judged on this torch ('' when they can): their clauses skip on it."""
    import torch

    other = [m for m in modules if not read_bug(m).runs_on(torch.__version__)]
    if other:
        return (f"{', '.join(other)} needs torch {read_bug(other[0]).torch} (its clauses skip on torch "
                f"{torch.__version__}): ~/.cache/distconform/tox/torch2141/bin/python -m pytest "
                f"tests/test_seeded_bugs.py -k {other[0]}")
    return ""


def cannot_run_here(modules: tuple[str, ...]) -> str:
    return missing_gpu(modules) or wrong_torch(modules)


@pytest.mark.starts_first(1)  # after the control: each run is 10 to 60 s under CI's load
@pytest.mark.parametrize("modules", BATCHES, ids=["+".join(b) for b in BATCHES])
def test_seeded_bugs_are_caught(tmp_path, modules, gallery_runs):
    why = cannot_run_here(modules)
    if why:
        pytest.skip(why)
    run = gallery_runs.get(modules)
    document, tail, failures = run.result() if run is not None else run_batch(tmp_path, modules)
    problems = [text for text in (verdict(module, document, tail, failures) for module in modules) if text]
    assert not problems, "\n\n".join(problems)


def agents_over_the_backend() -> list[str]:
    """The default RPC agents whose messages travel over the c10d backend: the only ones a wrapper can change.

    The others (TensorPipe, reference-tp) never touch the backend under test,
    so running them on both backends compares an agent with itself.
    """
    from backends.rpc_agents import default_agents, get

    return [name for name in default_agents() if get(name).uses_backend]


def control_suites() -> tuple[str, ...]:
    """What the control runs: the suites of the bugs planted in the gloo wrapper, and of those no more.

    The control (the clean wrapper against plain gloo, case by case) is what
    lets a failure under a wrapper bug be read as that bug's, so it covers
    every suite such a bug runs (``wraps_gloo``), and nothing else: a bug
    planted in the reference or native backend runs on its own backend, which
    the wrapper's verdicts say nothing about. Of the RPC areas (a bug runs
    them with ``--rpc-agent``) only the files a wrapper bug runs on an agent
    whose messages cross the backend (agents_over_the_backend) stay: on
    TensorPipe or reference-tp the wrapper and gloo would compare an agent
    with itself. A suite inside another is left to the outer one.
    """
    wrapper_bugs = [bug for bug in map(read_bug, gallery()) if bug.wraps_gloo]
    over_the_backend = agents_over_the_backend()
    kept = [bug for bug in wrapper_bugs if "--rpc-agent" not in bug.options
            or any(agent in bug.options for agent in over_the_backend)]
    return suites_of(kept)


@pytest.mark.starts_first
def test_clean_wrapper_matches_plain_gloo(tmp_path):
    """The control: the unbroken wrapper and plain gloo fail nothing and agree case by case."""
    from tests.seeded.clean import DISTCONFORM_SPEC as wrapped
    from tests.seeded.gloo_wrapper import WRAPPER_GAPS

    document, tail = run_suite(tmp_path, "tests.seeded.clean", f"gloo,{wrapped.name}",
                               "-n", str(default_workers()), "--rpc-agent", ",".join(agents_over_the_backend()),
                               timeout=CONTROL_TIMEOUT_S, suites=control_suites())
    bad = cases_with(document, "failed", "error", "xpassed")
    assert not bad, f"control run has failures:\n{describe(bad)}\n{tail}"

    by_backend: dict[str, dict[str, dict]] = {"gloo": {}, wrapped.name: {}}
    for case in document["cases"]:
        key = case["nodeid"].replace(f"[{case['backend']}-", "[", 1)
        by_backend[case["backend"]][key] = case
    gloo, wrapper = by_backend["gloo"], by_backend[wrapped.name]
    assert gloo and set(gloo) == set(wrapper), "the two backends did not run the same cases"
    wrapper_reasons = tuple(gap.reason for gap in WRAPPER_GAPS)
    differ = [(key, gloo[key]["outcome"], wrapper[key]["outcome"]) for key in sorted(gloo)
              if gloo[key]["outcome"] != wrapper[key]["outcome"]
              and not wrapper[key].get("reason", "").endswith(wrapper_reasons)
              and not _sometimes_seen_deviation(gloo[key], wrapper[key])]
    assert not differ, "the clean wrapper differs from plain gloo:\n" + "\n".join(
        f"  {key}: gloo {a}, wrapped {b}" for key, a, b in differ)
