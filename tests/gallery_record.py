"""A seeded bug, declared: what the gallery runs for it and which clauses must catch it.

Every bug of tests/seeded/ has one ``SeededBug`` in tests/seeded/registry.py.
The gallery reads the records, never a bug module: importing one plants its
bug in the importing process, and the gallery shares its process with the
project's other tests. A record is checked when it is made, so a mistyped
one fails at import with its bug named, not as a puzzling run.
"""

from __future__ import annotations

from dataclasses import dataclass

# What ``options`` may hold: options of the whole pytest run. Bugs share a run only when theirs are equal.
RUN_OPTIONS = ("--rpc-agent", "--world-size", "--debug-level", "--faults")
# What ``needs`` may hold: a capability the machine must have, else the gallery skips the bug saying so.
NEEDS = ("cuda",)
# What ``builds`` may hold: the C++ extensions a bug's module plants into, each with the module that builds it (the
# gallery finishes those builds before a run's clock starts: a compile under CI's load takes minutes).
CPP_BUILDS = {"native": "native.build", "dcdev": "native.device.build"}


def clause_matches(pattern: str, nodeid: str) -> bool:
    """Whether case ``nodeid`` runs clause ``pattern`` (a node id without parameters): the clause with any parameters;
    a pattern that is a file or folder matches each clause in it."""
    if pattern.endswith("/"):
        return nodeid.startswith(pattern)
    return nodeid == pattern or nodeid.startswith((pattern + "[", pattern + "::"))


@dataclass(frozen=True)
class SeededBug:
    """One seeded bug. ``name`` is its module (tests/seeded/<name>.py) and the backend it registers.

    - ``contract``: the promise the bug breaks, in one line (shown when it is not caught);
    - ``clauses``: the clauses, as node ids without parameters (``suites/c10d/test_x.py::test_y``),
      whose own check must fail on it: a failure anywhere else is not a catch (a file or folder
      instead of a node id accepts any clause in it: only for a bug no run has shown failing yet);
    - ``suite``: the folder, file or clause the run collects for it, and ``keyword`` a word its
      cases' names must contain ('' none): the run's selection, which holds the clauses;
    - ``options``: pytest options of the whole run (RUN_OPTIONS, flag and value pairs);
    - ``hangs``: its catching case hangs until the harness deadline, so its run has a short one;
    - ``needs``: capabilities the machine must have (NEEDS);
    - ``torch``: the torch releases its clauses run on, a PEP 440 specifier ('' every release): on another the
      gallery skips it saying so, since those clauses skip there too (run the gallery with such a torch's python,
      e.g. the torch2141 tox env's, to judge it);
    - ``wraps_gloo``: its backend is gloo behind tests/seeded/gloo_wrapper.py (directly, or through rpc_base,
      rpc_profiling_base or training_base): the clean wrapper's control run (tests/test_seeded_bugs.py) covers its
      suite, so that what fails under it is the bug, not the wrapping;
    - ``builds``: the C++ extensions (CPP_BUILDS) its module plants into: "native" through
      tests/seeded/native_base.py; "native" and "dcdev" through tests/seeded/dcdev_base.py (native's
      algorithm staged through the dcdev device loads both);
    - ``shares_a_run``: importing its module changes nothing another backend's ranks run (it
      registers its backend, and plants its bug with tests/seeded/planting.py if in shared code),
      so it may share a pytest run with other bugs; False keeps it alone.
    """

    name: str
    contract: str
    clauses: tuple[str, ...]
    suite: str
    shares_a_run: bool
    keyword: str = ""
    options: tuple[str, ...] = ()
    hangs: bool = False
    needs: tuple[str, ...] = ()
    torch: str = ""
    wraps_gloo: bool = False
    builds: tuple[str, ...] = ()
    package: str = "tests.seeded"  # where its module lives (the gallery's own tests plant from tests.harness_cases)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError(f"seeded bug {self.name!r} (tests/seeded/registry.py): {'; '.join(problems)}")

    def _problems(self):
        if not self.name.isidentifier():
            yield "its name must be its module's name"
        if not self.suite.startswith("suites/"):
            yield f"suite {self.suite!r} must be a path under suites/"
        if not self.clauses:
            yield "it names no clause that catches it"
        for clause in self.clauses:
            if not (clause.split("::")[0].endswith(".py") or clause.endswith("/")) or "[" in clause:
                yield (f"clause {clause!r} must be a node id without parameters (file.py::test_name), or a "
                       "file or folder (any clause in it, until a run names the one)")
            elif not self.collects(clause):
                yield f"clause {clause!r} is outside its suite {self.suite!r}: its run would never collect it"
        if self.keyword and not self.keyword.replace("_", "").isalnum():
            yield f"keyword {self.keyword!r} must be one word"
        flags = self.options[::2]
        if len(self.options) % 2 or any(flag not in RUN_OPTIONS for flag in flags):
            yield f"options {self.options!r} must be pairs of {', '.join(RUN_OPTIONS)} and a value"
        for need in self.needs:
            if need not in NEEDS:
                yield f"need {need!r} is none of {NEEDS}"
        for build in self.builds:
            if build not in CPP_BUILDS:
                yield f"build {build!r} is none of {tuple(CPP_BUILDS)}"
        if self.torch:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:
                SpecifierSet(self.torch)
            except InvalidSpecifier:
                yield f"torch {self.torch!r} is not a version specifier (e.g. '>=2.14')"

    @property
    def backend(self) -> str:
        return self.name  # the module registers its backend under its own name

    @property
    def module(self) -> str:
        return f"{self.package}.{self.name}"

    @property
    def path(self) -> str:
        """Its module's file, relative to the repository."""
        return self.module.replace(".", "/") + ".py"

    @property
    def build_modules(self) -> tuple[str, ...]:
        """The modules (native/build.py, native/device/build.py) that build the extensions its module plants into."""
        return tuple(CPP_BUILDS[build] for build in self.builds)

    @property
    def needs_cuda(self) -> bool:
        return "cuda" in self.needs

    def runs_on(self, torch_version: str) -> bool:
        """Whether its clauses run on this torch release (its public part: 2.14.1+cu130 is 2.14.1)."""
        if not self.torch:
            return True
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return SpecifierSet(self.torch).contains(Version(torch_version).public, prereleases=True)

    def selects(self, nodeid: str) -> bool:
        """Whether the bug's run collects ``nodeid`` (without its -k keyword: that matches a case's name)."""
        if self.suite.endswith("/"):
            return nodeid.startswith(self.suite)
        if "::" in self.suite:
            return clause_matches(self.suite, nodeid)
        return nodeid.startswith(self.suite + "::")

    def collects(self, clause: str) -> bool:
        """Whether the bug's run collects the cases of ``clause`` (a node id without parameters, a file or a folder)."""
        return self.selects(clause if "::" in clause or clause.endswith("/") else clause + "::")

    def caught_by(self, nodeid: str) -> bool:
        """Whether ``nodeid`` is a case of one of the clauses that must catch the bug."""
        return any(clause_matches(clause, nodeid) for clause in self.clauses)
