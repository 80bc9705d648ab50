"""The seeded-bug gallery: every contract earns its place by failing on a broken backend.

Each module of ``tests/seeded`` (besides the wrapper and the clean control)
registers gloo with one planted bug. For each, the suite area the module
names (``SUITE``) runs in a subprocess exactly as a user would run it::

    python -m pytest suites/c10d/test_barrier.py --backend-plugin tests.seeded.<module> --backend <module> --world-size 2

and at least one contract case must fail. ``-x`` stops at the first failure,
which keeps a bug's run short; the assertion message names the failing case.
A module may add pytest options (``EXTRA_ARGS``, e.g. the RPC agent to
run). Bugs that hang (``HANGS = True`` in the module) run with a 5 s harness
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

import ast
import functools
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from fixtures.workers import default_workers

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDED_DIR = os.path.join(REPO_ROOT, "tests", "seeded")
NOT_BUGS = {"__init__", "gloo_wrapper", "clean", "reference_base", "planting"}
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
    # helpers shared by several bugs end in "_base" (reference_base, ...)
    return sorted(m.name for m in pkgutil.iter_modules([SEEDED_DIR])
                  if m.name not in NOT_BUGS and not m.name.endswith("_base"))


def run_suite(tmp_path, plugin: str, backend: str, *extra: str, timeout: float,
              suites: tuple[str, ...] = ("suites/",)) -> tuple[dict, str]:
    """Run the conformance suite in a subprocess; return (conformance.json, output tail)."""
    report_dir = tmp_path / "report"
    cmd = [sys.executable, "-m", "pytest", *suites, "--backend-plugin", plugin, "--backend", backend,
           "--world-size", "2", "-q", "-p", "no:cacheprovider", "--report-dir", str(report_dir), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    log_path = tmp_path / "pytest.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
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
        pytest.fail(f"`{' '.join(cmd)}` exited {proc.returncode} after {elapsed:.0f} s without writing "
                    f"{path}; output tail:\n{_tail(log_path)}")
    with open(path) as fh:
        return json.load(fh), _tail(log_path)


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


# Seeded modules a bug may import from and still share a run: they define classes and register backends.
SHARABLE_BASES = ("tests.seeded.gloo_wrapper", "tests.seeded.reference_base")
# Calls a shared bug module may make at import: registering its backend, planting its bug for its own backend's ranks
# only (tests/seeded/planting.py, and the bases' helpers built on it), and making locks or random sources of its own.
REGISTERING = ("register", "register_reference", "register_native_bug", "plant", "plant_in", "plant_in_profiling",
               "spec")
OWN_STATE = ("threading.Lock", "threading.RLock", "threading.Event", "random.SystemRandom", "random.Random")
FACTS = ("SUITE", "EXTRA_ARGS", "HANGS", "CONTRACT", "NEEDS_CUDA")
# What a bug module's EXTRA_ARGS may hold: options of the whole run (bugs share a run only when theirs are equal)
# and -k, which narrows the bug's own cases (tests/gallery_plugin.py) and so never keeps bugs apart.
RUN_OPTIONS = ("--rpc-agent", "--world-size", "--debug-level")
KEYWORD = "-k"


@dataclass(frozen=True)
class Bug:
    """What the gallery needs of a seeded module, read from its source: never imported in this process.

    Importing a bug module plants its bug in the importing process (several
    patch the reference RPC agent or a DDP internal globally), and the
    project's other tests share this process, under pytest-xdist in any
    order. Every bug's backend is named after its module (``--backend <module>``).
    """

    module: str
    summary: str
    suite: str  # a folder, a file or a clause's node id
    options: tuple[str, ...]  # of the whole run (RUN_OPTIONS, from EXTRA_ARGS)
    keyword: str  # EXTRA_ARGS' -k: a word the names of the bug's cases contain ('' none)
    hangs: bool
    contract: str
    shares_a_run: bool
    needs_cuda: bool = False  # its clause moves CUDA tensors: the gallery skips it without a GPU, saying so


def split_extra_args(module: str, extra_args: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the run's options, the bug's -k keyword) from a module's EXTRA_ARGS; anything else is refused, named."""
    options: list[str] = []
    keyword = ""
    pairs = iter(extra_args)
    for flag in pairs:
        value = next(pairs, None)
        if value is None or flag not in (*RUN_OPTIONS, KEYWORD):
            raise ValueError(f"tests/seeded/{module}.py: EXTRA_ARGS {extra_args!r}: the gallery takes "
                             f"{', '.join(RUN_OPTIONS)} and {KEYWORD}, each with a value")
        if flag == KEYWORD:
            keyword = value
        else:
            options += [flag, value]
    return tuple(options), keyword


def _tree(module: str) -> ast.Module:
    with open(os.path.join(REPO_ROOT, *module.split(".")) + ".py") as fh:
        return ast.parse(fh.read())


def _constants(tree: ast.Module) -> dict:
    """Top-level names bound to constant expressions (over names imported from seeded bases)."""
    names: dict = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.seeded."):
            base = _constants(_tree(node.module))
            names.update({a.asname or a.name: base[a.name] for a in node.names if a.name in base})
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:  # constants, tuples of them, and sums of those with imported constants
                names[node.targets[0].id] = eval(compile(ast.Expression(node.value), "<seeded>", "eval"),
                                                 {"__builtins__": {}}, dict(names))
            except Exception:  # noqa: BLE001 - not a constant (a spec, a class): not a fact
                pass
    return names


def _dotted(node: ast.expr) -> str:
    """``threading.Lock`` for the expression threading.Lock ('' for anything but names and attributes)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _allowed_call(call: ast.Call) -> bool:
    """A registering, planting or own-state call, whose arguments call nothing but str methods (__doc__.strip())."""
    name = _dotted(call.func)
    if name not in REGISTERING and name not in OWN_STATE:
        return False
    inner = [n for arg in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(arg) if isinstance(n, ast.Call)]
    return all(isinstance(n.func, ast.Attribute) and n.func.attr in ("strip", "splitlines") for n in inner)


def shares_a_run(tree: ast.Module) -> bool:
    """Importing the module registers its own backend and changes nothing any other backend's ranks run.

    Every rank imports every --backend-plugin module of a run, so bugs can
    share a run only if none changes shared code for everyone: its top level
    holds only imports (of torch, the project, and seeded modules that share
    runs themselves), classes, functions, constants, locks or random sources
    of its own, and calls that register its backend or plant its bug for its
    own backend's ranks (tests/seeded/planting.py; REGISTERING). Anything else,
    an attribute assigned on a module or class above all, keeps it alone.
    Native bugs share: a rank plants its native bug when it creates its
    group, in its own process (native/__init__.py).
    """
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("tests.seeded") and module not in SHARABLE_BASES and not shares_a_run(_tree(module)):
                return False
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # plant(...) for its own backend
            if not _allowed_call(node.value):
                return False
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if not targets or not all(isinstance(t, ast.Name) for t in targets):
            return False
        if value is None:
            continue
        calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)]
        if calls and not (isinstance(value, ast.Call) and _allowed_call(value)):
            return False
    return True


@functools.cache  # batching, the control's paths, each run and each verdict ask again: parse each module once
def read_bug(module: str) -> Bug:
    tree = _tree(f"tests.seeded.{module}")
    facts = _constants(tree)
    options, keyword = split_extra_args(module, tuple(facts.get("EXTRA_ARGS", ())))
    return Bug(module, (ast.get_docstring(tree) or module).strip().splitlines()[0], facts["SUITE"],
               options, keyword, bool(facts.get("HANGS", False)),
               facts.get("CONTRACT", "(module names no contract)"), shares_a_run(tree),
               bool(facts.get("NEEDS_CUDA", False)))


def batches(modules: list[str]) -> list[tuple[str, ...]]:
    """Runs of bugs: those that share a run and need the same run options together, BUGS_PER_RUN at most; the rest alone.

    Hanging bugs share runs with hanging bugs only (their runs get the short
    harness deadline). A run's bugs are kept in the order of their suites, so
    a run covers few areas.
    """
    groups: dict[tuple, list[Bug]] = {}
    for module in modules:
        bug = read_bug(module)
        key = (bug.options, bug.hangs) if bug.shares_a_run else ("alone", module)
        groups.setdefault(key, []).append(bug)
    runs = []
    for bugs in groups.values():
        bugs.sort(key=lambda bug: (bug.suite, bug.module))
        count = -(-len(bugs) // BUGS_PER_RUN)  # as many runs as needed, as even as can be
        runs += [tuple(bug.module for bug in bugs[i::count]) for i in range(count)]
    return runs


def suites_of(bugs: list[Bug]) -> tuple[str, ...]:
    """The paths a run collects: every bug's suite, less those inside another's (pytest would collect them twice)."""
    def file_of(suite: str) -> str:
        return suite.split("::", 1)[0]

    paths = sorted({bug.suite for bug in bugs})
    return tuple(path for path in paths if not any(
        other != path and ((other.endswith("/") and path.startswith(other)) or ("::" in path and file_of(path) == other))
        for other in paths))


def run_batch(tmp_path, modules: tuple[str, ...]) -> tuple[dict, str]:
    """Run the suite areas that should catch these bugs, each planted in its own backend, in one pytest.

    tests/gallery_plugin.py gives each backend only its bug's cases (its
    SUITE and -k) and stops it at its first failure, as a run of that bug
    alone with -x would.
    """
    bugs = [read_bug(module) for module in modules]
    plan = {bug.module: {"suite": bug.suite, "keyword": bug.keyword} for bug in bugs}
    (tmp_path / "plan.json").write_text(json.dumps(plan, indent=1))
    extra = ["-p", "tests.gallery_plugin", "--gallery-plan", str(tmp_path / "plan.json"), *bugs[0].options]
    if bugs[0].hangs:
        extra += ["--deadline", str(HANG_DEADLINE_S)]
    for module in modules[1:]:
        extra += ["--backend-plugin", f"tests.seeded.{module}"]
    return run_suite(tmp_path, f"tests.seeded.{modules[0]}", ",".join(modules), *extra, timeout=BUG_TIMEOUT_S,
                     suites=suites_of(bugs))


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
                                     for modules in selected if not missing_gpu(modules)}
        try:
            yield runs
        finally:
            for run in runs.values():
                run.cancel()


def verdict(module: str, document: dict, tail: str) -> str:
    """'' when ``module``'s bug was caught cleanly in its backend's cases, else what went wrong."""
    bug = read_bug(module)
    mine = {**document, "cases": [c for c in document["cases"] if c["backend"] == module]}
    failed = cases_with(mine, "failed")
    if not failed:
        return (f"seeded bug {module!r} ({bug.summary}) was not caught: no contract case of backend {module} "
                f"failed ({len(mine['cases'])} cases). Expected to be caught by: {bug.contract}\n{tail}")
    # Visible with -rA / -v: which clause caught the bug.
    print(f"{module} caught by:\n{describe(failed)}")
    errors = cases_with(mine, "error")
    if errors:
        return (f"seeded bug {module!r}: set-up/teardown errors besides the failure(s), the bug "
                f"module may break the harness rather than a contract:\n{describe(errors)}")
    return ""


def missing_gpu(modules: tuple[str, ...]) -> str:
    """Why ``modules`` cannot run here ('' when they can): a bug whose clause needs a CUDA GPU, on a machine without."""
    from fixtures.devices import device_count

    needing = [m for m in modules if read_bug(m).needs_cuda]
    if needing and device_count("cuda") == 0:
        return (f"{', '.join(needing)} needs a CUDA GPU (its clause moves CUDA tensors) and this machine has none: "
                f"on a GPU machine, pytest tests/test_seeded_bugs.py -k {needing[0]}")
    return ""


@pytest.mark.starts_first(1)  # after the control: each run is 10 to 60 s under CI's load
@pytest.mark.parametrize("modules", BATCHES, ids=["+".join(b) for b in BATCHES])
def test_seeded_bugs_are_caught(tmp_path, modules, gallery_runs):
    why = missing_gpu(modules)
    if why:
        pytest.skip(why)
    run = gallery_runs.get(modules)
    document, tail = run.result() if run is not None else run_batch(tmp_path, modules)
    problems = [text for text in (verdict(module, document, tail) for module in modules) if text]
    assert not problems, "\n\n".join(problems)


def agents_over_the_backend() -> list[str]:
    """The default RPC agents whose messages travel over the c10d backend: the only ones a wrapper can change.

    The others (TensorPipe, reference-tp) never touch the backend under test,
    so running them on both backends compares an agent with itself.
    """
    from backends.rpc_agents import default_agents, get

    return [name for name in default_agents() if get(name).uses_backend]


def control_suites() -> tuple[str, ...]:
    """What the control runs: every area of suites/, but of the RPC areas only the files bugs run over the backend.

    An RPC area is one a bug runs with ``--rpc-agent``. Its cases compare the
    wrapper with gloo only on an agent whose messages cross the backend
    (agents_over_the_backend), and no verdict reads them unless a bug runs
    there on such an agent: those files stay (rpc/test_futures.py on
    reference-pg today), the rest of the RPC areas go (a quarter of the
    control's time).
    """
    bugs = [read_bug(module) for module in gallery()]
    over_the_backend = agents_over_the_backend()
    rpc_areas = {bug.suite.split("/")[1] for bug in bugs if "--rpc-agent" in bug.options}
    kept = sorted({bug.suite for bug in bugs if any(agent in bug.options for agent in over_the_backend)})
    areas = sorted(f"suites/{entry.name}/" for entry in os.scandir(os.path.join(REPO_ROOT, "suites"))
                   if entry.is_dir() and not entry.name.startswith(("_", ".")) and entry.name not in rpc_areas)
    return (*areas, *kept)


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
