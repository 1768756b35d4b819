"""A configuration not run, predicted from one worker and doctor's sweeps
(lab.report.cost_model.predict_target, lab.report.what_if: `invoke predict`) on constructed
inputs: the terms, the latency kept where small messages were timed, the cores shared,
strategies other than data parallelism not predicted as DDP, rows with and without cores
of their own kept apart, and nothing taken from the target's own records. No timing."""
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.report import algorithms, prediction, what_if
from lab.report import cost_model as cm
from lab.report import model_inputs as mi
from lab.report.cost_assumptions import ASSUMPTIONS
from lab.report.records import ReportError
from tests.test_cost_model import PARTS_GROWN, PARTS_ONE, across, rec, sweep_check, sweeps

REPO = Path(__file__).resolve().parent.parent


def points(alpha, beta, sizes, n=2):
    return [{"op": "allreduce", "size_bytes": s, "ranks": n,
             "time_s": alpha * algorithms.steps("allreduce", n, "gloo", s)
             + beta * algorithms.wire_bytes("allreduce", s, n, "gloo")} for s in sizes]


def test_the_latency_is_kept_where_small_messages_were_timed():
    # doctor's Gloo sweep within one server in run 10 of the model's benchmark (recorded):
    # 4 KiB in 1.22 ms, 16 KiB in 3.20, 1 MiB in 2.06; the latency from the small messages
    # (their median 2.2 ms, 1.1 a step) no more than the fastest message allows (0.61 a step)
    [e] = [e for e in mi.load_sweeps(str(REPO / "tests" / "fixtures" / "model-bench-10"))
           if e["backend"] == "gloo" and e["place"] == "local"]
    f = cm.fit(e["points"], backend="gloo")
    small = min(p["time_s"] for p in e["points"] if p["size_bytes"] <= cm.SMALL_BYTES)
    fastest = min(p["time_s"] for p in e["points"]) / 2
    assert f.how.startswith("two regimes") and f.alpha_s == pytest.approx(fastest)
    assert f.alpha_s > small / 2 / 3
    # consistent constructed points: both terms back
    pts = points(0.0006, 1e-9, (4096, 1 << 20, 16 << 20, 64 << 20))
    g = cm.fit(pts, backend="gloo")
    assert g.alpha_s == pytest.approx(0.0006, rel=1e-6) and g.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)
    # no small message timed: least squares, as before
    h = cm.fit(points(0.0, 1e-9, (65536, 1048576, 16777216)), backend="gloo")
    assert "two regimes" not in h.how


def test_across_servers_without_small_messages_the_latency_is_the_hosts_sweeps():
    across_ = mi.sweep_entries([sweep_check("collectives_across", "gloo", 2, 0.0, cm.FRAMING / 12.5e6)], "100mbit")
    host = sweeps(alpha=0.0004, beta=1e-9)
    f = mi.sweep_fit(across_ + host, "gloo", "cluster", True)
    assert f.alpha_s == pytest.approx(0.0004) and "host's sweep" in f.how
    assert f.link_gbs == pytest.approx(0.0125)
    # within one server: the host's own
    assert mi.sweep_fit(across_ + host, "gloo", "local", False).alpha_s == pytest.approx(0.0004)
    assert mi.sweep_fit(across_ + host, "mpi", "local", False) is None


def test_the_algorithm_grows_the_collective_in_ranks_and_a_target_may_name_another():
    f = cm.Fit(0.001, 1e-9, 3, 3, "least squares", backend="gloo")
    size = 100e6
    ring = f.time("allreduce", size, 64)
    assert ring == pytest.approx(0.001 * 126 + 1e-9 * size * 2 * 63 / 64)
    t = cm.target_fit(f, cm.Target(workers=64, per_server=1, link_gbit=None, algorithm="recursive-doubling"))
    assert t.time("allreduce", size, 64) == pytest.approx(0.001 * 6 + 1e-9 * size * 6)
    r = cm.target_fit(f, cm.Target(workers=64, algorithm="rabenseifner"))
    assert r.time("allreduce", size, 64) == pytest.approx(0.001 * 12 + 1e-9 * size * 2 * 63 / 64)
    tree = cm.target_fit(f, cm.Target(workers=64, algorithm="tree"))
    assert tree.time("allreduce", size, 64) == pytest.approx(0.001 * 12 + 1e-9 * size * 12)
    # Open MPI's own choice where none is named: its tuned table (Rabenseifner above 64 KiB at 8 ranks)
    mpi = cm.Fit(0.001, 1e-9, 3, 3, "x", backend="mpi")
    assert algorithms.allreduce_algorithm("mpi", size, 8) == algorithms.RABENSEIFNER
    assert mpi.time("allreduce", size, 8) == pytest.approx(0.001 * 6 + 1e-9 * size * 2 * 7 / 8)


def test_ranks_sharing_cores_slow_each_other_by_the_cores_there_are():
    assert cm.shared_slowdown(2, 1, 2) == 1.0              # own cores
    assert cm.shared_slowdown(4, 1, 2) == 2.0              # oversubscribed: turns on 2 cores
    assert cm.shared_slowdown(3, 1, 2) == pytest.approx(1.5)
    assert cm.shared_slowdown(2, 2, 2) == 2.0              # threads count
    assert cm.shared_slowdown(1, 4, 2, 2) == 1.0           # the 1-worker run had the same turns
    assert cm.shared_slowdown(8, 1, None) == 1.0           # cores not known: not shared


def test_the_stragglers_wait_is_the_expected_maximum_of_n_steps_less_their_mean():
    steps = [0.010, 0.010, 0.010, 0.014]
    assert cm.straggler_wait(steps, 1) == 0.0 and cm.straggler_wait([0.01] * 4, 8) == 0.0
    # two draws: the maximum is 14 ms unless both drew 10 (9/16)
    assert cm.straggler_wait(steps, 2) == pytest.approx(0.010 * 9 / 16 + 0.014 * 7 / 16 - 0.011)
    assert cm.straggler_wait(steps, 64) > cm.straggler_wait(steps, 4) > cm.straggler_wait(steps, 2)


def one(framework="ddp", strategy="ddp", steps=None, cores=2):
    return cm.OneWorker(framework=framework, backend="gloo", compute_s=0.0165, backward_s=0.010,
                        grad_bytes=87_360.0, payload_bytes=87_360.0, batch=32, threads=1, cores=cores,
                        step_times_s=steps, ceiling_img_s=2000.0, strategy=strategy,
                        tensors=cm.MODEL_TENSORS["mnist"])


def test_a_target_is_predicted_from_one_worker_its_cores_and_the_sweeps_fit():
    f = cm.Fit(0.0005, 1e-9, 3, 3, "least squares", backend="gloo")
    p = cm.predict_target(one(steps=[0.016, 0.017]), f, cm.Target(workers=4))     # 4 ranks on 2 cores
    assert p["why"] is None and p["slowdown"] == 2.0 and p["compute_s"] == pytest.approx(0.033)
    assert p["waiting_s"] == pytest.approx(2.0 * cm.straggler_wait([0.016, 0.017], 4))
    assert p["exposed_s"] == pytest.approx(f.time("allreduce", 87_360, 4))         # one bucket, all exposed
    assert p["throughput_img_s"] == pytest.approx(4 * 32 / p["step_s"])
    assert p["efficiency"] == pytest.approx(p["speedup"] / 4)
    assert p["ceiling_img_s"] == pytest.approx(4 * 2000.0 / 2.0)                  # what --ceiling at 4 checks
    # on servers of their own at 10 Gbit/s: no slowdown, the link's cost
    q = cm.predict_target(one(), f, cm.Target(workers=4, per_server=1, link_gbit=10.0, latency_s=50e-6))
    assert q["slowdown"] == 1.0 and q["fit"].link_gbs == pytest.approx(1.25)
    assert q["fit"].alpha_s == pytest.approx(0.0005 + 50e-6)
    # Horovod: each cycle with work costs its agreement, a small all-reduce at the fit's cost
    h = cm.predict_target(one("horovod"), f, cm.Target(workers=4))
    assert h["cycle_cost_s"] == pytest.approx(f.time("allreduce", 8.0, 4)) and "agreement" in h["assumptions"]


@pytest.mark.parametrize("strategy", ["fsdp", "zero1", "pipeline", "deepspeed"])
def test_a_strategy_other_than_data_parallelism_is_not_predicted_as_ddp(strategy):
    f = cm.Fit(0.0005, 1e-9, 3, 3, "least squares", backend="gloo")
    p = cm.predict_target(one(strategy=strategy), f, cm.Target(workers=2))
    assert p["why"].startswith("not predicted: ") and "step_s" not in p
    # in the report: its rows listed with why, and no term of theirs reaches DDP's rows
    recs = [rec(1, 0.0165, PARTS_ONE), rec(2, 0.030, PARTS_GROWN)]
    other = [rec(1, 0.0165, PARTS_ONE), rec(2, 0.5, PARTS_GROWN)]
    for r in other:
        r["config"] = {**r["config"], "strategy": strategy}
    [ddp] = prediction.predictions(recs, sweeps())
    [alone] = prediction.predictions(recs + other, sweeps())
    assert alone["predicted_ms"] == ddp["predicted_ms"]
    [u] = prediction.unpredicted(recs + other, sweeps())
    assert u["why"] == cm.not_predicted(strategy) and u["explained"] is None


def test_rows_with_and_without_cores_of_their_own_never_share_a_term():
    """A cluster's 2-node runs on pinned cores and on shared ones: separate rows, each
    predicted from the 1-worker run and its own description; the ceilings keyed apart."""
    base = [across(1, 0.0165, PARTS_ONE, "", ceiling=2000.0)]
    own = across(2, 0.030, PARTS_GROWN, "1gbit", ceiling=4000.0)
    own["world"]["node_cores"] = {"node1": "0", "node2": "1"}
    shared = across(2, 0.060, PARTS_GROWN, "1gbit", ceiling=1000.0)
    sw = mi.sweep_entries([sweep_check("collectives_across", "gloo", 2, 0.001, cm.FRAMING / 125e6)], "1gbit")
    preds = {bool(p["row"]["record"]["world"].get("node_cores")): p
             for p in prediction.predictions(base + [own, shared], sw)}
    assert set(preds) == {True, False}
    assert preds[True]["ceiling_measured_img_s"] == 4000.0 and preds[False]["ceiling_measured_img_s"] == 1000.0
    [only_own] = prediction.predictions(base + [own], sw)
    assert only_own["predicted_ms"] == preds[True]["predicted_ms"]


def test_deleting_the_targets_records_changes_nothing(tmp_path):
    """Every multi-worker row's prediction with all records, and with only the 1-worker
    runs and the sweep (the target planned from its description): the same."""
    base = across(1, 0.0165, PARTS_ONE, "", ceiling=2000.0)
    base["step_times_s"] = [0.016, 0.0165, 0.018, 0.0162]
    runs = [across(2, 0.030, PARTS_GROWN, "1gbit", coll_s=0.002, ceiling=3000.0),
            across(2, 0.050, PARTS_GROWN, "100mbit", coll_s=0.02, ceiling=3100.0)]
    sw = mi.sweep_entries([sweep_check("collectives_across", "gloo", 2, 0.001, cm.FRAMING / 12.5e6)], "100mbit")
    full = {p["row"]["record"]["config"]["link"]: p["predicted_ms"]
            for p in prediction.predictions([base, *runs], sw)}
    assert len(full) == 2
    for link in full:
        # the target described by another run's record moved to its link (what model_check's
        # planned rows are): no figure of the target's own runs is there
        other = next(r for r in runs if r["config"]["link"] != link)
        plan = {**other, "config": {**other["config"], "link": link}, "planned": True}
        [p] = prediction.predictions([base, plan], sw)
        assert p["predicted_ms"] == pytest.approx(full[link])


def test_invoke_predict_prints_the_step_throughput_speedup_efficiency_and_assumptions(tmp_path):
    for r in [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0), rec(2, 0.030, PARTS_GROWN)]:
        results.append_record(tmp_path / "r" / results.RESULTS_FILE, r)
    mi.save_sweeps(sweeps(), str(tmp_path / "r"))
    out = what_if.from_flags({"results": str(tmp_path / "r"), "np": "8", "per_server": "1", "link": "10gbit"})
    text = "\n".join(out)
    assert out[0].startswith("Predicted from the 1-worker run of ddp / gloo")
    assert "8 workers, 1 a server on 8 servers at 10 Gbit/s" in out[0]
    assert "step " in out[1] and "scaling efficiency" in out[2] and "images/s" in out[2]
    assert "Assumptions:" in text and ASSUMPTIONS["cores"] in text and ASSUMPTIONS["sweeps"] in text
    stated = what_if.from_flags({"throughput": "200", "batch": "64", "gradient_mb": "102", "np": "4",
                                 "sweeps_from": str(tmp_path / "r")})
    assert stated[0].startswith("Predicted from a stated device: 200 images/s at batch 64")
    for flags, says in (({"np": "x"}, "--np takes a whole number"), ({"np": "2"}, "give --results FOLDER"),
                        ({"results": str(tmp_path / "r"), "link": "fast", "per_server": "1"}, "--link takes a rate"),
                        ({"results": str(tmp_path / "r"), "algorithm": "bcube"}, "--algorithm is one of"),
                        ({"results": str(tmp_path / "r"), "np": "4", "per_server": "2"}, "need the link")):
        with pytest.raises(ReportError, match=says):
            what_if.from_flags(flags)
    cp = subprocess.run([sys.executable, "-m", "invoke", "predict", "--results", str(tmp_path / "r"), "--np", "4",
                         "--algorithm", "nope"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
