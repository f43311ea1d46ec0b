"""``report --html`` and ``compare --html``: the real command in a subprocess on summaries written by real fits; the
page is parsed with html.parser and its figures checked against the text the same command prints and against the
summaries' raw figures; then rendered by a headless Chromium with networking disabled (skipped without one)."""

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from lightning_perf.summary.diagnosis import diagnosis_line
from summary_files import read, write_two_runs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Page(HTMLParser):
    """What a reader of the page sees: each table's rows of cell texts (by id), each element's text by id, the counts
    the histogram bars stand for, the links, and every tag and attribute (to prove nothing is fetched)."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tables, self.texts, self.counts, self.links, self.tags, self.attrs = {}, {}, {}, [], set(), []
        self._table, self._row, self._cell, self._ids, self._svg = None, None, None, [], None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.attrs += [(k, v or "") for k, v in attrs.items()]
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id") or f"table-{len(self.tables)}", [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "svg":
            self._svg = attrs.get("id")
        elif tag == "rect" and "data-count" in attrs:
            self.counts.setdefault(self._svg, []).append(int(attrs["data-count"]))
        elif tag == "a":
            self.links.append(attrs.get("href"))
        if "id" in attrs and tag != "table":
            self._ids.append((tag, attrs["id"], []))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        elif self._ids and self._ids[-1][0] == tag:
            _, key, parts = self._ids.pop()
            self.texts[key] = "".join(parts)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        for _, _, parts in self._ids:
            parts.append(data)


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def markdown_rows(text):
    """The cells of the markdown table a command printed (header first, the rule left out)."""
    lines = [line for line in text.split("\n\n", 1)[0].splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip()[1:-1].split(" | ")] for i, line in enumerate(lines) if i != 1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real fits with every callback; the candidate's file gets what other sections add (an energy block, a
    trace on a slow iteration, a memory snapshot) so the page is checked with them."""
    root = tmp_path_factory.mktemp("html")
    base, cand = write_two_runs(root)
    data = read(cand)
    data["vram"]["activity"]["energy"] = {"source": "energy counter", "min_span_s": 1.0, "readings": 40,
                                          "train_batches": 12, "phases": {"train": {
                                              "energy_j": 96.0, "seconds": 2.0, "mean_power_w": 48.0,
                                              "iterations": 12, "samples": 48, "j_per_iteration": 8.0,
                                              "j_per_sample": 2.0, "samples_per_j": 0.5}}, "unavailable": {}}
    data["iteration_timer"]["tail"]["slowest"][0]["trace_path"] = "traces/step5.json"
    data["vram"]["memory_snapshot"] = {"path": "/tmp/oom/snapshot.pickle",
                                       "top_allocations": [{"size_mb": 512.0, "frames": ["train.py:10 forward"]}]}
    with open(cand, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return {"base": base, "cand": cand, "root": root}


def test_report_html_shows_the_figures_the_text_report_prints(runs):
    page_path = os.path.join(runs["root"], "report.html")
    text = cli("report", runs["base"], runs["cand"], "--names", "base", "cand", "--html", page_path)
    with open(page_path, encoding="utf-8") as fh:
        page = Page(fh.read())
    # the phase table: the very cells `report` prints, the J/sample column included
    assert page.tables["phase-table"] == markdown_rows(text)
    header = page.tables["phase-table"][0]
    assert page.tables["phase-table"][2][header.index("J/sample")] == "2"
    for name in ("base", "cand"):
        raw = read(runs[name])
        # each run's sections, from the raw figures: ms per measured iteration and share
        profiler = raw["section_profiler"]
        expected = [["section", "kind", "ms/iter", "share"]] + [
            [sec, value["kind"], f"{1000.0 * value['total_s'] / profiler['iterations']:.2f}",
             f"{value['share_pct']:.1f}%"] for sec, value in profiler["sections"].items()]
        assert page.tables[f"sections-table-{name}"] == expected
        # the histogram's bars hold every measured iteration
        hist = raw["iteration_timer"]["histogram_ms"]
        assert sum(page.counts[f"histogram-{name}"]) == hist["count"] == raw["iteration_timer"][
            "measured_iterations"]
        assert len(page.counts[f"histogram-{name}"]) >= 1
        assert diagnosis_line(raw["diagnosis"], name) in page.texts[f"run-{name}"]
    # the bars say the table's figures: it/s, the memory peaks, J/sample
    for row in page.tables["phase-table"][1:]:
        assert f"{row[0]}{row[header.index('Speed (it/s)')]}" in page.texts["speed-bars"]
        assert f"{row[0]}{row[header.index('Train peak')].split(' (')[0]}" in page.texts["train-peak-mb-bars"]
    assert "cand2" in page.texts["energy-bars"] and "base" in page.texts["energy-bars"]
    # links to what other sections add, wherever they are
    assert "traces/step5.json" in page.links and "file:///tmp/oom/snapshot.pickle" in page.links
    assert "top_allocations" in page.texts["run-cand"] and "train.py:10 forward" in page.texts["run-cand"]


def test_compare_html_holds_the_comparison_text_and_both_runs(runs):
    page_path = os.path.join(runs["root"], "compare.html")
    text = cli("compare", runs["base"], runs["cand"], "--names", "base", "cand", "--html", page_path)
    with open(page_path, encoding="utf-8") as fh:
        page = Page(fh.read())
    assert page.texts["compare-text"].strip() == text.strip()
    assert "J/sample: n/a -> 2" in page.texts["compare-text"]  # the base measured no energy (a CPU run)
    assert {"sections-table-base", "sections-table-cand", "phase-table"} <= set(page.tables)


def test_the_page_is_self_contained_and_escapes_what_it_shows(runs):
    page_path = os.path.join(runs["root"], "escaped.html")
    cli("report", runs["base"], runs["cand"], "--names", "<b>base</b>", "x\" onload=\"y", "--html", page_path)
    with open(page_path, encoding="utf-8") as fh:
        html_text = fh.read()
    page = Page(html_text)
    assert "http://" not in html_text and "https://" not in html_text
    assert not page.tags & {"script", "img", "link", "iframe", "object", "embed", "base"}
    assert not [k for k, _ in page.attrs if k in ("src", "srcset", "onload") or k.startswith("on")]
    assert "b" not in page.tags and page.tables["phase-table"][1][0] == "<b>base</b>"
    assert any("default-src 'none'" in v for _, v in page.attrs)  # the browser is told to fetch nothing


def test_report_html_to_a_folder_fails_before_the_work(runs):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "report", runs["base"], "--html",
                           str(runs["root"])], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--html" in proc.stderr and "is a directory" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
def test_a_headless_browser_renders_the_figures_with_no_network(runs, tmp_path):
    page_path = os.path.join(runs["root"], "browser.html")
    text = cli("report", runs["base"], runs["cand"], "--names", "base", "cand", "--html", page_path)
    offline = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(offline + ["--dump-dom", f"file://{page_path}"], capture_output=True, text=True,
                         timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = Page(dom.stdout)
    assert rendered.tables["phase-table"] == markdown_rows(text)
    for name in ("base", "cand"):
        assert sum(rendered.counts[f"histogram-{name}"]) == read(runs[name])["iteration_timer"]["histogram_ms"][
            "count"]
    shot = tmp_path / "page.png"
    subprocess.run(offline + [f"--screenshot={shot}", "--window-size=1200,2000", f"file://{page_path}"],
                   capture_output=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 10_000  # a page drawn, not a blank 1200x2000 (a few kB)
