"""`invoke report` from a fixed set of records, checked table by table, the curves
written as PNG files, the analysis computed from the figures, failures as numbered notes,
skipped combinations once each, the HTML page. Every record is made by the code's own
writers (RunConfig.as_record, results.make_record, results.append_record)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.common.config import RunConfig
from lab.report import analysis as an
from lab.report import curves, model_inputs, strategies, summary, tables
from lab.report import lab_report as report

REPO = Path(__file__).resolve().parent.parent


def rec(framework, backend, np, step_s, tput, acc, compression="none", nodes=1, payload=None,
        zeroed=None, status="ok", reason="", world=None):
    cfg = RunConfig(framework=framework, backend=backend, data="digits", epochs=3, batch_size=32,
                    compression=compression).as_record()
    if status != "ok":
        r = results.make_record(status, run_id="fixed", config=cfg, np=np, nodes=nodes,
                                started_at="2026-11-21T01:00:00Z", finished_at="2026-11-21T01:01:00Z",
                                error={"rank": 1 if status == "failed" else None,
                                       "host": "node2" if status == "failed" else None,
                                       "reason": reason})
        r["record_id"] = f"{framework}{backend}{np}{compression}{nodes}"
        return r
    hosts = [f"node{1 + i * nodes // np}" if nodes > 1 else "vm" for i in range(np)]
    f = {"throughput_img_s": tput, "step_time_mean_s": step_s, "step_time_p50_s": step_s,
         "step_time_p95_s": step_s, "timed_steps": 10, "test_accuracy": acc, "final_loss": 0.3,
         "peak_memory_bytes": [1] * np, "lr_used": 0.01 * np, "gradient_values": 1000,
         "payload_bytes_per_step": payload or 4000, "wire_bytes_per_step_estimate": payload or 4000,
         "collective": "allreduce"}
    if zeroed is not None:
        f["codec_zeroed_fraction"] = zeroed
    r = results.make_record(
        "ok", run_id="fixed", config=cfg, np=np, nodes=nodes, started_at="2026-11-21T01:00:00Z",
        finished_at="2026-11-21T01:01:00Z",
        world={"hosts": hosts, "devices_per_node": np // nodes, "controller": backend, **(world or {})},
        figures=f, epochs=[], step_times_s=[step_s])
    r["record_id"] = f"{framework}{backend}{np}{compression}{nodes}"
    r.update({
              "manifest": {"hosts": hosts, "cpu_model": "AMD EPYC", "os": "Debian 12", "gpus": None,
                           "driver": None, "mpi": {"implementation": "Open MPI", "version": "4.1.4"},
                           "nics": [{"name": "eth0", "driver": "virtio_net", "state": "up", "speed_mbps": None}],
                           "gpu_topology": None, "torch": "2.13.0", "torchvision": None, "horovod": "0.28.1",
                           "python": "3.11", "cuda": None, "cudnn": None, "nccl": None,
                           "image": {"id": "sha256:abcdef0123456789abcdef",
                                     "labels": {"org.dl-lab-kit.flavor": "cpu",
                                                "org.dl-lab-kit.torch_version": "2.13.0"}},
                           "kit_path": "/opt/lab-src/lab"}})
    return r


RECORDS = [
    rec("horovod", "gloo", 1, 0.020, 3200.0, 0.930),
    rec("horovod", "gloo", 2, 0.025, 5120.0, 0.929),          # speedup 1.60, efficiency 80%
    rec("ddp", "gloo", 1, 0.020, 3000.0, 0.931),
    rec("ddp", "gloo", 2, 0.030, 4200.0, 0.927),              # 1.40, 70%
    rec("ddp", "gloo", 2, 0.032, 4000.0, 0.930, compression="int8", payload=1032),
    rec("ddp", "gloo", 2, 0.031, 4100.0, 0.097, compression="int8-naive", payload=1000, zeroed=0.998),
    rec("horovod", "gloo", 2, 0.040, 3000.0, 0.928, nodes=2),  # across servers: 0.94, 47%
    rec("horovod", "mpi", 2, 0, 0, 0, status="failed", reason="node node2 stopped during the run",
        nodes=2),
    rec("ddp", "nccl", 2, 0, 0, 0, status="skipped", reason="the nccl back end runs on GPUs only"),
]


@pytest.fixture()
def written(tmp_path):
    run = tmp_path / "fixed"
    for r in RECORDS:
        results.append_record(run / results.RESULTS_FILE, r)
    path = report.write(str(run))
    return path.read_text(), run


def section(text, title):
    part = text.split(f"## {title}\n", 1)[1]
    return part.split("\n## ", 1)[0]


def table(text, title):
    lines = [ln for ln in section(text, title).splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]


def test_environment_table(written):
    text, _ = written
    env = dict(table(text, "Environment"))
    assert env["servers"] == "3: node1, node2, vm"           # every host any ok run used
    assert env["NIC model and count"] == "1: eth0 (virtio_net)"
    assert env["MPI"] == "Open MPI 4.1.4" and env["GPU model and count"] == "none (CPU ranks)"
    assert env["image"].startswith("sha256:abcdef012345") and "torch_version=2.13.0" in env["image"]


def test_cuda_of_torchs_build_on_cpu_ranks_is_said_to_be_unused():
    """pip's default torch is a CUDA build that runs on CPUs: its CUDA and cuDNN versions
    beside "none (CPU ranks)" are said to be the build's; on GPU ranks they are plain."""
    from lab.report.environment import environment
    cpu = rec("ddp", "gloo", 1, 0.02, 1000.0, 0.9)
    cpu["manifest"].update(cuda="13.0", cudnn=92000, gpus={"count": 0, "devices": []})
    env = dict(environment([cpu]))
    assert env["CUDA"] == "13.0 (torch's build; the ranks used no GPU)"
    assert env["cuDNN"] == "9.20.0 (torch's build; the ranks used no GPU)"
    gpu = rec("ddp", "nccl", 1, 0.02, 1000.0, 0.9)
    gpu["manifest"].update(cuda="13.0", cudnn=92000, gpus={"count": 1, "devices": [{"name": "H100"}]})
    assert dict(environment([gpu]))["CUDA"] == "13.0"
    cpu["manifest"].update(cuda=None, cudnn=None)
    assert dict(environment([cpu]))["CUDA"] == "n/a (CPU build of torch)"


def notes_under(text, title):
    return [ln for ln in section(text, title).splitlines() if ln.startswith("[")]


def test_within_server_table(written):
    text, _ = written
    rows = table(text, "Results within one server")
    by = {(r[0], r[3]): r for r in rows}
    assert by[("horovod / gloo", "2")][4:9] == ["25.00", "5,120", "1.60", "80%", "92.90%"]
    assert by[("ddp / gloo", "2")][6:8] == ["1.40", "70%"]
    assert by[("ddp / gloo / int8", "2")][6] == "n/a"        # no 1-worker int8 run to compare with
    assert ("horovod / mpi", "2") not in by                  # a 2-server run: the next table
    assert not any(r[0].startswith("ddp / nccl") for r in rows)   # skipped: in no table
    assert all(r[1] == "1" for r in rows)


def test_across_server_table(written):
    text, _ = written
    row, failed = table(text, "Results across servers")
    assert row[:4] == ["horovod / gloo", "2", "1", "2"]
    assert row[6:8] == ["0.94", "47%"]                       # against the 1-worker run: 3000/3200
    # A failed 2-server run is a row of this table (its record carries world.nodes); its
    # reason is a numbered note under the table, not a sentence in a cell.
    assert failed[:2] == ["horovod / mpi", "2"] and failed[4] == "failed [1]"
    assert notes_under(text, "Results across servers") == [
        "[1] failed (rank 1, on node2): node node2 stopped during the run"]


def test_compression_table(written):
    text, _ = written
    rows = {r[2]: r for r in table(text, "Gradient compression")}
    assert set(rows) == {"none", "int8", "int8-naive"}
    assert rows["none"][6:] == ["4,000", "4,000", "0%"]
    assert rows["int8"][5:] == ["93.00%", "1,032", "1,032", "74%"]
    assert rows["int8-naive"][5] == "9.70%"


def test_skipped_combinations_appear_once_grouped_by_their_reason(tmp_path):
    """Eight DDP-over-MPI combinations skipped for one reason, one NCCL for another: no
    table row, one line per reason, each reason written once in the whole report."""
    mpi = "this torch has no mpi back end for DDP: pip's torch builds have no MPI back end"
    recs = [rec("horovod", "gloo", 1, 0.020, 3200.0, 0.93), rec("horovod", "gloo", 2, 0.025, 5120.0, 0.93)]
    recs += [rec("ddp", "mpi", n, 0, 0, 0, compression=c, status="skipped", reason=mpi)
             for c in ("none", "fp16", "int8", "int8-naive") for n in (1, 2)]
    recs.append(rec("ddp", "nccl", 2, 0, 0, 0, status="skipped", reason="the nccl back end runs on GPUs only"))
    run = tmp_path / "r"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    text = report.write(str(run)).read_text()
    assert [r[0] for r in table(text, "Results within one server")] == ["horovod / gloo"] * 2
    lines = [ln for ln in section(text, "Combinations that did not run").splitlines() if ln.startswith("- ")]
    assert lines == [f"- DDP over MPI: 8 combinations (compression none, fp16, int8, int8-naive; "
                     f"1 and 2 workers): {mpi}",
                     "- DDP over NCCL: 1 combination (compression none; 2 workers): the nccl back end "
                     "runs on GPUs only"]
    assert text.count(mpi) == 1
    assert not any("skipped" in ln.lower() or "ddp / mpi" in ln for ln in text.splitlines()
                   if ln.startswith("|"))


def test_a_long_reason_is_a_numbered_note_and_no_table_line_is_over_160(tmp_path):
    long_reason = ("rank 1 exited with signal 9 (SIGKILL, as the out-of-memory killer sends) while "
                   "the other ranks waited in the all-reduce of step 412; the launcher reported: "
                   "Primary job terminated normally, but 1 process returned a non-zero exit code")
    recs = [rec("horovod", "gloo", 1, 0.020, 3200.0, 0.93),
            rec("horovod", "gloo", 2, 0, 0, 0, status="failed", reason=long_reason),
            rec("ddp", "gloo", 2, 0, 0, 0, status="failed", reason=long_reason)]
    run = tmp_path / "r"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    text = report.write(str(run)).read_text()
    rows = table(text, "Results within one server")
    assert [r[4] for r in rows] == ["20.00", "failed [1]", "failed [1]"]   # one note for both
    assert notes_under(text, "Results within one server") == [
        f"[1] failed (rank 1, on node2): {long_reason}"]
    assert text.count(long_reason) == 1
    assert max(len(ln) for ln in text.splitlines() if ln.startswith("|")) <= 160


def test_bench_prints_what_did_not_run_under_its_table_and_reasons_as_notes(tmp_path):
    """invoke bench's own table (lab.report.bench_output): a skipped combination is no row
    but one line per reason under the table; a failed run is a row whose cell points to a
    numbered note with the reason."""
    from lab.report.bench_output import render
    mpi = "this torch has no mpi back end for DDP: pip's torch builds have no MPI back end"
    died = "rank 1 exited with signal 9 (SIGKILL) while the other ranks waited in the all-reduce"
    recs = [rec("horovod", "gloo", 1, 0.020, 3200.0, 0.93),
            rec("horovod", "gloo", 2, 0, 0, 0, status="failed", reason=died)]
    recs += [rec("ddp", "mpi", n, 0, 0, 0, compression=c, status="skipped", reason=mpi)
             for c in ("none", "fp16") for n in (1, 2)]
    text = render(recs, str(tmp_path))
    rows = [ln for ln in text.splitlines() if ln.startswith("|")][2:]
    assert len(rows) == 2 and "| FAILED [1]" in rows[1] and died not in rows[1]
    assert f"[1] {died}" in text.splitlines()
    assert f"- DDP over MPI: 4 combinations (compression none, fp16; 1 and 2 workers): {mpi}" in text
    assert text.count(mpi) == 1 and "SKIPPED" not in text


def test_analysis_is_computed_from_the_figures(written):
    text, _ = written
    a = section(text, "Analysis")
    assert ("1. Best scaling at 2 workers: horovod over gloo on 1 server, speedup 1.60 (one run, no "
            "interval), efficiency 80% (one run, no interval), 5,120 images/s; one run each, so no "
            "interval says whether the difference is real.") in a
    assert ("2. Worst scaling at 2 workers: horovod over gloo on 2 servers, speedup 0.94 (one run, no "
            "interval), efficiency 47% (one run, no interval): slower with 2 workers than with one; "
            "its step took 40.0 ms against 20.0 ms with one worker.") in a
    ranked = table(text, "Analysis")
    # rank, configuration, workers, servers, speedup, efficiency, compute, communication, ratio:
    # 20 ms at 1 worker, 25 ms at 2: 5 ms of communication, ratio 4.00
    assert ranked[0] == ["1", "horovod over gloo", "2", "1", "1.60", "80%", "20.0", "5.0", "4.00"]
    assert [(r[1], r[3]) for r in ranked] == [("horovod over gloo", "1"), ("ddp over gloo", "1"),
                                              ("horovod over gloo", "2")]
    assert "ddp over gloo, 2 workers: int8 reached 93.00% against 92.70% uncompressed (+0.30 points)" in a
    assert "handed 74% fewer gradient bytes" in a
    # the naive cast did not learn (9.7%, chance 10%): a finding, and left out of the ranking
    assert ("3. Did not learn: ddp over gloo with int8-naive, accuracy 9.70% against 10% by chance" in a
            and "sent 99.8% of the nonzero gradient values as 0" in a)
    assert "Left out of the ranking as not having learned" in a and "int8-naive" not in str(ranked)


def learning(framework, compression, effs, accs, backend="gloo", world=None, base_world=None):
    """A configuration at 1 and 2 workers: repeats with these 2-worker efficiencies
    (world, base_world: what the 2-worker and the 1-worker records add to world)."""
    out = []
    for i, (e, a) in enumerate(zip(effs, accs)):
        for np_, t in ((1, 1000.0), (2, 2000.0 * e)):
            r = rec(framework, backend, np_, 0.02 * (1 if np_ == 1 else 1 / e), t, a,
                    compression=compression, world=world if np_ > 1 else base_world)
            r["config"]["repeat"] = i
            out.append(r)
    return out


def test_a_configuration_at_chance_accuracy_is_never_ranked_as_scaling_best():
    """int8-naive scales best by the clock (it barely computes an update) but ends at
    chance: the analysis names the best configuration that learned."""
    recs = (learning("horovod", "int8-naive", [0.95, 0.94, 0.96], [0.0967] * 3)
            + learning("horovod", "none", [0.70, 0.72, 0.71], [0.88] * 3)
            + learning("ddp", "none", [0.50, 0.52, 0.51], [0.88] * 3))
    a = an.analysis(recs)
    assert a.findings[0].startswith("Best scaling at 2 workers: horovod over gloo, speedup 1.42 (1.40-1.44)")
    assert a.findings[1].startswith("Worst scaling at 2 workers: ddp over gloo, speedup 1.02 (1.00-1.04)")
    assert a.findings[2].startswith("Did not learn: horovod over gloo with int8-naive, accuracy 9.67% "
                                    "in each of 6 runs against 10% by chance")
    assert len(a.findings) <= an.MAX_FINDINGS
    assert [r[1] for r in a.ranking] == ["horovod over gloo", "ddp over gloo"]
    assert a.left_out == ["Left out of the ranking as not having learned (accuracy below 2 times "
                          "chance, 20%): horovod over gloo with int8-naive."]
    # one that learned slowly (25%, above twice chance) is ranked
    slow = learning("ddp", "fp16", [0.99, 0.98, 0.99], [0.25] * 3)
    assert an.analysis(recs + slow).findings[0].startswith("Best scaling at 2 workers: ddp over gloo with fp16")


def test_oversubscribed_rows_are_marked_and_never_read_as_scaling(tmp_path):
    """Records that bench marked world.oversubscribed (with world.cores): a mark in the
    tables, explained once under them, and out of the ranking."""
    over = {"oversubscribed": True, "cores": 1}
    recs = (learning("horovod", "none", [0.98, 0.97, 0.99], [0.88] * 3, world=over)
            + learning("ddp", "none", [0.60, 0.62, 0.61], [0.88] * 3)
            + learning("horovod", "none", [0.50, 0.50, 0.50], [0.88] * 3, backend="mpi"))
    run = tmp_path / "r"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    text = report.write(str(run)).read_text()
    rows = {(r[0], r[3]): r for r in table(text, "Results within one server")}
    assert ("horovod / gloo", "2 †") in rows and ("horovod / gloo", "1") in rows
    assert ("ddp / gloo", "2") in rows
    assert "Rows marked † ran oversubscribed (1 rank on 1 core)" not in text       # 2 ranks per host
    assert "Rows marked † ran oversubscribed (2 ranks on 1 core)" in section(text, "Results within one server")
    a = an.analysis(recs)
    assert a.findings[0].startswith("Best scaling at 2 workers: ddp over gloo, speedup 1.22")
    assert [r[1] for r in a.ranking] == ["ddp over gloo", "horovod over mpi"]
    assert a.left_out == ["Left out of the ranking as oversubscribed (more busy threads than cores: the "
                          "time measures ranks sharing cores): horovod over gloo at 2 workers (2 ranks "
                          "on 1 core)."]
    assert any(f.startswith("Oversubscribed: horovod over gloo") for f in a.findings)
    # a baseline that ran oversubscribed makes its configuration's speedup no scaling either
    base_over = learning("ddp", "none", [0.9] * 3, [0.88] * 3, backend="mpi",
                         base_world={"oversubscribed": True, "cores": 1})
    a = an.analysis(recs + base_over)
    assert "ddp over mpi" not in [r[1] for r in a.ranking]
    assert "ddp over mpi at 2 workers (its 1-worker baseline: 1 rank on 1 core)" in a.left_out[0]
    # on the curves: the oversubscribed point is ringed, the others are not
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection
    figs = curves.figures(recs)
    try:
        [panel] = figs["speedup.png"].axes
        [ring] = [c for c in panel.collections if isinstance(c, PathCollection)]     # horovod / mpi's: none
        [(x, y)] = ring.get_offsets().tolist()
        assert round(x) == 2 and y == pytest.approx(1.96)      # horovod/gloo's median speedup
        assert "oversubscribed" in [t.get_text() for t in figs["speedup.png"].legends[0].get_texts()]
    finally:
        for f in figs.values():
            plt.close(f)


def test_findings_come_first_at_most_three_each_with_its_interval(tmp_path):
    recs = (learning("horovod", "none", [0.80, 0.82, 0.81], [0.88] * 3)
            + learning("ddp", "none", [0.40, 0.42, 0.41], [0.88] * 3)
            + learning("ddp", "int8-naive", [0.99, 0.99, 0.99], [0.09] * 3)
            + learning("horovod", "fp16", [0.70, 0.71, 0.72], [0.88] * 3, world={"oversubscribed": True}))
    a = an.analysis(recs)
    assert len(a.findings) == 3                      # best, worst, did not learn; oversubscribed: below
    for f in a.findings[:2]:
        assert re.search(r"speedup \d\.\d\d \(\d\.\d\d-\d\.\d\d\)", f), f
    assert re.search(r"accuracy 9\.00% in each of 6 runs", a.findings[2])
    run = tmp_path / "r"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    text = section(report.write(str(run)).read_text(), "Analysis")
    assert text.index("1. Best scaling") < text.index("Left out of the ranking") < text.index("| rank ")


def test_curves_are_png_files(written):
    text, run = written
    for name in ("throughput.png", "speedup.png"):
        data = (run / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"]({name})" in text


def test_report_of_nothing_is_one_sentence(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for args, words in (([str(tmp_path / "nope")], "does not exist"), ([str(tmp_path)], "no records"),
                        ([str(tmp_path / "a-file")], "is a file"),
                        ([str(tmp_path), "--format", "pdf"], "'pdf' is not a report format")):
        cp = subprocess.run([sys.executable, "-m", "invoke", "report", *args], cwd=REPO,
                            capture_output=True, text=True)
        assert cp.returncode == 2 and words in cp.stderr and "Traceback" not in cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1
    assert (tmp_path / "a-file").read_text() == "x"     # a file given as the folder: left as it is


@pytest.mark.parametrize("example", ["example-report", "example-report-b"])
def test_the_example_report_is_what_its_records_give(tmp_path, example):
    """The README's examples (tests/fixtures/example-report, the compression sweep, and
    example-report-b, the cost model's benchmark with doctor's sweeps) regenerate from
    their records."""
    import shutil
    src = Path(__file__).parent / "fixtures" / example
    run = tmp_path / "cpu-sweep"
    run.mkdir()
    for name in (results.RESULTS_FILE, model_inputs.SWEEP_FILE):
        if (src / name).exists():
            shutil.copy(src / name, run / name)
    text = report.write(str(run)).read_text()
    expected = (src / "report.md").read_text().replace("`results/cpu-sweep`", f"`{run}`")
    assert text == expected
    # and prediction.json beside it: every term of each 2-worker row (the compression
    # sweep's unpredicted, with why: it measured no ceiling)
    assert (run / "prediction.json").read_text() == (src / "prediction.json").read_text()


@pytest.mark.parametrize("example", ["example-report", "example-report-b"])
def test_the_examples_what_if_rows_of_one_configuration_differ_as_their_1_worker_steps_do(example):
    """Two what-if rows of one model, framework, back end and codec (run at two places, or
    on two stacks) at the same workers and link: no more than 1.5 times apart unless their
    1-worker steps are, as each comes from its 1-worker run and one fit per back end."""
    import itertools
    doc = json.loads((Path(__file__).parent / "fixtures" / example / "prediction.json").read_text())
    groups = {}
    for w in doc["what_if"]:
        name = w["configuration"]
        same = (name.split(",")[0], name.rsplit(":", 1)[1].strip()) if ":" in name else ("", name)
        groups.setdefault((*same, w["workers"], w["link_gbit"]), []).append(
            (w["predicted_step_ms"], w["terms"]["compute_one_worker_ms"]))
    assert doc["what_if"] and all(w["terms"]["assumptions"] for w in doc["what_if"])
    for (a, a1), (b, b1) in (pair for rows in groups.values() for pair in itertools.combinations(rows, 2)):
        assert max(a, b) / min(a, b) <= max(1.5, max(a1, b1) / min(a1, b1))


def test_a_cell_with_a_pipe_or_a_newline_keeps_the_table_whole():
    from lab.report import markdown
    text = markdown.table(["rank", "reason"], [[1, "gloo: a|b failed\nTraceback line"], [2, None]])
    lines = text.splitlines()
    assert len(lines) == 4                                  # header, rule, two rows
    assert all(line.count("|") - line.count("\\|") == 3 for line in lines)
    assert "a\\|b failed Traceback line" in lines[2]


def test_runs_of_different_setups_are_never_merged(tmp_path):
    """After `invoke benchmark` (MNIST and ResNet-50 over DDP/Gloo) each model has its
    own curve, compression group and label."""
    recs = [rec("ddp", "gloo", 1, 0.020, 3000.0, 0.93), rec("ddp", "gloo", 2, 0.030, 4200.0, 0.93),
            rec("ddp", "gloo", 2, 0.032, 4000.0, 0.93, compression="int8", payload=1032)]
    big = []
    for r in recs:
        r = json.loads(json.dumps(r))
        r["config"]["model"], r["config"]["batch_size"] = "resnet50", 8
        r["figures"]["throughput_img_s"] /= 1000
        r["record_id"] += "-resnet"
        big.append(r)
    both = recs + big
    s = curves.series(both)
    assert len(s) == 4                                        # 2 setups x (none, int8)
    assert {k[0] for k in s} == {"mnist, batch 32: ", "resnet50, batch 8: "}
    assert dict(s[("mnist, batch 32: ", "ddp", "gloo", "none", False)]) == {1: 3000.0, 2: 4200.0}
    comp = tables.compression_rows(both)
    assert {row[0] for row in comp} == {"mnist, batch 32: ddp / gloo", "resnet50, batch 8: ddp / gloo"}
    assert len(comp) == 4
    assert curves.series(recs) and all(k[0] == "" for k in curves.series(recs))   # one setup: no label


def test_accuracy_on_synthetic_data_is_not_a_figure():
    from lab.report import summary
    r = rec("ddp", "gloo", 1, 0.02, 3000.0, 0.101)
    r["config"]["data"] = "synthetic"
    [row] = summary.rows([r])
    assert row["accuracy"] is None
    assert summary.render([row]).splitlines()[-1].rstrip(" |").endswith("n/a")
    assert tables.result_rows([r], across=False)[0][tables.RESULT_HEADERS.index("accuracy")] == "n/a"


def repeats(framework, np, tputs, step_s=0.02, acc=0.9):
    out = []
    for i, t in enumerate(tputs):
        r = rec(framework, "gloo", np, step_s, t, acc)
        r["config"]["repeat"] = i
        r["record_id"] += f"r{i}"
        out.append(r)
    return out


def test_repeats_are_one_row_with_their_median_and_min_max():
    from lab.report import summary
    records = repeats("ddp", 1, [1000.0, 1100.0, 1050.0]) + repeats("ddp", 2, [1850.0, 2000.0, 1900.0])
    table = summary.rows(records)
    assert [(r["np"], r["runs"]) for r in table] == [(1, 3), (2, 3)]
    row = table[1]
    assert row["throughput (img/s)"] == 1900.0
    assert row["speedup"] == pytest.approx(1900 / 1050)
    sp = row["speedup_summary"]
    assert (sp.low, sp.high) == (pytest.approx(1850 / 1100), pytest.approx(2000 / 1000))
    text = summary.render(table)
    assert "1,900 (1,850-2,000)" in text and "1.81 (1.68-2.00)" in text and "90% (84%-100%)" in text
    assert "medians of 3 repeated runs" in text and "lowest and highest run" in text
    assert "*" not in text.split("\n\n")[0]           # spreads of 9.5% and 7.9%: not noisy
    # A row whose runs differ by more than 10% of the median is marked and explained.
    noisy = repeats("ddp", 1, [1000.0, 1300.0, 1050.0])
    text = summary.render(summary.rows(noisy))
    assert "1,050 (1,000-1,300) *" in text
    assert "* ddp over gloo, none, np 1: its 3 runs differ by 29% of their median" in text


def test_five_repeats_give_a_bootstrap_interval():
    from lab.report import summary
    records = repeats("ddp", 1, [1000.0, 1010.0, 990.0, 1005.0, 995.0])
    [row] = summary.rows(records)
    assert row["throughput_summary"].kind == "95% bootstrap"
    assert "a 95% bootstrap interval of the median" in summary.render([row])


def test_the_analysis_does_not_call_overlapping_intervals_a_difference():
    records = (repeats("ddp", 1, [1000.0, 1100.0]) + repeats("ddp", 2, [1800.0, 2000.0])
               + repeats("horovod", 1, [1000.0, 1100.0]) + repeats("horovod", 2, [1850.0, 1950.0]))
    best = an.analysis(records).findings[0]
    assert best.startswith("Best scaling") and "do not tell it apart" in best
    apart = (repeats("ddp", 1, [1000.0, 1010.0]) + repeats("ddp", 2, [1900.0, 1910.0])
             + repeats("horovod", 1, [1000.0, 1010.0]) + repeats("horovod", 2, [1200.0, 1210.0]))
    best = an.analysis(apart).findings[0]
    assert best.startswith("Best scaling") and "do not tell it apart" not in best
    assert "its interval is above every other ranked configuration's" in best


def test_an_analysis_with_nothing_to_rank_says_what_is_missing():
    """Runs without their 1-worker baseline (bench's default --np 2): the analysis says so,
    with the --np that would give one, instead of an empty section."""
    a = an.analysis(repeats("ddp", 2, [1800.0]) + repeats("horovod", 2, [1900.0]))
    assert a.ranking == [] and len(a.left_out) == 1
    assert a.left_out[0].startswith("Nothing to rank: a speedup needs the same "
                                    "configuration with 1 worker, and ") and \
        a.left_out[0].endswith(" ran without one: add 1 to --np (--np 1,2).")
    assert "ddp" in a.left_out[0] and "horovod" in a.left_out[0]
    assert an.analysis(repeats("ddp", 1, [1000.0])).left_out == ["Nothing to rank: a speedup needs runs of more than 1 worker beside the 1-worker one (--np 1,2)."]
    across = [rec("ddp", "gloo", 2, 0.02, 1800.0, 0.9, nodes=2)]
    assert an.analysis(across).left_out[0].endswith("add 1 to --np and to --nodes (--nodes 1,2 --np 1,2).")
    # with a baseline, nothing of the kind
    full = an.analysis(repeats("ddp", 1, [1000.0]) + repeats("ddp", 2, [1800.0]))
    assert full.ranking and not [s for s in full.left_out if s.startswith("Nothing to rank")]


def test_the_curves_have_a_panel_per_model_and_a_line_per_stack_with_error_bars():
    """Read from the figures' artists: one panel for the one model, colours by framework
    and back end, a marker for compression, error bars as wide as the repeats' spread,
    the ideal line."""
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    def mk(fw, be, np, tputs, comp="none"):
        out = []
        for i, t in enumerate(tputs):
            r = rec(fw, be, np, 0.02, t, 0.9, compression=comp)
            r["config"]["repeat"] = i
            r["record_id"] += f"r{i}"
            out.append(r)
        return out
    records = (mk("ddp", "gloo", 1, [1000.0, 1100.0, 1050.0]) + mk("ddp", "gloo", 2, [1850.0, 2000.0, 1900.0])
               + mk("horovod", "gloo", 1, [900.0, 1000.0]) + mk("horovod", "gloo", 2, [1500.0, 1700.0])
               + mk("horovod", "gloo", 1, [950.0], "fp16") + mk("horovod", "gloo", 2, [1400.0], "fp16")
               + mk("horovod", "mpi", 1, [1000.0]) + mk("horovod", "mpi", 2, [1800.0]))
    figs = curves.figures(records)
    assert set(figs) == {"throughput.png", "speedup.png"}
    try:
        [ax] = figs["throughput.png"].axes
        assert ax.get_title() == "mnist"
        bars = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
        assert set(bars) == {"ddp / gloo", "horovod / gloo", "horovod / gloo, fp16", "horovod / mpi"}
        ddp = bars["ddp / gloo"]
        assert ddp.lines[0].get_color() == curves.STACK_COLORS[("ddp", "gloo")]
        assert bars["horovod / gloo, fp16"].lines[0].get_color() == curves.STACK_COLORS[("horovod", "gloo")]
        assert bars["horovod / gloo, fp16"].lines[0].get_marker() != bars["horovod / gloo"].lines[0].get_marker()
        assert {b.lines[0].get_linestyle() for b in bars.values()} == {"-"}     # all within one server
        assert list(ddp.lines[0].get_ydata()) == [1050.0, 1900.0]          # medians
        # The np=2 bar spans the repeats' min-max, 1,850 to 2,000.
        segments = ddp.lines[2][0].get_segments()
        assert [tuple(p[1] for p in seg) for seg in segments][1] == pytest.approx((1850.0, 2000.0))
        # Speedup panel: its bar at np=2 spans 1850/1100 .. 2000/1000; an ideal line y = x.
        [sp_gloo] = figs["speedup.png"].axes
        sbars = {c.get_label(): c for c in sp_gloo.containers if isinstance(c, ErrorbarContainer)}
        seg = sbars["ddp / gloo"].lines[2][0].get_segments()[1]
        assert (seg[0][1], seg[1][1]) == pytest.approx((1850 / 1100, 2000 / 1000))
        assert any(list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [1, 2]
                   for line in sp_gloo.get_lines())
    finally:
        for f in figs.values():
            plt.close(f)


def test_the_one_process_row_is_the_baseline_speedup_1_without_an_interval():
    from lab.report import summary
    table = summary.rows(repeats("ddp", 1, [1000.0, 1300.0, 1050.0]))
    assert table[0]["speedup"] == 1.0 and table[0]["efficiency"] == 1.0
    line = summary.render(table).splitlines()[2]
    assert "| 1.00 " in line and "| 100% " in line and "1.00 (" not in line


def strategy_rec(strategy, np, tput, held, peak, semantics, **cfg_kw):
    framework = "none" if strategy == "dataparallel" else "ddp"
    cfg = RunConfig(framework=framework, backend="gloo", data="digits", epochs=3, batch_size=32,
                    strategy=strategy, **cfg_kw).as_record()
    f = {"throughput_img_s": tput, "step_time_mean_s": 32 * np / tput, "step_time_p50_s": 0.01,
         "step_time_p95_s": 0.01, "timed_steps": 10, "test_accuracy": 0.9, "final_loss": 0.3,
         "peak_memory_bytes": peak, "held_bytes": held, "batch_semantics": semantics,
         "lr_used": 0.01}
    return results.make_record("ok", run_id="s", config=cfg, np=np, nodes=1,
                               started_at="2026-11-23T01:00:00Z",
                               world={"hosts": ["vm"] * np, "devices_per_node": np, "controller": "gloo"},
                               figures=f, epochs=[], step_times_s=[0.01],
                               manifest=dict(RECORDS[0]["manifest"], hosts=["vm"] * np))


def held(p, g, o):
    return {"parameters": p, "gradients": g, "optimizer_state": o, "total": p + g + o}


STRATEGY_RECORDS = [
    strategy_rec("ddp", 2, 4000.0, [held(87360, 87360, 87360)] * 2, [300e6, 310e6],
                 "32 per process (64 in all)"),
    strategy_rec("zero1", 2, 3000.0, [held(87360, 87360, 64000), held(87360, 87360, 23360)],
                 [300e6, 300e6], "32 per process (64 in all)"),
    strategy_rec("pipeline", 2, 1500.0, [held(21120, 21120, 21120), held(66240, 66240, 66240)],
                 [250e6, 260e6], "32 in all, 4 micro-batches of 8", micro_batches=4),
]


def test_strategies_table_in_the_sources_shape():
    rows = strategies.strategy_rows(STRATEGY_RECORDS)
    assert [r[0] for r in rows] == ["ddp", "zero1", "pipeline (gpipe, 4 micro-batches)"]
    ddp, zero1, pipe = rows
    assert ddp[1:4] == ["ddp / gloo", "1 x 2", "4,000"]
    assert ddp[4] == "0.26 / 0.26" and ddp[5] == "300 / 310"
    assert zero1[4] == "0.24 / 0.20"       # 87,360 x 2 + 64,000 and + 23,360 bytes
    assert pipe[4] == "0.06 / 0.20" and pipe[7] == "32 in all, 4 micro-batches of 8"
    assert ddp[6] == "90.00%" and ddp[7] == "32 per process (64 in all)"
    text = report.render(STRATEGY_RECORDS, ["memory.png"], "results/s")
    assert "## Parallel strategies" in text and "![memory](memory.png)" in text
    # without a strategy other than ddp there is no such section
    assert "## Parallel strategies" not in report.render(RECORDS, [], "results/fixed")


def test_memory_chart_stacks_each_ranks_holdings():
    fig = strategies.memory_figure(STRATEGY_RECORDS)
    ax = fig.axes[0]
    kinds = [c.get_label() for c in ax.containers]
    assert kinds == ["parameters", "gradients", "optimizer state"]
    heights = {k: [round(b.get_height() * 1e6) for b in c] for k, c in zip(kinds, ax.containers)}
    # one bar per rank of each strategy, in order: ddp 0, 1, zero1 0, 1, pipeline 0, 1
    assert heights["optimizer state"] == [87360, 87360, 64000, 23360, 21120, 66240]
    assert heights["parameters"] == [87360, 87360, 87360, 87360, 21120, 66240]
    bottoms = [round(b.get_y() * 1e6) for b in ax.containers[2]]
    assert bottoms == [2 * 87360] * 4 + [2 * 21120, 2 * 66240]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[2] == "zero1, np 2, rank 0" and len(labels) == 6


def test_a_pipelines_default_micro_batches_are_the_same_configuration_as_four():
    """micro_batches 0 means 4 (RunConfig.pipeline_micro_batches): a run that left it out
    and one that said 4 are one configuration, so the first is the second's baseline."""
    one = strategy_rec("pipeline", 1, 1000.0, [held(87360, 87360, 87360)], [300e6],
                       "32 in all, 4 micro-batches of 8", micro_batches=0)
    two = strategy_rec("pipeline", 2, 1500.0, [held(21120, 21120, 21120), held(66240, 66240, 66240)],
                       [250e6, 260e6], "32 in all, 4 micro-batches of 8", micro_batches=4)
    assert summary.config_key(one) == summary.config_key(two)
    # and a field that does not apply to a strategy does not split it
    ddp_a = strategy_rec("ddp", 1, 1000.0, [held(1, 1, 1)], [1], "x", schedule="gpipe")
    ddp_b = strategy_rec("ddp", 2, 1000.0, [held(1, 1, 1)] * 2, [1, 1], "x", schedule="1f1b")
    assert summary.config_key(ddp_a) == summary.config_key(ddp_b)
    assert summary.config_key(one) != summary.config_key(ddp_a)


def test_the_analysis_ranks_only_data_parallel_runs_and_labels_tell_stacks_apart():
    """A pipeline keeps its batch as processes are added: its efficiency is not ranked
    against data parallelism's, nor split into compute and communication."""
    pipe = [strategy_rec("pipeline", 1, 1000.0, [held(1, 1, 1)], [1], "32 in all", micro_batches=4),
            strategy_rec("pipeline", 2, 1900.0, [held(1, 1, 1)] * 2, [1, 1], "32 in all",
                         micro_batches=4)]
    a = an.analysis(pipe)
    assert not a.ranking and not any("scaling" in s for s in a.sentences())
    a = an.analysis(RECORDS + pipe)
    assert "Best scaling" in a.findings[0] and "pipeline" not in " ".join(a.sentences())
    assert not any("pipeline" in r[1] for r in a.ranking)
    # the ddp strategy by Horovod and by torch: two labels in the strategies' table
    labels = {strategies.strategy_label(r, RECORDS) for r in RECORDS if r["status"] == "ok"}
    assert {"ddp (horovod / gloo)", "ddp (ddp / gloo)"} <= labels


@pytest.mark.parametrize("example", ["example-report"])
def test_the_compression_example_fits_160_columns_and_crowns_no_configuration_at_chance(example):
    text = (Path(__file__).parent / "fixtures" / example / "report.md").read_text()
    assert max(len(ln) for ln in text.splitlines() if ln.startswith("|")) <= 160
    records = results.read_records(Path(__file__).parent / "fixtures" / example / results.RESULTS_FILE)[0]
    best = an.analysis(records).findings[0]
    assert best.startswith("Best scaling") and "int8-naive" not in best
    # the runs it names learned: every record of that configuration is above twice chance
    name = best.split(": ", 1)[1].split(", speedup")[0]
    from lab.report.records import config_label, learned
    named = [r for r in records if r["status"] == "ok" and config_label(r, records) == name]
    assert named and all(learned(r) for r in named)


def html_page(tmp_path, example="example-report"):
    """`invoke report --format html` on an example's records: report.md and report.html."""
    import shutil
    run = tmp_path / "cpu-sweep"
    run.mkdir()
    shutil.copy(Path(__file__).parent / "fixtures" / example / results.RESULTS_FILE, run)
    cp = subprocess.run([sys.executable, "-m", "invoke", "report", str(run), "--format", "html"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == f"wrote {run / 'report.md'}, {run / 'report.html'}"
    return run


def test_the_html_page_is_self_contained_and_says_what_the_markdown_says(tmp_path):
    import base64
    from html.parser import HTMLParser

    run = html_page(tmp_path)
    page = (run / "report.html").read_text()

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.text = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append((tag, dict(attrs)))

        def handle_data(self, data):
            self.text.append(data)
    p = Tags()
    p.feed(page)
    names = [t for t, _ in p.tags]
    assert "script" not in names and "link" not in names and "iframe" not in names
    imgs = [a for t, a in p.tags if t == "img"]
    assert [a["title"] for a in imgs] == ["throughput.png", "speedup.png"]
    for a in imgs:                       # embedded: the very bytes of the PNG beside it
        head, data = a["src"].split(",", 1)
        assert head == "data:image/png;base64"
        assert base64.b64decode(data) == (run / a["title"]).read_bytes()
    assert not re.search(r"(src|href)=\"(?!data:)", page)
    md = (run / "report.md").read_text()
    assert names.count("table") == sum(1 for ln in md.splitlines() if ln.startswith("|--"))
    text = " ".join(" ".join(p.text).split())
    for ln in md.splitlines():
        if ln.startswith("#"):
            assert ln.lstrip("# ") in text
    assert an.analysis(results.read_records(run / results.RESULTS_FILE)[0]).findings[0] in text


def find_image(shot, img, xs):
    """The (x, y) where img appears in the screenshot pixel for pixel (each channel within
    2 of the PNG's, on 99.5% of the pixels), or None; x is looked for in xs, in order."""
    import numpy as np
    h, w = img.shape[:2]
    mid = h // 2
    row = img[mid].astype(np.int16)
    for x in xs:
        if x + w > shot.shape[1]:
            continue
        near = (np.abs(shot[:, x:x + w].astype(np.int16) - row) <= 2).all(axis=2).mean(axis=1)
        for y in np.nonzero(near > 0.995)[0] - mid:
            if y < 0 or y + h > shot.shape[0]:
                continue
            close = (np.abs(shot[y:y + h, x:x + w].astype(np.int16) - img.astype(np.int16)) <= 2).all(axis=2)
            if close.mean() > 0.995:
                return x, int(y)
    return None


def screenshot(page: Path, out: Path, height: int) -> None:
    """Chromium's headless screenshot of a page at 1400 x height, one CSS pixel a pixel."""
    import shutil
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no headless browser: Debian's chromium package is not installed "
                    "(apt-get install chromium; .ci/run installs it)")
    cp = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                         "--force-device-scale-factor=1", "--force-color-profile=srgb",
                         f"--window-size=1400,{height}", f"--screenshot={out}", page.as_uri()],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and out.exists(), cp.stderr[-2000:]


def test_the_html_page_renders_both_plots_in_a_headless_browser(tmp_path):
    """A real browser opens report.html; both curves are found in its screenshot, pixel
    for pixel, one above the other. (tests/fixtures/example-report/report-html.png is
    such a screenshot, kept to look at.)"""
    import numpy as np
    from PIL import Image
    run = html_page(tmp_path)
    shot_path = tmp_path / "shot.png"
    screenshot(run / "report.html", shot_path, 4000)
    shot = np.asarray(Image.open(shot_path).convert("RGB"))
    found = {}
    for name in ("throughput.png", "speedup.png"):
        img = np.asarray(Image.open(run / name).convert("RGB"))
        found[name] = find_image(shot, img, [24, *range(0, 60)])     # 24: the page's margin
        assert found[name] is not None, f"{name} is not in the screenshot"
    (x1, y1), (x2, y2) = found["throughput.png"], found["speedup.png"]
    assert x1 == x2 and y2 > y1


def test_the_screenshot_search_finds_a_curve_where_it_is_and_nowhere_else():
    """The browser test's checker, on a page made by hand: the PNG pasted at (24, 1234)
    is found there; a curve that is not on the page is not found."""
    import numpy as np
    from PIL import Image
    src = Path(__file__).parent / "fixtures" / "example-report"
    thr = Image.open(src / "throughput.png").convert("RGB")
    page = Image.new("RGB", (1400, 3000), "white")
    page.paste(thr, (24, 1234))
    shot = np.asarray(page)
    assert find_image(shot, np.asarray(thr), [24, *range(60)]) == (24, 1234)
    assert find_image(shot, np.asarray(Image.open(src / "speedup.png").convert("RGB")), range(16, 33)) is None


def placed(r, place, torch, image_id, tput):
    """A record as bench writes it for a run in `place` (world.place) with the ranks'
    torch and the image they ran in (None: local processes)."""
    r = json.loads(json.dumps(r))
    r["world"]["place"] = place
    r["manifest"].update(torch=torch, image={"id": image_id, "labels": {}} if image_id else None)
    r["figures"]["throughput_img_s"] = tput
    r["record_id"] += f"-{place}"
    return r


def test_runs_of_one_folder_in_different_places_and_stacks_are_separate_rows(tmp_path):
    """One run id, first as local processes (torch +cu130), then in the image (torch
    +cpu): two rows per worker count, each labelled with its place and torch, each with
    its own speedup; never one row with the median of both."""
    run = tmp_path / "r"
    for place, torch, image, tputs in [("local", "2.9.0+cu130", None, (1000.0, 1800.0)),
                                       ("image", "2.9.0+cpu", "sha256:feed", (500.0, 600.0))]:
        for np, tput in zip((1, 2), tputs):
            results.append_record(run / results.RESULTS_FILE, placed(
                rec("ddp", "gloo", np, 0.02, 0.0, 0.93), place, torch, image, tput))
    text = report.render(results.read_records(run / results.RESULTS_FILE)[0], [], str(run))
    rows = table(text, "Results within one server")
    assert [(r[0], r[3], r[5], r[6]) for r in rows] == [
        ("local, torch 2.9.0+cu130: ddp / gloo", "1", "1,000", "1.00"),
        ("local, torch 2.9.0+cu130: ddp / gloo", "2", "1,800", "1.80"),
        ("image, torch 2.9.0+cpu: ddp / gloo", "1", "500", "1.00"),
        ("image, torch 2.9.0+cpu: ddp / gloo", "2", "600", "1.20")]
    # a record from before bench wrote world.place: its manifest's image says where
    old = placed(rec("ddp", "gloo", 1, 0.02, 0.0, 0.93), "x", "2.9.0+cpu", "sha256:feed", 1.0)
    del old["world"]["place"]
    assert summary.place(old) == "image"


def test_the_environment_table_is_every_records_and_says_where_they_differ(tmp_path):
    """A local run (host vm, its NIC, torch +cu130 with torchvision) and two image runs
    (containers named by their ids, only a veth, torch +cpu without torchvision): the
    servers are vm and the containers counted apart, the NIC is vm's, the packages differ
    with the place of each. A run skipped once and run later is not listed as not run;
    the header's count says so."""
    local = placed(rec("ddp", "gloo", 1, 0.02, 0.0, 0.93), "local", "2.9.0+cu130", None, 100.0)
    local["manifest"]["torchvision"] = "0.24.0"
    image = []
    for np, cid in ((1, "3f2a1b4c5d6e"), (2, "0a1b2c3d4e5f")):
        r = placed(rec("ddp", "gloo", np, 0.02, 0.0, 0.93), "image", "2.9.0+cpu", "sha256:feed", 90.0 * np)
        r["world"]["hosts"] = [cid] * np
        r["manifest"]["nics"] = [{"name": "eth0", "driver": "virtual", "state": "up", "speed_mbps": 10000}]
        image.append(r)
    reason = "the nccl back end runs on GPUs only"
    skipped = [rec("horovod", "gloo", 2, 0, 0, 0, status="skipped", reason="Horovod is not built")]
    ran_later = rec("horovod", "gloo", 2, 0.03, 150.0, 0.93)
    still = [rec("ddp", "nccl", 2, 0, 0, 0, status="skipped", reason=reason)] * 2    # skipped twice
    records = [local, *image, *skipped, *still, ran_later]
    env = dict(report.environment(records))
    assert env["servers"].startswith("1: vm; and 2 throw-away container(s) of the image")
    assert env["NIC model and count"] == "1: eth0 (virtio_net)"
    assert "framework packages" not in env
    rows = report.environment(records)
    assert [(k, v) for k, v in rows if k.startswith("framework packages")] == [
        ("framework packages (differs: local)", "torch 2.9.0+cu130, torchvision 0.24.0, horovod 0.28.1, python 3.11"),
        ("framework packages (differs: image)", "torch 2.9.0+cpu, torchvision not installed, horovod 0.28.1, python 3.11"),
        ("framework packages (differs: image)", "torch 2.13.0, torchvision not installed, horovod 0.28.1, python 3.11")]
    assert env["MPI"] == "Open MPI 4.1.4"                                   # the same everywhere: one row
    only_containers = dict(report.environment(image))
    assert only_containers["NIC model and count"].startswith("0 physical: the ranks saw only virtual")
    text = report.render(records, [], "r")
    assert tables.not_run(records) == [f"DDP over NCCL: 1 combination (compression none; 2 workers): {reason}"]
    assert "(4 ok, 0 failed, 3 skipped; 2 of them ran later or were skipped again, so 1 is listed below)" in text


def test_several_models_each_have_their_own_tables_and_ranking_in_readable_lines(tmp_path):
    """MNIST and ResNet-50 (as `invoke benchmark` runs them) in one folder: a section per
    model with its results table and its own ranking (no ranking mixes the models), and
    no line of a table over 160 characters."""
    mnist = [rec("ddp", "gloo", 1, 0.020, 3000.0, 0.93), rec("ddp", "gloo", 2, 0.030, 4200.0, 0.93),
             rec("horovod", "gloo", 1, 0.020, 3100.0, 0.93), rec("horovod", "gloo", 2, 0.025, 5000.0, 0.93)]
    resnet = []
    for r in mnist[:2]:
        r = json.loads(json.dumps(r))
        r["config"].update(model="resnet50", batch_size=8, data="synthetic")
        r["figures"]["throughput_img_s"] /= 1000
        r["record_id"] += "-resnet"
        resnet.append(r)
    records = mnist + resnet
    text = report.render(records, [], "r")
    assert "## Model mnist" in text and "## Model resnet50" in text
    mnist_part = text.split("## Model mnist")[1].split("## Model resnet50")[0]
    resnet_part = text.split("## Model resnet50")[1].split("\n## ")[0]
    for part, configs in ((mnist_part, {"ddp over gloo", "horovod over gloo"}), (resnet_part, {"ddp over gloo"})):
        ranking = part.split("#### Scaling, ranked")[1]
        labels = {ln.split("|")[2].strip() for ln in ranking.splitlines() if ln.startswith("| ")} - {"configuration"}
        assert labels == configs, ranking
    assert text.count("#### Scaling, ranked") == 2
    assert max(len(ln) for ln in text.splitlines() if ln.startswith("|")) <= 160


@pytest.mark.parametrize("number,text", [(92000, "9.20.0"), (90100, "9.1.0"), (91002, "9.10.2"),
                                         (8902, "8.9.2"), (7605, "7.6.5"), (None, "None")])
def test_cudnn_is_shown_as_a_version(number, text):
    """cudnn_version.h: CUDNN_VERSION = major*10000 + minor*100 + patch from cuDNN 9,
    major*1000 + minor*100 + patch before."""
    from lab.common.kit import cudnn_version_text
    assert cudnn_version_text(number) == text


def test_a_report_of_gpu_and_cpu_runs_says_under_each_table_which_devices_it_measured(tmp_path):
    """A one-GPU lab: np 1 on the GPU beside np 1 and 2 as CPU processes. The rows are
    told apart by their device and each table says which devices its rows measured; a
    report of one kind of device (the fixture's) says nothing of it."""
    cpu = [rec("ddp", "gloo", 1, 0.020, 3000.0, 0.93), rec("ddp", "gloo", 2, 0.030, 4200.0, 0.93),
           rec("ddp", "gloo", 2, 0.032, 4000.0, 0.93, compression="int8", payload=1032)]
    gpu = json.loads(json.dumps(rec("ddp", "nccl", 1, 0.002, 25000.0, 0.93)))
    gpu["config"]["device"], gpu["record_id"] = "cuda", "gpu"
    run = tmp_path / "lab"
    for r in cpu + [gpu]:
        results.append_record(run / results.RESULTS_FILE, r)
    text = report.write(str(run)).read_text()
    within = section(text, "Results within one server")
    assert "Devices: GPUs, one per rank and CPU processes" in within
    assert {row[0] for row in table(text, "Results within one server")} == {
        "cuda: ddp / nccl", "cpu: ddp / gloo", "cpu: ddp / gloo / int8"}
    assert "Devices: CPU processes." in section(text, "Gradient compression")
    assert "Devices:" not in report.render(RECORDS, [], "fixed")


def test_a_run_that_restarted_has_its_line(tmp_path, monkeypatch):
    """A job --max-restarts relaunched, recorded by bench's own relaunch loop: the report
    names it with what failed, where it resumed and the time lost; a report without one
    has no such section."""
    from lab.common import restarts
    from lab.host.places.local import LocalRunner
    from lab.host.run import bench
    from lab.host.settings import BenchSettings
    run = tmp_path / "fixed"
    rfile = run / results.RESULTS_FILE
    for r in RECORDS[:2]:
        results.append_record(rfile, r)
    launches = [rec("ddp", "gloo", 2, 0, 0, 0, status="failed", reason="rank 1 was killed (signal 9)"),
                rec("ddp", "gloo", 2, 0.030, 4200.0, 0.927)]

    def run_one(s, cfg, np, runner, rf, echo, load=None, torch_version=None):
        if cfg.restart:
            restarts.write_resumed(restarts.folder(rf.parent, cfg.attempt, cfg.restart), cfg.restart,
                                   from_step=30, checkpoint="step-00000030.pt", saved_at=1.0, resumed_at=2.0)
        results.append_record(rf, launches[cfg.restart])
        return 0 if cfg.restart else 1
    monkeypatch.setattr(bench, "run_one", run_one)
    assert bench.run_job(BenchSettings(np=[2], max_restarts=1, checkpoint_every=10),
                         RunConfig(attempt="000-job"), 2, LocalRunner(str(tmp_path)), rfile, print) == 0
    text = report.write(str(run)).read_text()
    part = section(text, "Runs that restarted")
    assert "ddp over gloo, np=2: ok after 1 relaunch(es): rank 1 was killed (signal 9), resumed from step 30" in part
    assert len(results.read_records(rfile)[0]) == 3          # the failed launch folded into its job
    plain = tmp_path / "plain"
    for r in RECORDS[:2]:
        results.append_record(plain / results.RESULTS_FILE, r)
    assert "## Runs that restarted" not in report.write(str(plain)).read_text()


def lab_records():
    """The records of the full `invoke lab` on a machine without GPU (lab.host.suites.
    course_plan), two repeats each: MNIST within one server (local, Horovod and DDP over
    Gloo and Horovod over MPI at 1 and 2 workers) and across the simulated cluster's two
    nodes (its image's torch); ResNet-50 across them; the LSTM within one server;
    compression at 2 workers only; the seven strategies on ResNet-50 at 2 workers only."""
    out = []

    def add(r, i, world=None, torch=None, **config):
        r = json.loads(json.dumps(r))
        r["config"].update(config, repeat=i)
        r["world"].update(world or {})
        r["manifest"]["torch"] = torch or r["manifest"]["torch"]
        # every run records what each rank held (lab.worker.train), whatever its strategy
        r["figures"].setdefault("held_bytes", [held(87360, 87360, 87360)] * r["world"]["np"])
        r["record_id"] += f"-{len(out)}"
        out.append(r)

    mnist = {"epochs": 8}
    resnet = {"model": "resnet50", "batch_size": 16, "epochs": 1, "max_steps": 8}
    cluster = {"world": {"place": "cluster"}, "torch": "2.13.0+cpu", "link": "1gbit"}
    for i in range(2):
        for fw, be in (("horovod", "gloo"), ("ddp", "gloo"), ("horovod", "mpi")):
            for np_, t in ((1, 1000.0), (2, 1700.0 + 50 * i)):
                add(rec(fw, be, np_, 0.02, t, 0.9), i, world={"place": "local"}, **mnist)
                add(rec(fw, be, np_, 0.02, t * 0.9, 0.9), i, **cluster, **mnist)
            add(rec(fw, be, 2, 0.02, 1200.0 + 40 * i, 0.9, nodes=2), i, **cluster, **mnist)
        for fw in ("horovod", "ddp"):
            for np_, t in ((1, 10.0), (2, 15.0 + i)):
                add(rec(fw, "gloo", np_, 2.0, t, 0.1), i, **cluster, **resnet)
            add(rec(fw, "gloo", 2, 2.0, 12.0 + i, 0.1, nodes=2), i, **cluster, **resnet)
            for comp in ("fp16", "int8", "int8-naive"):
                add(rec(fw, "gloo", 2, 0.02, 1600.0 + 30 * i, 0.9, compression=comp), i,
                    world={"place": "local"}, **mnist)
        for np_, t in ((1, 800.0), (2, 1300.0 + 20 * i)):
            add(rec("ddp", "gloo", np_, 0.04, t, 0.9), i, world={"place": "local"},
                model="lstm", batch_size=64, epochs=4)
        for s in ("ddp", "zero1", "fsdp", "pipeline", "model-parallel", "deepspeed", "rpc-pipeline"):
            r = strategy_rec(s, 2, 14.0 + i, [held(87360, 87360, 87360)] * 2, [300e6, 310e6], "16 per process")
            r["manifest"]["torch"] = "2.13.0"
            add(r, i, world={"place": "local"}, **{**resnet, "strategy": s})
    return out


def test_the_full_labs_curves_are_one_panel_per_model_every_title_within_its_panel():
    """After the full `invoke lab`: throughput.png and speedup.png have one panel per
    model that has a curve, each with lines; within one server solid, across servers
    dashed from the 1-worker run; the runs at one worker count only (compression at 2
    workers, the strategies) on a chart of their own; every title narrower than its panel."""
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer
    figs = curves.figures(lab_records())
    try:
        assert set(figs) == {"throughput.png", "speedup.png", curves.ONE_COUNT_FILE}
        for name in ("throughput.png", "speedup.png"):
            fig = figs[name]
            assert [ax.get_title() for ax in fig.axes] == ["mnist", "resnet50", "lstm"], name
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                assert [c for c in ax.containers if isinstance(c, ErrorbarContainer)], (name, ax.get_title())
                assert ax.title.get_window_extent(renderer).width <= ax.get_window_extent(renderer).width
            suptitle = fig.get_suptitle()
            assert "torch" not in suptitle and "step cap" not in suptitle
            mnist = {c.get_label(): c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)}
            # the cluster's torch tells nothing its place does not: left out
            assert set(mnist) == {f"{s}, {where}" for s in ("horovod / gloo", "ddp / gloo", "horovod / mpi")
                                  for where in ("local", "cluster", "cluster, across servers at 1gbit")}
            across = mnist["ddp / gloo, cluster, across servers at 1gbit"].lines[0]
            assert across.get_linestyle() == "--" and [round(x) for x in across.get_xdata()] == [1, 2]
            assert mnist["ddp / gloo, cluster"].lines[0].get_linestyle() == "-"
            assert not any("fp16" in label or "zero1" in label for ax in fig.axes
                           for label in (c.get_label() for c in ax.containers))
        one = figs[curves.ONE_COUNT_FILE]
        assert [ax.get_title() for ax in one.axes] == ["mnist", "resnet50"]
        labels = [t.get_text() for t in one.axes[1].get_yticklabels()]
        assert labels[:2] == ["ddp, ddp / gloo, 2 workers", "zero1, ddp / gloo, 2 workers"] and len(labels) == 7
        assert len(one.axes[0].get_yticklabels()) == 6          # 2 frameworks x 3 compressions
    finally:
        for f in figs.values():
            plt.close(f)


def test_the_full_labs_charts_are_written_without_a_word_from_matplotlib(tmp_path, capfd):
    """No warning (constrained layout's "axes sizes collapsed to zero" was one) and
    nothing on the terminal while the full lab's charts are drawn and saved."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = curves.plot(lab_records(), tmp_path)
    out, err = capfd.readouterr()
    assert [str(w.message) for w in caught] == [] and (out, err) == ("", "")
    assert written == ["throughput.png", "speedup.png", curves.ONE_COUNT_FILE, "memory.png"]
    text = report.render(lab_records(), written, "results/lab")
    assert "![one worker count](one-count.png)" in section(text, "Scalability curve")


def test_two_models_across_servers_are_compared_by_their_measured_step_parts(tmp_path):
    """ResNet-50 and VGG-16 as the lab's cross-server part runs them (2 workers on 2
    servers over 1gbit, DDP over Gloo): the report sets each one's share of the step in
    exposed communication side by side, with their gradient bytes and compute per sample,
    every figure from the records (the step parts as the ranks write them); models that
    did not run the same way are not compared."""
    import types

    from lab.worker import step_parts as worker_parts
    ddp = types.SimpleNamespace(parts_note=None, replicated=True)

    def model_rec(model, values, spans, batch, nodes=2, link="1gbit"):
        step = sum(spans.values())
        rows = [[{"data": 0.0, **spans, "waiting": 0.0, "step": step}] * 4 for _ in range(2)]
        r = rec("ddp", "gloo", 2, step, 2 * batch / step, 0.1, nodes=nodes)
        r["config"].update(model=model, batch_size=batch, link=link if nodes > 1 else "")
        r["figures"].update(gradient_values=values,
                            step_parts=worker_parts.record(ddp, rows, [[step] * 4] * 2))
        r["record_id"] += f"-{model}-{nodes}"
        return r

    resnet = {"other": 0.01, "forward": 0.30, "backward": 0.60, "communication": 0.30, "optimizer": 0.04}
    vgg = {"other": 0.01, "forward": 0.50, "backward": 1.00, "communication": 4.40, "optimizer": 0.09}
    records = [model_rec("resnet50", 23_528_522, resnet, 16), model_rec("vgg16", 134_300_362, vgg, 16),
               model_rec("vgg16", 134_300_362, vgg, 16, nodes=1)]    # within one server: no pair
    run = tmp_path / "lab"
    for r in records:
        results.append_record(run / results.RESULTS_FILE, r)
    text = report.write(str(run)).read_text()
    said = section(text, "Models compared: computation against communication")
    [line] = [ln for ln in said.splitlines() if ln.startswith("- ")]
    share = lambda s: round(100 * s["communication"] / sum(s.values()))     # noqa: E731
    compute = lambda s: (sum(s.values()) - s["communication"]) / 16        # noqa: E731
    assert line.startswith(f"- vgg16 spent {share(vgg)}% of its step in exposed communication against "
                           f"resnet50's {share(resnet)}% at 2 workers on 2 servers over 1gbit (DDP over Gloo, batch 16 a "
                           f"worker)"), line
    assert f"it has {134_300_362 / 23_528_522:.1f}x the gradient bytes (537 MB against 94 MB a step)" in line
    assert f"for {compute(vgg) / compute(resnet):.1f}x the compute per sample" in line
    assert "they are compared only where they ran the same way" in text
    # the two models not run the same way (VGG-16 within one server only): not compared
    apart = report.render([records[0], records[2]], [], "r")
    assert "Models compared" not in apart and "no figure of one is compared" in apart
