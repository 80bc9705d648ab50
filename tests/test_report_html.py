"""report.html: the report of a small real run, checked structurally (no browser) and in headless Chromium.

The browser test needs the Debian package ``chromium`` (``.ci/run`` installs it). Where it is
missing the test fails and says so: a report nobody has seen render is not tested.
"""

import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from reports.html_report import render
from reports.records import CaseRecord
from tests.harness_cases.procs import run_pytest

SUITES = ["suites/c10d/test_all_reduce.py", "suites/rpc/test_rrefs.py"]
PROBE_ENV = ("TORCH_DISTCONFORM_REPORT_PROBE", "visible-in-meta")
CHROMIUM_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(*PROBE_ENV)
        return run_pytest([*SUITES, "--world-size", "2", "--rpc-agent", "reference-tp", "-q",
                           "-k", "float32 or rref"], tmp_path_factory.mktemp("html"), timeout=300)


class Page(HTMLParser):
    """The parts of a page the structural checks look at."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: set = set()
        self.hrefs: list = []
        self.external: list = []  # anything that would be fetched: src=, <link>, url( in style
        self.rows: dict = {}  # class of a <tr> -> their texts
        self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if "href" in attrs:
            self.hrefs.append(attrs["href"])
        if "src" in attrs or tag == "link":
            self.external.append((tag, attrs))
        if tag == "tr":
            self._row = [attrs.get("class", ""), []]
            self.rows.setdefault(self._row[0], []).append(self._row[1])

    def handle_data(self, data):
        if self._row is not None:
            self._row[1].append(data)


def row_texts(page: Page, css_class_prefix: str) -> list[str]:
    return [" ".join("".join(parts).split()) for cls, rows in page.rows.items() if cls.startswith(css_class_prefix)
            for parts in rows]


# ------------------------------------------------------------------ no browser
def test_report_html_is_self_contained_and_every_link_resolves(run):
    assert run.returncode == 0, run.output
    text = run.read("report.html")
    page = Page(text)
    assert page.external == [], "report.html must not fetch anything"
    assert not re.search(r"https?://|@import|url\(", text.split("<section id=\"cases\">")[0].split("</style>")[0])
    fragments = [h[1:] for h in page.hrefs if h.startswith("#")]
    assert fragments and set(fragments) <= page.ids, set(fragments) - page.ids
    assert all(h.startswith("#") for h in page.hrefs), [h for h in page.hrefs if not h.startswith("#")]


def test_report_html_has_matrix_contract_and_every_case(run):
    report = run.report()
    page = Page(run.read("report.html"))
    cases = report["cases"]
    # the matrix: one row per target, one column per area, counts per outcome
    matrix = re.search(r'<table class="matrix">(.*?)</table>', run.read("report.html"), re.S).group(1)
    assert "gloo · rpc reference-tp" in matrix and ">c10d<" in matrix and ">rpc<" in matrix
    c10d = [c for c in cases if c["area"] == "c10d"]
    assert f"{sum(c['outcome'] == 'passed' for c in c10d)} passed" in matrix
    # the contract view: every clause of the run is a row
    clause_rows = row_texts(page, "clause ")
    for clause in {c["clause"] for c in cases}:
        assert any(clause in row for row in clause_rows), clause
    xfailed = [c for c in cases if c["outcome"] == "xfailed"]
    assert xfailed and any("xfailed" in cls for cls in page.rows if cls.startswith("clause "))
    # every case is listed once, with its node id
    case_rows = row_texts(page, "case")
    assert len(case_rows) == len(cases)
    assert all(any(c["nodeid"] in row for row in case_rows) for c in cases)


def test_run_facts_are_in_the_report_and_in_conformance_json(run):
    meta = run.report()["meta"]
    import torch

    assert meta["torch_version"] == torch.__version__.split("+")[0] or meta["torch_version"] == torch.__version__
    assert meta["env"][PROBE_ENV[0]] == PROBE_ENV[1]
    assert meta["host"]["name"] and meta["host"]["cpus"] and meta["python"] and meta["debug_level"]
    assert meta["packages"]["pytest"] and meta["packages"]["jinja2"]
    assert meta["rpc_agents"] == "reference-tp" and meta["exit_status"] == 0 and meta["wall_seconds"] > 0
    text = html.unescape(run.read("report.html"))
    for fact in (meta["torch_version"], f"{PROBE_ENV[0]}={PROBE_ENV[1]}", meta["host"]["name"], meta["debug_level"]):
        assert fact in text, fact


def test_backend_text_is_escaped_and_parity_tables_render(tmp_path):
    evil = "<script>alert(1)</script>"
    records = [CaseRecord("suites/profiling/test_parity.py::t[gloo-ws2-reference-tp-w-sync]", "profiling",
                          "A profiled RPC's events are exactly TensorPipe's.", "gloo", 2, "failed", rpc_agent="reference-tp",
                          cause=f"AssertionError: {evil}", error=f"AssertionError: {evil}", findings=[evil])]
    (tmp_path / "profiling").mkdir()
    rows = [{"target": "gloo-ws2", "agent": "reference-tp", "workload": "w", "mode": "sync", "match": False,
             "baseline_samples": 3, "differences": ["missing rpc_sync#w(0 -> 1) x1"], "known_deviation": ""},
            {"target": "gloo-ws2", "agent": "reference-tp", "workload": "w", "mode": "async", "match": True,
             "baseline_samples": 3, "differences": [], "known_deviation": ""}]
    (tmp_path / "profiling" / "parity.json").write_text(json.dumps(rows))
    (tmp_path / "profiling" / "trace_w_reference-tp_ws2.json").write_text("[]")
    text = render(records, {"backends": "gloo"}, out_dir=str(tmp_path), started=0.0)
    assert evil not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    section = text.split('<section id="profiling">')[1].split("</section>")[0]
    assert "reference-tp (gloo-ws2)" in section and 'class="passed">match' in section
    assert "missing rpc_sync#w(0 -&gt; 1) x1" in section
    assert 'href="profiling/trace_w_reference-tp_ws2.json"' in section


# -------------------------------------------------------------------- browser
PROBE = """
<script>
window.addEventListener("load", function () {
  function seen(el) {
    if (!el) return {found: false};
    el.scrollIntoView({block: "center"});
    var r = el.getBoundingClientRect();
    var hit = document.elementFromPoint(r.left + Math.min(r.width / 2, 30), r.top + Math.min(r.height / 2, 8));
    return {found: true, visible: el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}),
            width: r.width, height: r.height, hit: !!hit && el.contains(hit),
            background: getComputedStyle(el).backgroundColor, text: el.innerText.slice(0, 400)};
  }
  var out = {matrix: seen(document.querySelector("table.matrix"))};
  out.cells = Array.prototype.map.call(document.querySelectorAll("table.matrix td.cell"), function (td) {
    return {cls: td.className, background: getComputedStyle(td).backgroundColor, text: td.innerText}; });
  var row = Array.prototype.find.call(document.querySelectorAll("tr.clause"),
                                      function (tr) { return tr.innerText.indexOf(CLAUSE) >= 0; });
  out.clause = seen(row);
  var box = document.getElementById("only-problems");
  box.click();  // "only clauses with something other than a pass": the all-passed clause row folds away
  out.clauseFiltered = !row.checkVisibility();
  out.problemRowShown = Array.prototype.some.call(document.querySelectorAll("tr.clause:not(.passed)"),
                                                  function (tr) { return tr.checkVisibility(); });
  box.click();
  var link = document.querySelector("table.matrix td.cell a");
  out.href = link.getAttribute("href");
  var target = document.getElementById(out.href.slice(1));
  out.caseHiddenBefore = !target.querySelector("tr.case").checkVisibility();
  link.click();
  setTimeout(function () {
    out.caseAfterClick = seen(target.querySelector("tr.case"));
    var pre = document.createElement("pre");
    pre.id = "probe";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }, 300);
});
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is not installed, so report.html cannot be checked in a browser: install the "
                "Debian package `chromium` (apt-get update && apt-get install -y chromium; .ci/run does this)")


def test_report_html_renders_in_headless_chromium(run, tmp_path):
    browser = chromium()
    cases = run.report()["cases"]
    clause = next(c["clause"] for c in cases if c["nodeid"].split("::")[1].startswith("test_all_reduce["))
    page = tmp_path / "report.html"
    page.write_text(run.read("report.html").replace("</body>", PROBE.replace("CLAUSE", json.dumps(clause)) + "</body>"))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900", "--virtual-time-budget=5000",
           "--dump-dom", page.as_uri()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"headless Chromium did not render report.html within {CHROMIUM_TIMEOUT_S} s: {cmd}")
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the probe did not run (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    out = json.loads(html.unescape(found.group(1)))

    matrix = out["matrix"]
    assert matrix["found"] and matrix["visible"] and matrix["hit"], matrix
    assert matrix["width"] > 100 and matrix["height"] > 40, matrix
    assert "gloo · rpc reference-tp" in matrix["text"] and "c10d" in matrix["text"], matrix
    colours = {cell["cls"].split()[-1]: cell["background"] for cell in out["cells"] if "none" not in cell["cls"]}
    assert "passed" in colours or "xfailed" in colours, out["cells"]
    assert len(set(colours.values())) == len(colours), f"outcomes must be told apart by colour: {colours}"
    assert all(bg not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)") for bg in colours.values()), colours

    row = out["clause"]
    assert row["found"] and row["visible"] and row["hit"] and row["height"] > 10, row
    assert clause in row["text"] and "passed" in row["text"], row

    assert out["clauseFiltered"] and out["problemRowShown"], out  # the filter hides passes, keeps the rest

    # a matrix cell is a link to its cases: folded until followed, visible after a click
    assert out["caseHiddenBefore"], out
    assert out["caseAfterClick"]["visible"] and out["caseAfterClick"]["hit"], out["caseAfterClick"]


def test_stability_section_folds_repeats_with_counts_and_links_every_run(tmp_path):
    from tests.harness_cases.synthetic import FLAKY_CAUSE, flaky_all_gather, large_run

    records = flaky_all_gather(20)
    text = render(records, {"backends": "gloo", "repeat": 20}, out_dir=str(tmp_path), started=0.0)
    section = text[text.index('<section id="stability">'):]
    section = section[: section.index("</section>")]
    assert "fails 1 of 20 times on gloo at world size 3" in section and "1 of 20" in section
    assert html.escape(FLAKY_CAUSE, quote=True) in section or FLAKY_CAUSE in section
    assert section.count('class="n passed"') >= 19 and section.count('class="n failed"') >= 1
    assert '<a href="#stability">stability</a>' in text
    # the contract view folds the 20 runs into one clause row, with their counts
    assert "19 passed" in text and "1 failed" in text
    # a large run renders, and every unstable clause is on the page (summary.md shows only the worst few)
    big = render(large_run(60), {"backends": "gloo", "repeat": 3}, out_dir=str(tmp_path), started=0.0)
    assert all(f"unstable clause {i} " in big for i in range(60))
