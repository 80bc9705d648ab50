"""python -m reports.diff: per clause and target what changed between two runs; exit 1 on a regression."""

import subprocess
import sys

from reports.diff import classify, compare, render_markdown
from reports.json_report import write_json
from reports.records import CaseRecord
from tests.harness_cases.procs import REPO_ROOT


def rec(name, outcome, *, reason="", cause="", duration=0.01, clause="clause a", ws=2):
    return CaseRecord(f"suites/c10d/test_x.py::test_x[vendor-ws{ws}-{name}]", "c10d", clause, "vendor", ws, outcome,
                      duration=duration, reason=reason, cause=cause, error=cause)


OLD = [rec("keeps", "passed"), rec("breaks", "passed"), rec("heals", "failed", cause="RuntimeError: boom"),
       rec("gap-new", "passed"), rec("gap-gone", "xfailed", reason="vendor: no avg"),
       rec("gap-removed", "xfailed", reason="vendor: no avg"), rec("unskip", "skipped", reason="needs 2 GPUs"),
       rec("slow", "passed", duration=0.2), rec("dropped", "passed")]
NEW = [rec("keeps", "passed"), rec("breaks", "failed", cause="RuntimeError: size 3 vs 4 (ranks 0, 1)"),
       rec("heals", "passed"), rec("gap-new", "xfailed", reason="vendor: no avg"),
       rec("gap-gone", "xpassed", reason="vendor: no avg"), rec("gap-removed", "passed"), rec("unskip", "passed"),
       rec("slow", "passed", duration=0.9), rec("added", "passed")]


def kinds(cmp):
    return {c.record.nodeid.split("-", 2)[-1].rstrip("]"): c.kind for c in cmp.changes}


def test_every_kind_of_change_is_classified():
    cmp = compare(OLD, NEW, {}, {})
    assert kinds(cmp) == {"breaks": "newly_failing", "heals": "fixed", "gap-new": "gap_appeared",
                          "gap-gone": "gap_closed", "gap-removed": "gap_closed", "unskip": "skip_changed",
                          "dropped": "removed", "added": "added"}
    assert cmp.unchanged == 2 and [s.new.nodeid.endswith("slow]") for s in cmp.slowdowns] == [True]
    assert cmp.regressed() and cmp.regressed(gate_durations=True)
    assert classify(rec("a", "failed", cause="X: 1"), rec("a", "error", cause="X: 2")) is None  # same cause
    assert classify(rec("a", "failed", cause="X: 1"), rec("a", "failed", cause="Y: 1")) == "cause_changed"
    assert classify(None, rec("a", "failed")) == "newly_failing"


def test_only_regressions_gate_and_durations_only_when_asked():
    fine_old = [rec("a", "failed", cause="X"), rec("slow", "passed", duration=0.2)]
    fine_new = [rec("a", "passed"), rec("slow", "passed", duration=0.9)]
    cmp = compare(fine_old, fine_new, {}, {})
    assert not cmp.regressed() and cmp.regressed(gate_durations=True)
    quick = compare([rec("s", "passed", duration=0.01)], [rec("s", "passed", duration=0.05)], {}, {})
    assert quick.slowdowns == []  # under --min-seconds: noise, not a regression


def test_markdown_groups_by_clause_and_target_and_shows_fact_changes():
    cmp = compare(OLD, NEW, {"torch_version": "2.12.0", "env": {"GLOO_SOCKET_IFNAME": "lo"}},
                  {"torch_version": "2.13.0", "env": {}})
    text = render_markdown(cmp, old_name="old", new_name="new")
    assert text.startswith("# distconform: new vs old: REGRESSED")
    assert "| torch_version | 2.12.0 | 2.13.0 |" in text and "| env.GLOO_SOCKET_IFNAME | lo | (unset) |" in text
    assert "## Newly failing: 1" in text and "- **c10d** · clause a · vendor ws2: 1 case" in text
    assert "  - `[vendor-ws2-breaks]` passed → failed: RuntimeError: size 3 vs 4 (ranks 0, 1)" in text
    assert "`[vendor-ws2-gap-gone]` xfailed → xpassed (gap was: vendor: no avg)" in text
    assert "`[vendor-ws2-unskip]` skipped (needs 2 GPUs) → passed" in text


def run_diff(*args):
    return subprocess.run([sys.executable, "-m", "reports.diff", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_exit_status_and_html(tmp_path):
    (tmp_path / "old").mkdir()
    write_json(str(tmp_path / "old" / "conformance.json"), OLD, {"torch_version": "2.13.0"})
    write_json(str(tmp_path / "new.json"), NEW, {"torch_version": "2.13.0"})
    write_json(str(tmp_path / "same.json"), OLD, {"torch_version": "2.13.0"})
    regressed = run_diff(tmp_path / "old", tmp_path / "new.json", "--html", tmp_path / "diff.html")
    assert regressed.returncode == 1, regressed.stderr
    assert "## Newly failing: 1" in regressed.stdout
    page = (tmp_path / "diff.html").read_text()
    assert "regressed" in page and "[vendor-ws2-breaks]" in page and "http" not in page
    same = run_diff(tmp_path / "old", tmp_path / "same.json")
    assert same.returncode == 0 and "no regression" in same.stdout, same.stdout + same.stderr
    (tmp_path / "junk.json").write_text("{not json")
    bad = run_diff(tmp_path / "junk.json", tmp_path / "same.json")
    assert bad.returncode == 2 and "not a readable conformance.json" in bad.stderr, bad.stderr
    missing = run_diff(tmp_path / "nowhere", tmp_path / "same.json")
    assert missing.returncode == 2 and "no conformance.json there" in missing.stderr


# ------------------------------------------------------------------- fuzzing
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from reports.json_report import read_json  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
META = st.dictionaries(st.sampled_from(["host", "env", "packages", "plugin_packages", "plugins", "backends",
                                         "torch_version", "exit_status"]), JSON, max_size=5)
CASE = st.fixed_dictionaries({"nodeid": st.text(min_size=1, max_size=20)},
                             optional={name: JSON for name in ("outcome", "world_size", "duration", "findings",
                                                                "error", "clause", "area")})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(JSON, st.fixed_dictionaries({"cases": st.lists(CASE | JSON, max_size=3)},
                                                      optional={"meta": META | JSON})))
def test_read_json_accepts_a_valid_file_or_names_the_problem(tmp_path, document):
    import json

    path = tmp_path / "conformance.json"
    path.write_text(json.dumps(document))
    try:
        records, meta = read_json(str(path))
    except ValueError as exc:
        assert str(exc).startswith(str(path)), exc
        return
    # whatever loads, the comparison and both renderers can use
    from reports.html_report import render as render_html
    from reports.markdown import render

    render(records, meta)
    render_html(records, meta)
    render_markdown(compare(records, records, meta, {}), old_name="a", new_name="b")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_read_json_of_arbitrary_bytes_never_tracebacks(tmp_path, raw):
    path = tmp_path / "conformance.json"
    path.write_bytes(raw)
    try:
        read_json(str(path))
    except ValueError:
        pass
