"""What the kit prints fits the terminal: lab.common.display decides the width and
narrows tables by column (a row is never cut in two)."""
import re

import pytest

from lab.common import display, results
from lab.report import bench_output, summary
from tests.conftest import REPO

RUNS = REPO / "tests" / "fixtures" / "model-bench-10" / results.RESULTS_FILE


def columns_of(lines: list[str]) -> list[list[str]]:
    """Each physical line of a pipe table, as its cells."""
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines if ln.startswith("|")
            and not ln.startswith("|-")]


@pytest.mark.parametrize("width", [120, 100])
def test_benchs_table_is_narrowed_by_column_and_loses_nothing(width):
    records = results.read_records(RUNS)[0][:6]
    wide = bench_output.render(records, "x")
    narrow = bench_output.render(records, "x", width)
    assert max(map(len, wide.splitlines())) > 120        # the table as it is does not fit
    assert max(map(len, narrow.splitlines())) <= width
    # every line of the table has every column (the row is not cut), and the cells of a
    # row's lines put together again are the wide table's cells
    full = columns_of(wide.splitlines())
    lines = narrow.split("\n\n")[0].splitlines()
    assert len({ln.count("|") for ln in lines}) == 1
    sep = next(i for i, ln in enumerate(lines) if ln.startswith("|-"))
    head, body = columns_of(lines[:sep]), columns_of(lines[sep + 1:])

    def joined(parts):
        return [re.sub(r"(?<=-) ", "", " ".join(p for p in col if p)) for col in zip(*parts)]
    assert joined(head) == [re.sub(r"(?<=-) ", "", h) for h in full[0]] or \
        [h.replace(" ", "") for h in joined(head)] == [h.replace(" ", "") for h in full[0]]
    starts = [i for i, cells in enumerate(body) if cells[0]] + [len(body)]
    rows = [joined(body[a:b]) for a, b in zip(starts, starts[1:])]
    assert [[c.replace(" ", "") for c in r] for r in rows] == [[c.replace(" ", "") for c in r] for r in full[1:]]


def test_below_what_its_values_allow_the_table_is_as_narrow_as_they_are():
    """13 columns of values such as (10,766- cannot fit 80 columns: the table stops at
    its values' longest pieces, every line the same width, nothing cut."""
    records = results.read_records(RUNS)[0][:6]
    table = bench_output.render(records, "x", 80).split("\n\n")[0].splitlines()
    assert len({len(ln) for ln in table}) == 1 and 80 < len(table[0]) < 100


def test_a_table_that_fits_is_one_line_a_row():
    out = display.table(["a", "bb"], [["1", "2"], ["3", "4"]], 120).splitlines()
    assert out == ["| a | bb |", "|---|----|", "| 1 | 2  |", "| 3 | 4  |"]
    assert display.table(["a", "bb"], [["1", "2"]], None) == "\n".join(out[:3])


def test_a_header_breaks_within_its_column_only_when_the_values_cannot_narrow():
    out = display.table(["compression", "n"], [["none", "1"]], 13).splitlines()
    assert max(map(len, out)) <= 13 and out[-1].startswith("| none")
    assert display.table(["compression", "n"], [["none", "1"]], 20).splitlines()[0] == "| compression | n |"


def test_the_markdown_table_of_the_report_is_unchanged_by_the_width():
    rows = summary.rows(results.read_records(RUNS)[0][:6])
    assert summary.render(rows).splitlines()[0].startswith("| model | framework | back end |")
    assert summary.render(rows) == summary.render(rows, None)


def test_invoke_bench_fits_the_columns_it_is_given(tmp_path):
    """Real ranks; the table and the lines under it as `invoke bench` prints them, within
    $COLUMNS (no terminal here); the rows the records hold, all there."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "COLUMNS": "100"}
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1,2", "--framework",
                         "ddp", "--backend", "gloo", "--data", "synthetic", "--max-steps", "6",
                         "--warmup-steps", "1", "--ceiling", "--run-id", "fit", "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    out = cp.stdout[cp.stdout.index("| model"):]
    assert max(map(len, out.splitlines())) <= 100, out
    recs = results.read_records(tmp_path / "fit" / results.RESULTS_FILE)[0]
    body = columns_of(out.split("\n\n")[0].splitlines())
    assert [c[0] for c in body if c[0] and c[0] != "model"] == ["mnist"] * len(recs) == ["mnist", "mnist"]
