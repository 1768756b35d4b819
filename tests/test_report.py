"""`invoke report` from a fixed set of records, checked table by table, the curves
written as PNG files, the analysis computed from the figures, failures shown."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.common.config import RunConfig
from lab.report import lab_report as report
from lab.report import summary

REPO = Path(__file__).resolve().parent.parent


def rec(framework, backend, np, step_s, tput, acc, compression="none", nodes=1, payload=None,
        zeroed=None, status="ok", reason=""):
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
        world={"hosts": hosts, "devices_per_node": np // nodes, "controller": backend},
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


def test_within_server_table(written):
    text, _ = written
    rows = table(text, "Results within one server")
    by = {(r[0], r[3]): r for r in rows}
    assert by[("horovod / gloo", "2")][4:9] == ["25.00", "5,120", "1.60", "80%", "92.90%"]
    assert by[("ddp / gloo", "2")][6:8] == ["1.40", "70%"]
    assert by[("ddp / gloo / int8", "2")][6] == "n/a"        # no 1-worker int8 run to compare with
    assert ("horovod / mpi", "2") not in by                  # a 2-server run: the next table
    assert by[("ddp / nccl", "2")][4].startswith("SKIPPED: the nccl back end")
    assert all(r[1] == "1" for r in rows)


def test_across_server_table(written):
    text, _ = written
    row, failed = table(text, "Results across servers")
    assert row[:4] == ["horovod / gloo", "2", "1", "2"]
    assert row[6:8] == ["0.94", "47%"]                       # against the 1-worker run: 3000/3200
    # A failed 2-server run is a row of this table (its record carries world.nodes).
    assert failed[:2] == ["horovod / mpi", "2"] and failed[4].startswith("FAILED: node node2")


def test_compression_table(written):
    text, _ = written
    rows = {r[2]: r for r in table(text, "Gradient compression")}
    assert set(rows) == {"none", "int8", "int8-naive"}
    assert rows["none"][6:] == ["4,000", "4,000", "0%"]
    assert rows["int8"][5:] == ["93.00%", "1,032", "1,032", "74%"]
    assert rows["int8-naive"][5] == "9.70%"


def test_failures_are_shown_not_holes(written):
    text, _ = written
    rows = table(text, "Failures")
    assert ["horovod", "mpi", "none", "2", "failed", "node2", "node node2 stopped during the run"] in rows
    assert any(r[4] == "skipped" and "GPUs only" in r[6] for r in rows)


def test_analysis_is_computed_from_the_figures(written):
    text, _ = written
    a = section(text, "Analysis")
    assert "At 2 workers, horovod over gloo scaled best: 80% efficiency (5,120 images/s)." in a
    assert "Efficiency fell to 70% for ddp over gloo at 2 workers on 1 server(s)." in a
    # 20 ms at 1 worker, 25 ms at 2: 5 ms of communication, ratio 4.00
    assert "20.0 ms of compute (the 1-worker step) against 5.0 ms more" in a and "ratio of 4.00" in a
    assert "int8 reached 93.00% against 92.70% uncompressed (+0.30 points)" in a
    assert "handed 74% fewer gradient bytes" in a
    assert "naive 8-bit cast ended at 9.70%" in a and "99.8% of the nonzero gradient values" in a


def test_curves_are_png_files(written):
    text, run = written
    for name in ("throughput.png", "speedup.png"):
        data = (run / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"]({name})" in text


def test_report_of_nothing_is_one_sentence(tmp_path):
    for path, words in ((tmp_path / "nope", "does not exist"), (tmp_path, "no records")):
        cp = subprocess.run([sys.executable, "-m", "invoke", "report", str(path)], cwd=REPO,
                            capture_output=True, text=True)
        assert cp.returncode == 2 and words in cp.stderr and "Traceback" not in cp.stderr


@pytest.mark.parametrize("example", ["example-report", "example-report-b"])
def test_the_example_report_is_what_its_records_give(tmp_path, example):
    """The README's examples (tests/fixtures/example-report and the second run of the
    same sweep, example-report-b) regenerate from their records."""
    import shutil
    src = Path(__file__).parent / "fixtures" / example
    run = tmp_path / "cpu-sweep"
    run.mkdir()
    shutil.copy(src / results.RESULTS_FILE, run / results.RESULTS_FILE)
    text = report.write(str(run)).read_text()
    expected = (src / "report.md").read_text().replace("`results/cpu-sweep`", f"`{run}`")
    assert text == expected


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
    s = report.series(both)
    assert len(s) == 4                                        # 2 setups x (none, int8)
    assert {k[0] for k in s} == {"mnist, batch 32: ", "resnet50, batch 8: "}
    assert dict(s[("mnist, batch 32: ", "ddp", "gloo", "none", False)]) == {1: 3000.0, 2: 4200.0}
    comp = report.compression_rows(both)
    assert {row[0] for row in comp} == {"mnist, batch 32: ddp / gloo", "resnet50, batch 8: ddp / gloo"}
    assert len(comp) == 4
    assert report.series(recs) and all(k[0] == "" for k in report.series(recs))   # one setup: no label


def test_accuracy_on_synthetic_data_is_not_a_figure():
    from lab.report import summary
    r = rec("ddp", "gloo", 1, 0.02, 3000.0, 0.101)
    r["config"]["data"] = "synthetic"
    [row] = summary.rows([r])
    assert row["accuracy"] is None
    assert summary.render([row]).splitlines()[-1].rstrip(" |").endswith("n/a")
    assert report.result_rows([r], across=False)[0][report.RESULT_HEADERS.index("accuracy")] == "n/a"


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
    text = " ".join(report.analysis(records))
    assert "scaled best" in text and "do not tell them apart" in text
    apart = (repeats("ddp", 1, [1000.0, 1010.0]) + repeats("ddp", 2, [1900.0, 1910.0])
             + repeats("horovod", 1, [1000.0, 1010.0]) + repeats("horovod", 2, [1200.0, 1210.0]))
    text = " ".join(report.analysis(apart))
    assert "scaled best" in text and "do not tell them apart" not in text


def test_the_curves_have_a_panel_per_setup_and_back_end_with_error_bars():
    """Read from the figures' artists: panels, colours by framework, line styles by
    compression, error bars as wide as the repeats' spread, an ideal line per panel."""
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
    figs = report.figures(records)
    assert set(figs) == {"throughput.png", "speedup.png"}
    try:
        ax_gloo, ax_mpi = [a for a in figs["throughput.png"].axes if a.get_visible()]
        assert (ax_gloo.get_title(), ax_mpi.get_title()) == ("gloo", "mpi")
        bars = {c.get_label(): c for c in ax_gloo.containers if isinstance(c, ErrorbarContainer)}
        assert set(bars) == {"ddp, none", "horovod, none", "horovod, fp16"}
        ddp = bars["ddp, none"]
        assert ddp.lines[0].get_color() == report.FRAMEWORK_COLORS["ddp"]
        assert bars["horovod, fp16"].lines[0].get_linestyle() == "--"
        assert list(ddp.lines[0].get_ydata()) == [1050.0, 1900.0]          # medians
        # The np=2 bar spans the repeats' min-max, 1,850 to 2,000.
        segments = ddp.lines[2][0].get_segments()
        assert [tuple(p[1] for p in seg) for seg in segments][1] == pytest.approx((1850.0, 2000.0))
        # Speedup panel: its bar at np=2 spans 1850/1100 .. 2000/1000; an ideal line y = x.
        sp_gloo = [a for a in figs["speedup.png"].axes if a.get_visible()][0]
        sbars = {c.get_label(): c for c in sp_gloo.containers if isinstance(c, ErrorbarContainer)}
        seg = sbars["ddp, none"].lines[2][0].get_segments()[1]
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
    rows = report.strategy_rows(STRATEGY_RECORDS)
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
    fig = report.memory_figure(STRATEGY_RECORDS)
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
    assert not any("scaled best" in s or "compute-to-communication" in s
                   for s in report.analysis(pipe))
    text = " ".join(report.analysis(RECORDS + pipe))
    assert "scaled best" in text and "pipeline" not in text
    # the ddp strategy by Horovod and by torch: two labels in the strategies' table
    labels = {report.strategy_label(r, RECORDS) for r in RECORDS if r["status"] == "ok"}
    assert {"ddp (horovod / gloo)", "ddp (ddp / gloo)"} <= labels
