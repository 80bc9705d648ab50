"""The Faults section: figures recorded by fault scenarios, decoded strictly, one per operation, in both reports."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reports import html_report
from reports.fault_figures import BadFigure, decode, encode, fault_figures
from reports.markdown import render
from reports.records import CaseRecord

SUMMARY_BAR = 12 * 1024


def figure(fault="partition", target="gloo", ws=2, op="all_reduce", seconds=(2.01, 2.02), ok=False):
    return encode(fault, target, ws, op, 2.0,
                  [{"rank": r, "seconds": s, "ok": ok, "error": f"Timed out waiting 2000ms (rank {r})"}
                   for r, s in enumerate(seconds)])


def record(nodeid, *figures):
    return CaseRecord(nodeid, "faults", "a clause", "gloo", 2, "passed", fault_figures=list(figures))


def test_one_figure_per_operation_slowest_detection_first():
    records = [record("a[1]", figure()), record("a[2]", figure()),  # two clauses read one scenario
               record("b[1]", figure(fault="refused", seconds=(0.01, 0.0))),
               record("c[1]", figure(fault="slow", ok=True, seconds=(0.3, 0.3)))]
    figures, problems = fault_figures(records)
    assert problems == []
    assert [(f.fault, f.outcome, f.detect_s, f.ratio) for f in figures] == [
        ("partition", "all 2 raised", 2.02, 1.01), ("refused", "all 2 raised", 0.01, 0.005),
        ("slow", "all 2 ok", None, None)]


def test_the_summary_and_report_html_show_the_faults():
    records = [record("a[1]", figure()), record("b[1]", figure(fault="slow", ok=True))]
    text = render(records, {})
    assert "## Faults: 2 operations under a fault, the slowest to detect it first" in text
    assert "| partition | gloo | 2 | all_reduce | all 2 raised | 2.02 s | 1.01 | Timed out waiting 2000ms (rank 0) |" in text
    html = html_report.render(records, {})
    assert 'id="faults"' in html and "rank 1: 2.02 s, Timed out waiting 2000ms (rank 1)" in html


def test_a_malformed_figure_is_named_in_the_report_not_fatal():
    bad = record("x[1]", {"fault": "partition", "ranks": "none"})
    figures, problems = fault_figures([bad, record("a[1]", figure())])
    assert len(figures) == 1 and problems == ["x[1]: fault_figure: 'ranks' must be list, got 'none'"]
    assert "- unreadable figure: x[1]: fault_figure: 'ranks' must be list" in render([bad], {})


def test_the_summary_stays_under_its_bar_with_many_figures():
    records = [record(f"a[{i}]", figure(fault=f"fault{i % 10}", target=f"backend{i % 7}", ws=2 + i % 3,
                                        op=f"op{i}", seconds=(2.0 + i / 100, 1.0)))
               for i in range(400)]
    text = render(records, {})
    assert len(text.encode()) < SUMMARY_BAR
    assert "… and 392 more operations under a fault: report.html" in text


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                        ["fault", "target", "world_size", "operation", "timeout_s", "ranks", "rank", "seconds", "ok",
                         "error"]), inner, max_size=8), max_leaves=20))
def test_decoding_anything_gives_a_figure_or_bad_figure(data):
    try:
        decoded = decode(data)
    except BadFigure as exc:
        assert str(exc).startswith("fault_figure")
    else:
        assert isinstance(decoded.ranks, tuple)


def test_encode_refuses_what_it_could_not_read_back():
    with pytest.raises(BadFigure, match="'world_size' must be int"):
        encode("partition", "gloo", "2", "all_reduce", 2.0, [])
