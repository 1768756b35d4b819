"""Why a run scales as it does: the run's own collective timed before training (real
ranks, Horovod and DDP, each payload kind) and the report's prediction built from those
records beside the measurement."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import collectives, results
from lab.report import lab_report, model_check, prediction, summary
from tests.conftest import requires_horovod

REPO = Path(__file__).resolve().parent.parent


def test_bus_factors_are_nccl_tests_formulas():
    # nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather and reduce-scatter
    # (n-1)/n, broadcast and reduce 1; nothing crosses a bus with one rank.
    assert collectives.bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert collectives.bus_factor("allgather", 4) == pytest.approx(0.75)
    assert collectives.bus_factor("reducescatter", 2) == pytest.approx(0.5)
    assert collectives.bus_factor("broadcast", 16) == 1.0
    assert collectives.bus_factor("reduce", 4) == 1.0
    assert collectives.bus_factor("alltoall", 1) == 0.0
    bw = collectives.bandwidths("allreduce", 2_000_000_000, 2.0, 2)
    assert bw == {"algbw_gbs": pytest.approx(1.0), "busbw_gbs": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="one of allreduce"):
        collectives.bus_factor("all-reduce", 2)


def bench(tmp_path, *extra, run_id="p", epochs=1):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--data", "digits",
                         "--epochs", str(epochs), "--max-steps", "6", "--warmup-steps", "1",
                         "--results-dir", str(tmp_path), "--run-id", run_id, *extra],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    return results.read_records(tmp_path / run_id / results.RESULTS_FILE)[0]


@pytest.mark.parametrize("framework", [pytest.param("horovod", marks=requires_horovod), "ddp"])
def test_each_run_times_its_own_collective_on_its_own_payload(framework, tmp_path):
    recs = bench(tmp_path, "--np", "2", "--framework", framework, "--compression", "none,fp16,int8")
    by = {(r["config"]["compression"], r["world"]["np"]): r["figures"] for r in recs}
    for comp, op, size_of in (("none", "allreduce", lambda f: f["payload_bytes_per_step"]),
                              ("fp16", "allreduce", lambda f: f["payload_bytes_per_step"]),
                              ("int8", "allgather", lambda f: 2 * f["payload_bytes_per_step"])):
        f = by[(comp, 2)]
        c = f["collective_alone"]
        assert c["op"] == op and c["ranks"] == 2 and c["timed"] >= 3
        assert c["size_bytes"] == size_of(f)
        assert c["time_s"] > 0 and c["busbw_gbs"] == pytest.approx(
            c["size_bytes"] / c["time_s"] / 1e9 * collectives.bus_factor(op, 2))
        # what measuring costs is recorded, and stays small beside the run's start-up
        assert 0 < c["cost_s"] < f["startup_s"]
    assert by[("fp16", 2)]["collective_alone"]["size_bytes"] * 2 == by[("none", 2)]["collective_alone"]["size_bytes"]
    # each parameter's size, in the model's order (the cost model's buckets): the MNIST
    # CNN's four layers, weight then bias, adding up to the gradient's values
    sizes = by[("none", 2)]["gradient_tensors"]
    assert len(sizes) == 8 and sum(sizes) == by[("none", 2)]["gradient_values"] and sizes[1] < sizes[0]


def test_without_its_ceiling_a_run_is_explained_by_its_own_parts_and_not_predicted(tmp_path):
    """Real runs at 1 and 2 workers without --ceiling (the constructed records of
    tests/test_cost_model.py hold the prediction itself): the row says why it is not
    predicted, and what its own measurements explain is its terms."""
    recs = bench(tmp_path, "--np", "1,2", "--framework", "ddp", "--backend", "gloo")
    assert prediction.predictions(recs) == []
    [u] = prediction.unpredicted(recs)
    assert "no collective sweep" in u["why"] and "invoke doctor --save" in u["why"]
    one = next(r for r in recs if r["world"]["np"] == 1)
    two = next(r for r in recs if r["world"]["np"] == 2)
    compute = one["figures"]["step_time_mean_s"] * 1000
    comm = two["figures"]["collective_alone"]["time_s"] * 1000
    e = u["explained"]
    # the MNIST CNN's gradients are one DDP bucket: its collective (fitted through the
    # run's own timing, one size) is all exposed
    assert e["step_ms"] == pytest.approx(compute * e["slowdown"] + comm + e["waiting_ms"])
    lab_report.write(str(tmp_path / "p"))
    md = (tmp_path / "p" / "report.md").read_text()
    section = md.split("## Why it scales as it does", 1)[1].split("\n## ", 1)[0]
    assert "Not predicted: ddp / gloo at 2 workers (no collective sweep" in section
    assert "explained by its own measurements (not a prediction)" in section
    [c] = json.loads((tmp_path / "p" / "prediction.json").read_text())["configurations"]
    assert c["predicted_step_ms"] is None and c["measured_step_ms"] > 0
    assert c["explained"]["step_ms"] == pytest.approx(e["step_ms"])
    assert "collective_alone" not in one["figures"]           # one rank: nothing to exchange


def test_no_prediction_without_a_one_worker_run_says_why(tmp_path):
    recs = bench(tmp_path, "--np", "2", "--framework", "ddp", "--backend", "gloo")
    assert prediction.predictions(recs) == []
    lab_report.write(str(tmp_path / "p"))
    md = (tmp_path / "p" / "report.md").read_text()
    assert "No multi-worker run could be predicted" in md
    assert "Not predicted: ddp / gloo at 2 workers (no 1-worker run of the same configuration)" in md
    json.dumps(recs)    # the figure is plain JSON


def test_a_link_specs_rate_in_bytes_is_read_without_the_cluster():
    from lab.common.link import rate_gbs
    assert rate_gbs("1gbit") == 0.125 and rate_gbs("100mbit/1ms") == 0.0125
    assert rate_gbs("") is None and rate_gbs("fast") is None


@pytest.mark.parametrize("drop", [False, True])
def test_a_reports_model_sections_show_the_predictions_of_prediction_json(tmp_path, drop):
    """A report of two models predicts each row from all its records, as prediction.json
    and model_check do: the predicted step in every model's table is prediction.json's.
    With no other Horovod/MPI row than MNIST's of local processes (ResNet-50's and the
    cluster's dropped), that row is predicted as before: nothing of other rows goes in."""
    import shutil
    src = Path(__file__).parent / "fixtures" / "example-report-b"
    shutil.copytree(src, tmp_path / "r")
    if drop:
        recs = results.read_records(tmp_path / "r" / results.RESULTS_FILE)[0]
        (tmp_path / "r" / results.RESULTS_FILE).unlink()
        for r in recs:
            if (r["config"]["framework"], r["world"].get("controller")) != ("horovod", "mpi") or (
                    r["config"]["model"], summary.place(r)) == ("mnist", "local"):
                results.append_record(tmp_path / "r" / results.RESULTS_FILE, r)
    lab_report.write(str(tmp_path / "r"))
    shown, labels, inside = [], [], False
    col = prediction.HEADERS.index("predicted") + 1
    for line in (tmp_path / "r" / "report.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if cells[1:-1] == prediction.HEADERS:
            inside = True
        elif not line.startswith("|"):
            inside = False
        elif inside and not cells[1].startswith("-"):
            shown.append(float(cells[col]))
            labels.append(cells[1])
    saved = json.loads((tmp_path / "r" / prediction.JSON_FILE).read_text())["configurations"]
    assert len(saved) >= 4 and any("resnet50" in c["configuration"] for c in saved)
    saved = [c for c in saved if c["predicted_step_ms"] is not None]
    assert shown and sorted(shown) == sorted(float(f"{c['predicted_step_ms']:.1f}") for c in saved)
    # rows that differ by their link alone are told apart by it; no row's term is fitted on
    # itself (prediction.json: no cycle_self), with other rows or without
    links = [c["link"] for c in saved if c["servers"] > 1]
    assert sorted(lab for lab in labels if " at " in lab) == sorted(lab for lab in labels if lab.endswith(
        tuple(f" at {x}" for x in links))) and len([lab for lab in labels if " at " in lab]) == len(links) > 1
    assert not [c for c in saved if "cycle_self" in c["terms"]["assumptions"]]
    # each case has a name of its own, the one model_check's table gives it
    every = json.loads((tmp_path / "r" / prediction.JSON_FILE).read_text())["configurations"]
    assert len({c["case"] for c in every}) == len(every) > len({c["configuration"] for c in every})
    checked = [name.removesuffix(model_check.SELF) for name, _, _ in model_check.of_results(str(tmp_path / "r"))[0]]
    assert sorted(checked) == sorted(c["case"] for c in saved)


@pytest.mark.parametrize("run,folder", [(2, "example-report-b"), (3, "model-bench-3"), (4, "model-bench-4"),
                                        (5, "model-bench-5"), (6, "model-bench-6"), (7, "model-bench-7"),
                                        (8, "model-bench-8"), (9, "model-bench-9"), (10, "model-bench-10")])
def test_the_benchmark_runs_the_docs_publish_give_their_figures(run, folder):
    """docs/pages/report.md's table of the cost model's benchmark: each kept run's column is
    what `model_bench --only table` and `model_check --leave-out` print on its records today,
    so a change of the model that moves them fails here until the docs say so."""
    from lab.benchmarks import model_bench
    from lab.report import model_check
    src = str(REPO / "tests" / "fixtures" / folder)
    lines = model_bench.table(src)
    docs = (REPO / "docs" / "pages" / "report.md").read_text()
    column = {row.split("|")[1].strip(): row.split("|")[1 + run].strip()
              for row in docs.split("| rows | run 1", 1)[1].split("\n\n", 1)[0].splitlines()[2:]}

    def summary(prefix):
        [line] = [x for x in lines if x.strip().startswith(prefix)]
        median, largest, n = (int(v) for v in re.findall(r"(\d+)%?", line.split(":")[-1])[:3])
        return median, largest, n
    m, big, n = summary("median absolute error")
    assert column["all, median / largest absolute error"] == f"{m}% / {big}% ({n})"
    for label in ("within one server", "across servers"):
        m, big, n = summary(label)
        assert column[label] == f"{m}% / {big}% ({n})"
    [far] = [x for x in lines if x.startswith("off by more than 25%")]
    far, inside = (int(v) for v in re.findall(r": (\d+) case\(s\), (\d+) of them", far)[0])
    assert column["off by more than 25% (of them, within their own runs' span)"] == f"{far} ({inside})"
    m, big, n = summary("the measurement's own spread")
    assert column["the measurement's own spread"] == f"{m}% / {big}% ({n} runs)"
    records = model_check._records([src])
    test = model_check.leave_out_test(model_bench.LEFT_OUT)
    errors = {p["row"]["record"]["config"]["framework"] + "/" + p["row"]["record"]["world"]["controller"]: p["error"]
              for p in prediction.predictions(records, prediction_sweeps(src), test)}
    assert column["left out: DDP, Horovod over Gloo, over MPI"] == ", ".join(
        f"{100 * errors[k]:+.0f}%" for k in ("ddp/gloo", "horovod/gloo", "horovod/mpi"))


def prediction_sweeps(folder):
    from lab.report import model_inputs
    return model_inputs.load_sweeps(folder)


def test_a_codec_row_is_predicted_from_a_plain_1_worker_run_of_another_length(tmp_path):
    """The lab's compression part runs at 2 workers only, longer than its within-server part
    ran 1 worker: a row with a codec takes the 1-worker run of another length without one
    (prediction.STANDS_FOR), with its own codec's payload and collective; a strategy with no
    1-worker run says why the model does not cover it, not that a run is missing."""
    one = bench(tmp_path, "--np", "1", "--framework", "ddp", "--backend", "gloo", run_id="one")
    two = bench(tmp_path, "--np", "2", "--framework", "ddp", "--backend", "gloo", "--compression", "int8",
                epochs=2, run_id="two")
    zero = bench(tmp_path, "--np", "2", "--framework", "ddp", "--backend", "gloo", "--strategy", "zero1",
                 run_id="zero")
    sweeps = prediction_sweeps(REPO / "tests" / "fixtures" / "model-bench-10")
    [p] = prediction.predictions(one + two + zero, sweeps)
    f = two[0]["figures"]
    assert p["row"]["record"]["config"]["compression"] == "int8" and p["np"] == 2
    assert p["inputs"].op == "allgather" == f["collective"]
    assert p["inputs"].payload_bytes == f["payload_bytes_per_step"] < one[0]["figures"]["gradient_values"] * 4
    assert p["compute_ms"] == pytest.approx(summary.rows(one)[0]["time per step (ms)"])
    [u] = prediction.unpredicted(one + two + zero, sweeps)
    assert u["row"]["record"]["config"]["strategy"] == "zero1"
    assert u["why"].startswith("not predicted: ZeRO-1"), u["why"]
    # without the plain run, the codec row has none: nothing else stands for it
    assert [x["why"] for x in prediction.unpredicted(two, sweeps)] == ["no 1-worker run of the same configuration"]
