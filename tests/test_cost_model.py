"""The cost model of the data-parallel step (lab.report.cost_model) on constructed inputs:
the alpha-beta fit, the bucket schedules, the overlap they allow, and the report's
prediction and prediction.json built from records made by the code's own writers
(RunConfig.as_record, results.make_record, lab.worker.step_parts.record,
lab.common.collectives.bandwidths). No timing is measured here (one test reads the
doctor sweeps that the benchmark runs kept in the checkout recorded)."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.common import collectives, results
from lab.common.config import RunConfig
from lab.report import algorithms, lab_report, model_check, prediction
from lab.report import cost_model as cm
from lab.report import model_inputs as mi
from lab.report.cost_assumptions import ASSUMPTIONS
from lab.worker import step_parts

REPO = Path(__file__).resolve().parent.parent

MIB = 2**20


def points(alpha, beta, sizes, n=2, op="allreduce"):
    return [{"op": op, "size_bytes": s, "ranks": n,
             "time_s": alpha * algorithms.steps(op, n) + beta * algorithms.wire_bytes(op, s, n)} for s in sizes]


def test_the_fit_recovers_latency_and_per_byte_cost_and_extrapolates_in_n_and_size():
    alpha, beta = 50e-6, 1 / 0.1e9          # 50 us a step, 0.1 GB/s
    f = cm.fit(points(alpha, beta, [4096, 65536, 1 << 20, 16 << 20]))
    assert f.alpha_s == pytest.approx(alpha, rel=1e-6) and f.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert f.sizes == 4 and f.how.startswith("two regimes")     # 4 KiB timed: the latency from it
    g = cm.fit(points(alpha, beta, [65536, 1 << 20, 16 << 20]))
    assert g.how == "least squares" and g.alpha_s == pytest.approx(alpha, rel=1e-6)
    # ring all-reduce at 8 ranks: 14 latency steps, 2*7/8 of the bytes (nccl-tests' bus factor)
    assert f.time("allreduce", 1e6, 8) == pytest.approx(14 * alpha + 1.75e6 * beta)
    assert algorithms.wire_bytes("allreduce", 1e6, 8) == 1e6 * collectives.bus_factor("allreduce", 8)
    assert algorithms.steps("allgather", 4) == 3 and f.time("allreduce", 1e6, 1) == 0
    # noise that would make the latency negative keeps it at 0
    noisy = points(0.0, beta, [1e5, 1e6]) + [{"op": "allreduce", "size_bytes": 1e5, "ranks": 2, "time_s": 1e-7}]
    g = cm.fit(noisy)
    assert g.alpha_s >= 0 and g.beta_s_per_byte >= 0
    one = cm.fit(points(alpha, beta, [1 << 20]))
    assert one.alpha_s == 0 and one.how.startswith("one size")
    assert cm.fit([]) is None


def test_another_link_replaces_the_fitted_links_cost_and_delay():
    host = 1 / 2e9                            # the host's own per-byte cost
    f = cm.fit(points(1e-3, host + cm.FRAMING / 0.125e9, [1 << 16, 1 << 24]), link_gbs=0.125, delay_s=1e-3)
    ten = f.on_link(1.25)                     # 10 Gbit/s, no delay
    assert ten.beta_s_per_byte == pytest.approx(host + cm.FRAMING / 1.25e9)
    assert ten.alpha_s == pytest.approx(0.0, abs=1e-9)
    assert f.on_link(None).beta_s_per_byte == pytest.approx(host)
    # a payload byte takes more than a byte of the link: TCP's and Ethernet's headers and the
    # other way's ACKs, 6.8% more at MTU 1500
    assert cm.link_s_per_byte(0.0125) == pytest.approx(1 / 12.5e6 * 1514 / 1448 * (1 + 66 / 3028))


@pytest.mark.parametrize("folder", ["example-report-b", "model-bench-3", "model-bench-4", "model-bench-5",
                                    "model-bench-6", "model-bench-7", "model-bench-8",
                                    "model-bench-9", "model-bench-10"])
def test_a_payload_byte_costs_the_link_with_tcps_framing_as_doctors_sweep_on_it_measured(folder):
    """doctor's Gloo sweep across the simulated cluster's nodes on its 100 Mbit/s link, as
    the benchmark runs kept in the checkout saved it, fits a per-byte cost within 1% of the
    link's cost of a payload byte with TCP over Ethernet's framing (85.5 ns), not the rate's
    80 ns: so a fit moved to another link carries the framing too."""
    from lab.report import model_inputs
    [entry] = [e for e in model_inputs.load_sweeps(str(REPO / "tests" / "fixtures" / folder))
               if model_inputs.sweep_key(e) == ("ddp", "gloo", "cluster", True, "100mbit")]
    f = cm.fit(entry["points"], *mi.link_of("100mbit", 2), backend="gloo")
    assert f.beta_s_per_byte == pytest.approx(cm.link_s_per_byte(0.0125), rel=0.01)
    assert abs(f.beta_s_per_byte * 12.5e6 - 1) > 0.05


def test_a_shaped_links_bucket_lets_the_first_bytes_of_a_step_through_at_the_hosts_speed():
    from lab.common.link import tbf_burst_bytes
    from lab.host.places.compose import cluster
    # the simulated cluster's tbf: about 4 ms of traffic, at least 16 frames; netem has none
    assert tbf_burst_bytes("100mbit") == 50_000 and tbf_burst_bytes("1gbit") == 500_000
    assert tbf_burst_bytes("1mbit") == 24_000 and tbf_burst_bytes("100mbit/1ms") is None
    [tbf] = cluster.tc_commands("100mbit")
    assert tbf[tbf.index("burst") + 1] == "50000"
    host = 1 / 2e9
    f = cm.fit(points(1e-4, host + cm.FRAMING / 12.5e6, [1 << 16, 1 << 24]), link_gbs=0.0125, burst_bytes=50_000)
    assert f.burst_bytes == 50_000
    full = f.time("allreduce", 87_360, 2)
    # the bucket holds frames: 50 kB of them carry 50 kB / FRAMING of payload, 4 ms of the link
    t, left = f.cost("allreduce", 87_360, 2, 50_000)
    assert t == pytest.approx(full - 50_000 / 12.5e6) and left == pytest.approx(0.0, abs=1e-6)
    # MNIST's one bucket: exposed less the bucket's 4 ms; a link without a bucket pays it all
    one = cm.ddp_schedule(87_360, 1.0, 0.010, f, "allreduce", 2)
    assert one["exposed_s"] == pytest.approx(full - 50_000 / 12.5e6)
    plain = cm.ddp_schedule(87_360, 1.0, 0.010, f.on_link(0.0125, 0.001), "allreduce", 2)
    assert plain["exposed_s"] > one["exposed_s"] + 0.003
    # the bucket is spent once a step: Horovod's two cycles share it
    two = cm.horovod_schedule(100_000, 1.0, 0.010, f, "allreduce", 2, tensors=2, cycle_s=0.001, phases=1)
    assert two["collective_s"] == pytest.approx(2 * f.time("allreduce", 50_000, 2) - 50_000 / 12.5e6)
    assert "burst" in cm.predict(cm.Inputs("ddp", 2, 0.01, None, 87_360, 87_360, "allreduce"), f)["assumptions"]


def test_ddp_buckets_are_a_first_small_one_then_the_cap():
    assert cm.ddp_buckets(87_360) == [87_360]
    b = cm.ddp_buckets(102e6)
    assert b[0] == 1 * MIB and b[1:4] == [25 * MIB] * 3 and sum(b) == pytest.approx(102e6)
    assert len(b) == 5


def test_ddp_fills_a_bucket_with_whole_tensors_in_reverse_until_it_reaches_the_limit():
    # the model's order: 3 MiB, 0.5 MiB, 0.6 MiB; DDP starts from the last: 0.6 + 0.5 MiB
    # reaches the first bucket's 1 MiB, then 3 MiB stays under 25 MiB and closes the step
    assert cm.ddp_buckets(4.1 * MIB, tensor_bytes=[3 * MIB, 0.5 * MIB, 0.6 * MIB]) == [1.1 * MIB, 3 * MIB]
    # a tensor larger than the cap is a bucket of its own, never split
    assert cm.ddp_buckets(0, tensor_bytes=[40 * MIB, 2 * MIB]) == [2 * MIB, 40 * MIB]
    # ResNet-50's last bucket (the one always exposed) is what is left after the 25 MiB ones,
    # not a cut at exact bytes: here 9 + 8 MiB of small tensors after a 26 MiB bucket
    sizes = [9 * MIB, 8 * MIB, 26 * MIB, 2 * MIB]
    assert cm.ddp_buckets(sum(sizes), tensor_bytes=sizes) == [2 * MIB, 26 * MIB, 17 * MIB]
    f = cm.Fit(0.0, 1 / 1e9, 2, 2, "given")
    whole = cm.ddp_schedule(sum(sizes), 1.0, 30.0, f, "allreduce", 2, tensor_bytes=sizes)
    assert whole["buckets"] == 3 and whole["exposed_s"] == pytest.approx(f.time("allreduce", 17 * MIB, 2))


def test_open_mpis_allreduce_is_the_algorithm_its_tuned_component_picks_and_gloos_a_ring():
    # coll_tuned_decision_fixed.c (v4.1.4), commutative: under 4 ranks recursive doubling
    # below 4 KiB, the segmented ring at 87,360 B (with no segment size: the ring),
    # Rabenseifner from 256 KiB; 4 to 7 ranks Rabenseifner from 8 KiB
    assert algorithms.allreduce_algorithm("mpi", 2040, 2) == "recursive doubling"
    assert algorithms.allreduce_algorithm("mpi", 87_360, 2) == "segmented ring"
    assert algorithms.allreduce_algorithm("mpi", 40_000, 2) == "ring"
    assert algorithms.allreduce_algorithm("mpi", 100e6, 2) == "rabenseifner"
    assert algorithms.allreduce_algorithm("mpi", 100e6, 8) == "rabenseifner"
    assert algorithms.allreduce_algorithm("gloo", 100e6, 8) == "ring"
    # at 2 ranks every algorithm moves the buffer once; recursive doubling in 1 step
    assert [algorithms.steps("allreduce", 2, "mpi", s) for s in (2040, 87_360, 100e6)] == [1, 2, 2]
    assert algorithms.wire_bytes("allreduce", 100e6, 2, "mpi") == pytest.approx(100e6)
    # 8 ranks: Rabenseifner 2 log2 8 = 6 steps, 2 x 7/8 of the buffer; Gloo's ring 14 steps
    assert algorithms.steps("allreduce", 8, "mpi", 100e6) == 6 and algorithms.steps("allreduce", 8, "gloo") == 14
    assert algorithms.wire_bytes("allreduce", 4096, 8, "mpi") == pytest.approx(3 * 4096)   # recursive doubling
    # 6 ranks fold 2 into 4: Rabenseifner's halves swapped and one sent back, then the
    # result sent on: three steps and the buffer twice more; recursive doubling two steps
    assert algorithms.steps("allreduce", 6, "mpi", 100e6) == 2 * 2 + 3
    assert algorithms.steps("allreduce", 6, "mpi", 4096) == 2 + 2
    # a fit made on MPI's algorithm recovers its terms and extrapolates with it
    alpha, beta = 40e-6, 1 / 1e9
    pts = [{"op": "allreduce", "size_bytes": s, "ranks": n, "backend": "mpi",
            "time_s": alpha * algorithms.steps("allreduce", n, "mpi", s)
            + beta * algorithms.wire_bytes("allreduce", s, n, "mpi")} for s in (2040, 1 << 20, 16 << 20) for n in (2, 4)]
    f = cm.fit(pts, backend="mpi")
    assert f.alpha_s == pytest.approx(alpha, rel=1e-6) and f.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert f.time("allreduce", 1e6, 8) == pytest.approx(6 * alpha + 1.75e6 * beta)
    assert f.on_link(0.125).backend == "mpi"


def test_gradients_in_one_bucket_overlap_nothing_and_the_last_bucket_is_always_exposed():
    f = cm.Fit(100e-6, 1 / 1e9, 2, 2, "given")
    # the MNIST CNN's 87 KB: one bucket, ready when the backward ends, all of it exposed
    one = cm.ddp_schedule(87_360, 1.0, 0.010, f, "allreduce", 2)
    assert one["buckets"] == 1 and one["exposed_s"] == pytest.approx(f.time("allreduce", 87_360, 2))
    # 102 MB behind a long backward: everything but the last bucket hides
    big = cm.ddp_schedule(102e6, 1.0, 30.0, f, "allreduce", 2)
    last = cm.ddp_buckets(102e6)[-1]
    assert big["exposed_s"] == pytest.approx(f.time("allreduce", last, 2))
    # behind a short backward the exchange queues up: exposed is the total less what overlapped
    short = cm.ddp_schedule(102e6, 1.0, 0.01, f, "allreduce", 2)
    assert short["exposed_s"] > big["exposed_s"] and short["exposed_s"] <= short["collective_s"]
    # fp16 halves every bucket's bytes
    half = cm.ddp_schedule(102e6, 0.5, 30.0, f, "allreduce", 2)
    assert half["exposed_s"] == pytest.approx(f.time("allreduce", last / 2, 2))


def test_horovod_fuses_what_each_cycle_finds_ready_up_to_its_threshold():
    f = cm.Fit(0.0, 1 / 1e9, 2, 2, "given")
    # a cycle longer than the backward: one fused buffer in the first cycle after it; the
    # cycles' phase is spread over the cycle, so on average half a cycle after it starts
    slow = cm.horovod_schedule(50e6, 1.0, 0.010, f, "allreduce", 2, tensors=161, cycle_s=1.0)
    assert slow["buckets"] == 1 and slow["exposed_s"] == pytest.approx(0.5 - 0.010 + f.time("allreduce", 50e6, 2))
    # a fusion threshold of 10 MB cuts that buffer into 5
    cut = cm.horovod_schedule(50e6, 1.0, 0.010, f, "allreduce", 2, tensors=161, cycle_s=1.0, fusion=10e6)
    assert cut["buckets"] == 5
    # 1 ms cycles over a 1 s backward: no more collectives than tensors, most of it hidden
    fast = cm.horovod_schedule(50e6, 1.0, 1.0, f, "allreduce", 2, tensors=161, cycle_s=0.001)
    assert fast["buckets"] == 161 and fast["exposed_s"] < 0.01 * fast["collective_s"] + 0.001


def test_horovods_all_gather_fuses_up_to_the_threshold_in_gathered_bytes():
    # FuseResponses counts an all-gather's output (n x each rank's part) against the
    # threshold: 10 MB of parts on 4 ranks with a 8 MB threshold is 5 buffers of 2 MB parts
    f = cm.Fit(0.0, 1 / 1e9, 2, 2, "given")
    g = cm.horovod_schedule(10e6, 1.0, 0.010, f, "allgather", 4, tensors=1, cycle_s=1.0, fusion=8e6)
    assert g["buckets"] == 5
    r = cm.horovod_schedule(10e6, 1.0, 0.010, f, "allreduce", 4, tensors=1, cycle_s=1.0, fusion=8e6)
    assert r["buckets"] == 2


def test_horovods_tensors_become_ready_in_reverse_order_by_their_bytes():
    # 1 ms cycles, no cost per byte beyond 1 ns: a 9 MB tensor first in the model is the last
    # ready, at the backward's end, so its collective is exposed
    f = cm.Fit(0.0, 1 / 1e9, 2, 2, "given")
    sched = cm.horovod_schedule(10e6, 1.0, 1.0, f, "allreduce", 2, tensors=2, cycle_s=0.001,
                                tensor_bytes=[9e6, 1e6], phases=1)
    assert sched["exposed_s"] == pytest.approx(0.0005 + f.time("allreduce", 9e6, 2), rel=1e-3)


def test_a_horovod_cycle_waits_for_the_last_ones_work_and_costs_its_agreement():
    # 2 tensors ready at 1 and 2 ms, 5 ms a collective (latency only), 1 ms cycles, one phase
    # (cycles start at 0.5 ms + k ms): the first takes tensor 1 at 1.5 ms and works until
    # 6.5 ms, so the next starts then (not at 2.5 ms) and takes tensor 2: done at 11.5 ms
    f = cm.Fit(0.0025, 0.0, 2, 2, "given")
    plain = cm.horovod_schedule(2.0, 1.0, 0.002, f, "allreduce", 2, tensors=2, cycle_s=0.001, phases=1)
    assert plain["buckets"] == 2 and plain["cycles"] == 2
    assert plain["end_s"] == pytest.approx(0.0115) and plain["exposed_s"] == pytest.approx(0.0095)
    # a cycle cost of 1 ms: each of the two cycles with work is 1 ms longer
    costly = cm.horovod_schedule(2.0, 1.0, 0.002, f, "allreduce", 2, tensors=2, cycle_s=0.001,
                                 cycle_cost_s=0.001, phases=1)
    assert costly["end_s"] == pytest.approx(0.0135) and costly["buckets"] == 2
    # a cost longer than the backward: one cycle finds both tensors and fuses them
    slow = cm.horovod_schedule(2.0, 1.0, 0.002, f, "allreduce", 2, tensors=2, cycle_s=0.001,
                               cycle_cost_s=0.004, phases=1)
    assert slow["buckets"] == 1 and slow["cycles"] == 1


def test_the_cycle_cost_is_recovered_from_the_exposed_time_it_makes():
    f = cm.Fit(0.0, 1 / 0.125e9, 1, 1, "given")               # 1 Gbit/s, no latency
    args = (87_360, 1.0, 0.011, f, "allreduce", 2, 8)
    made = cm.horovod_schedule(*args, cycle_cost_s=0.0185)["exposed_s"]
    assert made > 0.025                                       # more than a cycle's cost
    assert cm.fit_cycle_cost(made, *args) == pytest.approx(0.0185, rel=1e-3)
    # no more exposed than the collectives alone make: no cycle cost
    assert cm.fit_cycle_cost(cm.horovod_schedule(*args)["exposed_s"] / 2, *args) == 0.0
    # the same through the model's inputs; for DDP, its bucket's cost beyond the collective
    # alone (one bucket of 87,360 B: 0.70 ms at 1 Gbit/s)
    x = cm.Inputs(framework="horovod", np=2, compute_s=0.0165, backward_s=0.011, grad_bytes=87_360,
                  payload_bytes=87_360, op="allreduce", tensors=8)
    assert cm.cycle_cost(x, f, made) == pytest.approx(0.0185, rel=1e-3)
    assert cm.cycle_cost(cm.Inputs(**{**x.__dict__, "framework": "ddp"}), f, made) == pytest.approx(
        made - 87_360 * 8e-9, rel=1e-6)
    p = cm.predict(cm.Inputs(**{**x.__dict__, "cycle_cost_s": 0.0185, "cycle_cost_from": "others"}), f)
    assert p["exposed_s"] == pytest.approx(made) and p["cycle_cost_s"] == 0.0185
    assert "cycle" in p["assumptions"] and p["step_s"] == pytest.approx(0.0165 + made)
    assert "cycle_none" in cm.predict(x, f)["assumptions"]


def rec(np, step_s, parts, nodes=1, link="", coll_s=None, framework="ddp", compression="none",
        ceiling=None, payload=87_360, with_parts=True, model="mnist"):
    """An ok record from the writers: step parts per rank from lab.worker.step_parts, the
    collective figure as lab.worker.collective.measure composes it."""
    cfg = RunConfig(framework=framework, backend="gloo", data="digits", epochs=1, batch_size=32,
                    compression=compression, link=link, model=model).as_record()
    strategy = SimpleNamespace(parts_note=None, replicated=True)
    rows = []
    for waited in ([0.0] if np == 1 else [0.0, parts["waiting"]]):
        at, t = {}, 0.0
        for mark, span in (("data", 0.0), ("step", 0.0005), ("forward", 0.0), ("backward", parts["forward"]),
                           ("computed", parts["backward"]), ("optimizer", parts["communication"] + waited),
                           ("end", parts["optimizer"])):
            t += span
            at[mark] = t
        rows.append([{**step_parts.parts_of(at, lambda a, b: b - a), "step": at["end"] - at["step"]}] * 4)
    f = {"throughput_img_s": 32 * np / step_s, "step_time_mean_s": step_s, "step_time_p50_s": step_s,
         "step_time_p95_s": step_s, "timed_steps": 4, "test_accuracy": 0.9, "final_loss": 0.3,
         "peak_memory_bytes": [1] * np, "lr_used": 0.01, "gradient_values": 87_360 // 4,
         "payload_bytes_per_step": payload, "wire_bytes_per_step_estimate": payload,
         "collective": "allreduce",
         "step_parts": step_parts.record(strategy, rows, [[step_s] * 4 for _ in rows])}
    if not with_parts:
        del f["step_parts"]
    if coll_s:
        f["collective_alone"] = {"op": "allreduce", "size_bytes": payload, "time_s": coll_s, "timed": 5,
                                 **collectives.bandwidths("allreduce", payload, coll_s, np), "ranks": np}
    if ceiling:
        f["ceiling"] = {"processes": np, "images_per_s": ceiling}
    hosts = [f"node{1 + i * nodes // np}" for i in range(np)]
    return results.make_record("ok", run_id="m", config={**cfg, "link": link}, np=np, nodes=nodes,
                               started_at="2026-11-26T10:00:00Z", finished_at="2026-11-26T10:01:00Z",
                               world={"hosts": hosts, "devices_per_node": np // nodes, "controller": "gloo",
                                      "place": "local"},
                               figures=f, epochs=[], step_times_s=[step_s] * 4)


PARTS_ONE = {"forward": 0.005, "backward": 0.010, "communication": 0.0, "waiting": 0.0, "optimizer": 0.001}
PARTS_TWO = {**PARTS_ONE, "communication": 0.002, "waiting": 0.003}
# the compute at 2 workers 1.25 times the 1-worker one's: forward, backward and optimizer
# 6.25 + 12.5 + 1.25 = 20 ms against 5 + 10 + 1 = 16 (rec's 0.5 ms before the forward is data)
PARTS_GROWN = {**PARTS_TWO, "forward": 0.00625, "backward": 0.0125, "optimizer": 0.00125}


def records():
    """DDP uncompressed with its compute ceilings, and fp16 without any (the ceiling runs no
    framework and no codec: the uncompressed runs' is fp16's too) and a longer wait."""
    return [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0),
            rec(2, 0.030, PARTS_GROWN, coll_s=0.002, ceiling=3000.0),  # parts 1.25, ceiling 1.33
            rec(1, 0.0160, PARTS_ONE, compression="fp16", payload=43_680),
            rec(2, 0.025, {**PARTS_TWO, "waiting": 0.005}, coll_s=0.0012, compression="fp16", payload=43_680)]


def sweeps(alpha=0.0005, beta=1e-9, backend="gloo", ranks=2, sizes=(4096, 65536, 1048576)):
    """doctor's sweep of `backend` within one server (place local) as the report stores it."""
    name = "collectives_mpi" if backend == "mpi" else "collectives"
    return mi.sweep_entries([sweep_check(name, backend, ranks, alpha, beta, sizes)])


def test_the_prediction_is_its_terms_and_the_error_is_against_the_measured_step(tmp_path):
    recs, sw = records(), sweeps()
    preds = {p["row"]["record"]["config"]["compression"]: p for p in prediction.predictions(recs, sw)}
    p = preds["none"]
    m = p["model"]
    # the collective from doctor's sweep alone (three sizes, latency and bandwidth), never
    # from the row's own probe (2 ms)
    assert p["fit"].alpha_s == pytest.approx(0.0005) and p["fit"].beta_s_per_byte == pytest.approx(1e-9)
    # the compute: the 1-worker step, slowed by the cores the ranks share (none recorded:
    # none shared), never by the row's own compute parts (1.25) nor its ceiling at 2
    assert m["slowdown"] == pytest.approx(1.0) and m["slowdown_from"] == "cores"
    # one bucket, ready at the end of the backward: all of it exposed
    coll = 2 * 0.0005 + 87_360e-9
    assert m["buckets"] == 1 and m["exposed_s"] == pytest.approx(coll)
    # waiting: the 1-worker run's steps are all alike here, so no straggler
    assert m["waiting_s"] == 0.0 and m["waiting_from"] == "the 1-worker run's step spread"
    assert p["predicted_ms"] == pytest.approx(16.5 + coll * 1000, rel=1e-6)
    # the ceiling at 2 processes checks the prediction (2 x 2000 img/s, measured 3000)
    assert p["ceiling_img_s"] == pytest.approx(4000.0) and p["ceiling_measured_img_s"] == pytest.approx(3000.0)
    e = p["explained"]
    assert e["slowdown"] == pytest.approx(1.25) and e["waiting_ms"] == pytest.approx(1.5, rel=1e-3)
    assert p["unexplained_ms"] == pytest.approx(30.0 - p["predicted_ms"])
    assert p["error"] == pytest.approx(p["predicted_ms"] / 30.0 - 1)
    assert p["predicted_speedup"] == pytest.approx(2 * 16.5 / p["predicted_ms"])
    assert {"ready", "cores", "straggler", "sweeps"} <= set(m["assumptions"])
    assert not {"slowdown_ceiling", "contention", "bucket", "waiting"} & set(m["assumptions"])
    # fp16: its own 1-worker run, half the payload
    assert preds["fp16"]["model"]["exposed_s"] == pytest.approx(2 * 0.0005 + 43_680e-9)
    assert p["baseline_ms"] is None          # on no link: no other link to start from

    run = tmp_path / "m"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    mi.save_sweeps(sw, str(run))
    lab_report.write(str(run))
    doc = json.loads((run / "prediction.json").read_text())
    [c] = [c for c in doc["configurations"] if c["configuration"] == "ddp / gloo"]
    t = c["terms"]
    assert c["predicted_step_ms"] == pytest.approx(t["compute_ms"] + t["exposed_communication_ms"] + t["waiting_ms"])
    assert t["compute_ms"] == pytest.approx(t["compute_one_worker_ms"] * t["slowdown"])
    assert t["slowdown_from"] == "cores" and t["horovod_cycle_cost_ms"] == 0
    assert c["explained"]["step_ms"] == pytest.approx(e["step_ms"])
    assert c["error"] == pytest.approx(c["predicted_step_ms"] / c["measured_step_ms"] - 1)
    assert {w["workers"] for w in doc["what_if"]} == {1, 2, 4, 8, 16, 64}
    assert {w["link_gbit"] for w in doc["what_if"]} == {1, 10, 100} and all(w["extrapolated"] for w in doc["what_if"])
    md = (run / "report.md").read_text()
    section = md.split("## Why it scales as it does", 1)[1].split("\n## ", 1)[0]
    header = next(ln for ln in section.splitlines() if ln.startswith("| configuration"))
    assert [h.strip() for h in header.strip("|").split("|")] == prediction.HEADERS
    assert "What if (extrapolated, not measured)" in section and "1 Gbit/s" in section
    assert ASSUMPTIONS["ready"] in section and ASSUMPTIONS["cores"] in section
    assert "4000 img/s predicted, 3000 measured (+33%)" in section


def test_without_doctors_sweep_the_row_is_not_predicted_only_explained(tmp_path):
    # the row's own collective probe does not stand in for doctor's sweep
    recs = [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0), rec(2, 0.030, PARTS_GROWN, coll_s=0.002)]
    assert prediction.predictions(recs) == []
    [u] = prediction.unpredicted(recs)
    assert "doctor" in u["why"] and "--save" in u["why"]
    assert u["explained"]["slowdown"] == pytest.approx(1.25)
    # no ceiling at 2 processes: predicted all the same (it only checks)
    [p] = prediction.predictions(recs, sweeps())
    assert p["ceiling_measured_img_s"] is None and p["ceiling_img_s"] == pytest.approx(4000.0)
    run = tmp_path / "m"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    lab_report.write(str(run))
    section = (run / "report.md").read_text().split("## Why it scales as it does", 1)[1].split("\n## ", 1)[0]
    assert "Not predicted: ddp / gloo at 2 workers (no collective sweep" in section
    assert "explained by its own measurements (not a prediction)" in section
    # what the step lost, split into its measured parts, and what fp16 would buy it (from
    # those parts): measurements, in the report without a prediction
    assert ("at 2 workers: measured, of the 7.5 ms the step lost against one worker, 27% (2.0 ms) is "
            "exposed communication (the allreduce of") in section and "(not predicted)." in section
    assert "with fp16 (half the payload, 0.0437 MB): predicted step 22.5 ms" in section
    [s] = prediction.measured(recs)
    assert s["prediction"] is None and s["gap"]["lost"] == pytest.approx(0.0075)
    assert s["gap"]["communication"] == pytest.approx(0.002) and s["gap"]["compute"] == pytest.approx(0.004)


def test_with_an_8_bit_codecs_note_the_backward_is_left_out_of_the_slowdown():
    one, two = rec(1, 0.0165, PARTS_ONE), rec(2, 0.030, {**PARTS_GROWN, "backward": 0.030}, coll_s=0.002)
    two["figures"]["step_parts"]["note"] = "the backward part holds the exchange of every bucket but the last"
    [u] = prediction.unpredicted([one, two])
    # (6.25 + 1.25) / (5 + 1): the backward's 30 ms holds collectives
    assert u["explained"]["slowdown"] == pytest.approx(1.25)


def test_what_if_grows_with_workers_on_a_slow_link_and_shrinks_on_a_fast_one():
    preds = prediction.predictions(records(), sweeps())
    cases = [c for c in prediction.what_if(records(), preds, sweeps()) if c["configuration"] == "ddp / gloo"]
    step = {(c["workers"], c["link_gbit"]): c["predicted_step_ms"] for c in cases}
    assert step[(1, 1)] == pytest.approx(16.5)                      # one worker: the compute alone
    assert step[(64, 1)] > step[(2, 1)] and step[(2, 1)] > step[(2, 100)]
    assert all(step[(n, 1)] >= step[(n, 10)] >= step[(n, 100)] for n in prediction.WHAT_IF_WORKERS)
    # the sweep's latency (0.5 ms a step) grows with the ring's 2(n-1) steps
    assert step[(64, 100)] - step[(2, 100)] > 0.5 * (2 * 63 - 2) * 0.99


def test_rows_without_a_timed_collective_are_listed_not_predicted_and_no_file_without_workers(tmp_path):
    recs = [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0), rec(2, 0.030, PARTS_TWO, ceiling=4000.0)]
    assert prediction.predictions(recs) == []
    [u] = prediction.unpredicted(recs)
    assert "no collective sweep" in u["why"]
    assert prediction.document(recs)["configurations"][0]["predicted_step_ms"] is None
    assert prediction.write_json(recs[:1], tmp_path) is None and not (tmp_path / "prediction.json").exists()


def test_the_published_cases_are_read_back_from_their_figures():
    cases = {name: (pred, meas) for name, pred, meas in model_check.published()}
    assert len(cases) == 6
    # the measured steps are the published speedups' (2 x compute / speedup)
    pred, meas = cases["DDP MNIST, 1 machine, 2 workers (ms)"]
    assert 2 * (meas - 11.7) / meas == pytest.approx(1.16)
    # the MNIST CNN's gradients are one DDP bucket: the collective is all exposed; the
    # compute grew by its published share of the lost step (39%), waiting 19%
    assert pred == pytest.approx(meas - 11.7 + 0.39 * 11.7 + 0.9 + 0.19 * 11.7)
    # the Horovod MNIST case's own 34 ms of exposed time fits the cycle cost, and says so;
    # the ResNet-50 case across the same link is predicted with that cost (another size)
    name = "Horovod MNIST, 2 servers, 1 Gbit/s (ms)" + model_check.SELF
    t1, t2, cycle = model_check._horovod_mnist_across()
    _, _, _, x, p = model_check._case(name, "horovod", t1, t2, 5.6, model_check.MNIST_GRAD,
                                      model_check.MNIST_GRAD, 0.0, 8, cycle_cost=cycle, unit=1e-3, parts=True)
    assert p["exposed_s"] == pytest.approx(0.034, rel=1e-3) and x.cycle_cost_from == "itself"
    assert cases[name][0] == pytest.approx(t1 + 34.0, rel=1e-3) and cycle > 0
    table = "\n".join(model_check.lines(model_check.published()))
    assert "without the cases fitted on themselves" in table and "(5 cases)" in table


def test_model_checks_table_gives_each_cases_own_runs_and_counts_the_far_errors_inside_them(tmp_path):
    """The span of a configuration's own runs beside its error, and of the cases off by more
    than 25%, how many were predicted between their fastest and slowest run (records from
    the writers; the cases' predictions are given, so the count is the table's alone)."""
    twos = [rec(2, s, PARTS_TWO) for s in (0.004, 0.007, 0.005)]
    for r in twos:                  # each run's median step is not its mean: the mean is the step
        r["figures"]["step_time_p50_s"] = 0.5 * r["figures"]["step_time_mean_s"]
    one = rec(2, 0.006, PARTS_TWO, compression="fp16")                 # a configuration run once
    for r in [rec(1, 0.003, PARTS_ONE), *twos, rec(1, 0.003, PARTS_ONE, compression="fp16"), one]:
        results.append_record(tmp_path / results.RESULTS_FILE, r)
    runs = model_check.run_steps(model_check._records([str(tmp_path)]))
    [(name, steps)] = [(n, v) for n, v in runs.items() if len(v) > 1]
    [single] = [n for n, v in runs.items() if len(v) == 1]
    assert name.endswith("2 workers") and steps == [4.0, 5.0, 7.0] and runs[single] == [6.0]
    other = name.replace("2 workers", "4 workers")         # a case with no runs of its own here
    cases = [(name, 6.5, 5.0), (name + model_check.SELF, 3.0, 5.0), (name, 5.1, 5.0), (other, 9.0, 5.0),
             (name, 7.0, 5.0), (single, 8.0, 6.0)]
    table = model_check.lines(cases, runs=runs)
    assert table[0] == "| case | predicted step | measured step | its runs | error |"
    assert table[2] == f"| {name} | 6.5 | 5 | 4-7 | +30% |"           # +30%: within 4-7
    assert table[3].endswith("| 4-7 | -40% |")                        # -40%: below the fastest
    assert table[5].endswith("| 5 |  | +80% |")                         # no runs: no span
    assert table[6].endswith("| 4-7 | +40% |")                        # +40%: at the slowest, within
    assert table[7].endswith("| 6 |  | +33% |")                         # one run: no span
    assert ("off by more than 25%: 5 case(s), 2 of them predicted within the span of their own runs "
            "(the fastest to the slowest)") in table
    assert "its runs" not in model_check.lines(cases)[0]                # without runs: as before
    recs = model_check._records([str(tmp_path)])
    plan = model_check.planned(recs, "np=4")          # not run yet: no runs of its own
    assert plan and model_check.run_steps(recs + plan) == runs


def test_the_recorded_runs_without_sweeps_are_explained_not_predicted():
    """The records of tests/fixtures/model-check (docs/pages/report.md publishes their
    table) were saved without doctor's sweeps: no row is predicted, each says why, and what
    their own parts explain keeps the published errors (recorded data, no timing)."""
    from pathlib import Path
    rows, why, explained = model_check.of_results(str(Path(__file__).parent / "fixtures" / "model-check"))
    assert rows == [] and len(why) == 8 and all("doctor" in w for w in why)
    assert len(explained) == 8
    errors = sorted(abs(pred / meas - 1) for _, pred, meas in explained)
    assert (errors[3] + errors[4]) / 2 <= 0.10 and errors[-1] <= 0.25


def across(np, step_s, parts, link, coll_s=None, framework="ddp", ceiling=None, payload=87_360):
    r = rec(np, step_s, parts, nodes=2 if np > 1 else 1, link=link if np > 1 else "", coll_s=coll_s,
            framework=framework, ceiling=ceiling, payload=payload)
    r["world"]["place"] = "cluster"
    return r


def sweep_check(name, backend, ranks, alpha, beta, sizes=(65536, 1048576, 16777216)):
    """A passed check of doctor's with envcheck.collectives' value: per size its time."""
    rows = [{"size_bytes": s, "time_us": 1e6 * (alpha * algorithms.steps("allreduce", ranks)
                                                + beta * algorithms.wire_bytes("allreduce", s, ranks)),
             **collectives.bandwidths("allreduce", s, 1.0, ranks)} for s in sizes]
    return {"name": name, "status": "PASS", "where": "cluster (2 nodes)", "fix": "",
            "value": {"backend": backend, "ranks": ranks, "ops": {"allreduce": rows}}}


def test_doctors_sweep_is_stored_where_the_report_finds_it_and_fits_its_key(tmp_path):
    checks = [sweep_check("collectives_across", "gloo", 2, 0.002, 1 / 12.5e6),
              sweep_check("collectives", "gloo", 2, 0.0001, 1e-9),
              {"name": "collectives_mpi", "status": "FAIL", "value": None, "fix": "no MPI"}]
    checks[1]["where"] = "image dl-lab-kit:cpu"
    entries = mi.sweep_entries(checks, link="100mbit")
    assert [(e["framework"], e["backend"], e["place"], e["across"], e["link"]) for e in entries] == [
        ("ddp", "gloo", "cluster", True, "100mbit"), ("ddp", "gloo", "image", False, "")]
    assert mi.save_sweeps(entries, str(tmp_path)) == tmp_path / mi.SWEEP_FILE
    assert mi.save_sweeps([], str(tmp_path / "none")) is None
    (tmp_path / "run1").mkdir()
    assert mi.load_sweeps(str(tmp_path / "run1")) == entries       # the folder above a run folder
    fitted = prediction.fits([], mi.load_sweeps(str(tmp_path)))
    f = fitted[("ddp", "gloo", "cluster", True, "100mbit")]
    assert f.sizes == 3 and f.alpha_s == pytest.approx(0.002) and f.beta_s_per_byte == pytest.approx(1 / 12.5e6)
    assert f.link_gbs == pytest.approx(0.0125)


def test_a_left_out_configuration_is_predicted_from_its_1_worker_run_and_doctors_sweep_alone(tmp_path, capsys):
    """np 2 on 2 servers at 100 Mbit left out: its collective from doctor's sweep on that
    link, its compute from the 1-worker run; nothing of its own records nor of the 1 Gbit
    run goes in (changing or deleting them changes nothing), and where it has not run yet it
    is still predicted."""
    one = across(1, 0.0165, PARTS_ONE, "", ceiling=2000.0)
    gbit = across(2, 0.030, {**PARTS_TWO, "waiting": 0.004}, "1gbit", coll_s=0.002, ceiling=3600.0)
    left = across(2, 0.040, PARTS_GROWN, "100mbit", coll_s=0.5, ceiling=100.0)
    sweep = mi.sweep_entries([sweep_check("collectives_across", "gloo", 2, 0.001, cm.FRAMING / 12.5e6)], "100mbit")
    test = model_check.leave_out_test("np=2,nodes=2,link=100mbit")
    [p] = prediction.predictions([one, gbit, left], sweep, test)
    assert p["row"]["record"] is left and p["fit"].link_gbs == pytest.approx(0.0125)
    assert p["model"]["slowdown"] == 1.0 and p["model"]["waiting_s"] == 0.0
    # the link's bucket (tbf: 50 kB at 100 Mbit/s) sends the step's first 50 kB unshaped
    coll = 0.001 * 2 + (87_360 * cm.FRAMING - 50_000) / 12.5e6
    assert p["predicted_ms"] == pytest.approx(16.5 + coll * 1000, rel=1e-3)
    # the no-model baseline: the 1 Gbit run's 30 ms plus the payload beyond the bucket at 100 Mbit
    base = 30.0 + 1000 * (87_360 - 50_000 / cm.FRAMING) * cm.link_s_per_byte(0.0125)
    assert p["baseline_ms"] == pytest.approx(base - 1000 * max(0.0, 87_360 - 125_000 / cm.FRAMING)
                                             * cm.link_s_per_byte(0.125))
    other = across(2, 0.090, {**PARTS_GROWN, "waiting": 0.05}, "100mbit", coll_s=0.05, ceiling=1.0)
    [q] = prediction.predictions([one, gbit, other], sweep, test)
    assert q["predicted_ms"] == pytest.approx(p["predicted_ms"]) and q["step_ms"] == pytest.approx(90.0)
    # the target's own records deleted, the other multi-worker run deleted: the same prediction
    [plan] = model_check.planned([one, gbit], "np=2,nodes=2,link=100mbit")
    [r] = prediction.predictions([one, plan], sweep, test)
    assert r["predicted_ms"] == pytest.approx(p["predicted_ms"])
    # without doctor's sweep across the servers: the one within a server, moved to the link
    [m] = prediction.predictions([one, gbit, left], sweeps(), test)
    assert m["fit"].link_gbs == pytest.approx(0.0125) and "moved" in m["fit"].how
    # not run yet: planned from the 1 Gbit run, predicted, "not run yet" in model_check
    for x in (one, gbit):
        results.append_record(tmp_path / "r" / results.RESULTS_FILE, x)
    mi.save_sweeps(sweep, str(tmp_path))
    assert plan["planned"] and plan["config"]["link"] == "100mbit"
    # a model named in the spec picks the runs to start from: a ResNet-50 run is not made
    # into an MNIST one with ResNet-50's data and batch
    resnet = across(2, 1.5, PARTS_TWO, "1gbit", coll_s=0.2, ceiling=10.0)
    resnet["config"] = {**resnet["config"], "model": "resnet50", "data": "synthetic", "batch_size": 4}
    [only] = model_check.planned([one, gbit, resnet], "np=2,nodes=2,link=100mbit,model=mnist")
    assert only["config"]["model"] == "mnist" and only["config"]["data"] == "digits"
    assert model_check.planned([one, gbit, resnet], "np=2,nodes=2,link=100mbit,model=lstm") == []
    assert model_check.main(["--leave-out", "np=2,nodes=2,link=100mbit", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 doctor sweep(s) alone" in out
    assert f"| {p['predicted_ms']:.4g} | not run yet |" in out
    assert model_check.main(["--leave-out", "np", str(tmp_path)]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert model_check.main(["--leave-out", "np=two", str(tmp_path)]) == 2
    assert "whole number" in capsys.readouterr().err


def test_the_model_benchmark_measures_every_term_and_prints_the_errors(tmp_path, capsys):
    from lab.benchmarks import model_bench
    cmds = model_bench.commands("R", 1)
    benches = [c for part in cmds.values() for c in part if c[0] == "bench"]
    # the DDP runs measure the ceiling, Horovod's share it (the same model, batch and
    # place); doctor's sweeps are saved where the report looks
    assert all(("--ceiling" in c) == (c[c.index("--framework") + 1] == "ddp") for c in benches)
    assert all(c[c.index("--results-dir") + 1] == "R" for c in benches)
    assert all("--save" in c for part in cmds.values() for c in part if c[0] == "doctor")
    assert {c[c.index("--link") + 1] for c in benches if "--link" in c} == {"1gbit", "100mbit"}
    test = model_check.leave_out_test(model_bench.LEFT_OUT)
    assert test({"world": {"np": 2, "nodes": 2}, "config": {"link": "100mbit", "model": "mnist"}})
    assert all(c[c.index("--link") + 1] == "100mbit" and c[c.index("--np") + 1] == "2" for c in cmds["leftout"])
    assert {(c[c.index("--framework") + 1], c[c.index("--backend") + 1]) for c in cmds["leftout"]} == {
        ("ddp", "gloo"), ("horovod", "gloo,mpi")}
    # predicted after the MNIST runs across the nodes, and run right after its prediction
    order = list(model_bench.PARTS)
    assert order.index("across") + 1 == order.index("predict") == order.index("leftout") - 1
    assert all("mnist" not in " ".join(c) and "resnet50" in c for c in cmds["across-resnet50"])
    for r in records():
        results.append_record(tmp_path / "m" / results.RESULTS_FILE, r)
    mi.save_sweeps(sweeps(), str(tmp_path / "m"))
    out = model_bench.table(str(tmp_path))
    assert out[0].startswith("| case |") and "within one server: median absolute error" in "\n".join(out)
    assert "across servers: no case" in out
    assert out[-1].endswith("(--repeat 2 or more): no case")        # one run a configuration
    # a second run of the 2-worker uncompressed configuration, 20% slower: the floor is
    # each run against the other (-1/6 and +1/5), the 1-worker rows not counted
    results.append_record(tmp_path / "m" / results.RESULTS_FILE, rec(2, 0.036, PARTS_GROWN, coll_s=0.002))
    results.append_record(tmp_path / "m" / results.RESULTS_FILE, rec(1, 0.020, PARTS_ONE, ceiling=2000.0))
    assert model_bench.table(str(tmp_path))[-1].endswith("median absolute difference 18%, largest 20% (2 cases)")
    with pytest.raises(SystemExit):
        model_bench.main(["--only", "nope"])
    assert "--only takes within" in capsys.readouterr().err


def test_the_model_benchmark_prints_the_machines_speed_on_each_link():
    """The ceilings of the runs across servers, per link: a slower machine during the
    left-out runs shows as a ceiling below the one at 1 Gbit/s."""
    from lab.benchmarks import model_bench
    recs = [across(2, 0.030, PARTS_TWO, "1gbit", coll_s=0.002, ceiling=3000.0),
            across(2, 0.030, PARTS_TWO, "1gbit", coll_s=0.002, ceiling=3200.0),
            across(2, 0.040, PARTS_TWO, "100mbit", coll_s=0.007, ceiling=2325.0),
            across(1, 0.0165, PARTS_ONE, "", ceiling=2000.0)]
    [line] = model_bench.speed_by_link(recs)
    assert line.endswith("3,100 images/s around the 1gbit runs (1.00), 2,325 images/s around the 100mbit runs (0.75)")
    assert model_bench.speed_by_link(recs[2:3] + recs[:2]) == [line]     # the fastest link first
    assert "mnist at 2 processes on 2 servers" in line
    assert model_bench.speed_by_link(recs[:2]) == []          # one link: nothing to compare
    # one server's runs on each link (`--nodes 1,2 --link X` makes them): no link of theirs
    # to measure, so no line of their own, and the lines across servers stand as they were
    one_server = []
    for link, ceiling in (("1gbit", 9000.0), ("100mbit", 1000.0)):
        r = rec(2, 0.030, PARTS_TWO, nodes=1, link=link, coll_s=0.002, ceiling=ceiling)
        r["world"]["place"] = "cluster"
        one_server.append(r)
    assert model_bench.speed_by_link(recs + one_server) == [line]


def test_the_split_of_what_the_step_lost_gives_a_part_that_shrank_a_share_below_zero():
    """The four shares of the lost step add up to 100%: compute that shrank at 2 workers
    (4 ms of forward against 5) shows as -40% of the 2.5 ms lost, not as 0% beside a
    negative time."""
    from lab.report import prediction_text
    shrank = {**PARTS_TWO, "forward": 0.004}
    recs = [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0), rec(2, 0.020, shrank, coll_s=0.002, ceiling=3000.0)]
    [s] = prediction.measured(recs)
    # the ranks' mean: one waited 3 ms, the other none
    assert s["gap"]["compute"] == pytest.approx(-0.001) and s["gap"]["lost"] == pytest.approx(0.0025)
    [sentence] = prediction_text.split_sentences(recs, [s])
    assert "of the 2.5 ms the step lost against one worker, 80% (2.0 ms) is exposed communication" in sentence
    assert "60% (1.5 ms) waiting for the slowest rank, -40% (-1.0 ms) compute that shrank, and" in sentence
    shares = [int(x) for x in re.findall(r"(-?\d+)% \(-?\d", sentence)]
    assert sum(shares) == 100


def test_ddps_bucket_cost_is_recovered_from_its_exposed_time_and_adds_to_each_bucket():
    """A bucket's collective costs more in the step than timed alone (the hand-off to the
    process group's thread): the cost per bucket that makes a measured exposed time, and the
    prediction carrying it, bucket by bucket."""
    f = cm.Fit(0.0, 1 / 0.125e9, 1, 1, "given")               # 1 Gbit/s, no latency
    grads = 3 * cm.MIB                                         # buckets of 1, then 2 MiB
    args = (grads, 1.0, 0.030, f, "allreduce", 2)
    plain = cm.ddp_schedule(*args)
    made = cm.ddp_schedule(*args, bucket_cost_s=0.004)
    assert plain["buckets"] == made["buckets"] == 2
    assert made["collective_s"] == pytest.approx(plain["collective_s"] + 2 * 0.004)
    assert cm.fit_bucket_cost(made["exposed_s"], *args) == pytest.approx(0.004, rel=1e-6)
    assert cm.fit_bucket_cost(plain["exposed_s"] / 2, *args) == 0.0
    x = cm.Inputs(framework="ddp", np=2, compute_s=0.045, backward_s=0.030, grad_bytes=grads,
                  payload_bytes=grads, op="allreduce")
    p = cm.predict(cm.Inputs(**{**x.__dict__, "cycle_cost_s": 0.004, "cycle_cost_from": "others"}), f)
    assert p["exposed_s"] == pytest.approx(made["exposed_s"]) and p["bucket_cost_s"] == 0.004
    assert p["cycle_cost_s"] == 0.0 and "bucket" in p["assumptions"]
    assert "bucket_none" in cm.predict(x, f)["assumptions"]


def test_horovods_timings_lose_the_wait_for_its_cycle_before_the_fit():
    """A synchronous Horovod operation timed back to back takes one cycle while its work fits
    in one and its work once it outlasts one (operations.cc, RunLoopOnce; measured: doctor's
    sweep at a 1 and a 5 ms cycle). Doctor's Horovod sweep and DDP's sweep with the same
    timings fit different collectives, and a run's record gives its own cycle time."""
    cycle = 0.001
    assert cm.horovod_collective_s(0.00107, cycle) == pytest.approx(0.00014)
    assert cm.horovod_collective_s(0.0073, cycle) == 0.0073                # outlasted two cycles: all of it
    assert cm.horovod_collective_s(0.0015, cycle) == pytest.approx(0.001)  # w of 1.5 ms, or a cycle missed
    assert cm.horovod_collective_s(0.0009, cycle) == pytest.approx(0.05 * 0.0009)
    assert cm.horovod_collective_s(0.0015, 0.0) == 0.0015                  # no cycle (XLA ops)
    sizes = (4096, 65536, 1048576, 16777216)
    # the collective costs 20 us a step and 1 ns a byte: below a cycle up to 1 MiB, 17 ms at 16 MiB
    work = {s: 20e-6 * algorithms.steps("allreduce", 2, "mpi", s) + 1e-9 * algorithms.wire_bytes("allreduce", s, 2, "mpi")
            for s in sizes}

    def timed(w, cyc):
        return cyc + 70e-6 if w < cyc else w              # + the sleep's overshoot

    def check(name, cycle_ms=1.0):
        c = sweep_check(name, "gloo", 2, 0.0, 0.0, sizes)
        for row in c["value"]["ops"]["allreduce"]:
            row["time_us"] = 1e6 * timed(work[row["size_bytes"]], cycle_ms / 1000)
        c["value"]["cycle_time_ms"] = cycle_ms
        c["where"] = "local processes"
        return c
    [hvd, ddp] = mi.sweep_entries([check("collectives_mpi"), check("collectives")])
    fitted = prediction.fits([], [hvd, ddp])
    f_hvd, f_ddp = fitted[("horovod", "mpi", "local", False, "")], fitted[("ddp", "gloo", "local", False, "")]
    assert f_ddp.time("allreduce", 87_360, 2) > 0.5 * cycle                # the cycle taken for the collective
    assert f_hvd.time("allreduce", 87_360, 2) < 0.2 * cycle
    # 16 MiB outlasted a cycle: its work, not collapsed to a cycle's overshoot, though the
    # three below a cycle (each weighed against its 1.07 ms) pull it down
    assert 5 * cycle < f_hvd.time("allreduce", 16777216, 2) < work[16777216]
    # a sweep that ran at a 5 ms cycle: its 5.07 ms below 1 MiB are that cycle, not a collective
    [slow] = mi.sweep_entries([check("collectives_mpi", cycle_ms=5.0)])
    assert slow["cycle_time_ms"] == 5.0
    f_slow = prediction.fits([], [slow])[("horovod", "mpi", "local", False, "")]
    assert f_slow.time("allreduce", 87_360, 2) < 0.2 * 0.005
    # a run's own probe at the cycle time its record holds (one size: the fit goes through it)
    runs = [rec(2, 0.030, PARTS_TWO, coll_s=0.0062, framework="horovod") for _ in range(2)]
    runs[1]["world"]["horovod"] = {"cycle_time_ms": 5.0, "fusion_threshold_bytes": cm.HOROVOD_FUSION}
    for r, own in zip(runs, (0.0062, 2 * (0.0062 - 0.005))):
        [f] = prediction.fits([r]).values()
        assert f.time("allreduce", 87_360, 2) == pytest.approx(own)
    # and the model says it relies on it for Horovod's rows
    x = cm.Inputs(framework="horovod", np=2, compute_s=0.01, backward_s=0.006, grad_bytes=87_360,
                  payload_bytes=87_360, op="allreduce", slowdown=1.0)
    assert "cycle_wait" in cm.predict(x, f_hvd)["assumptions"] and "cycle_wait" in ASSUMPTIONS
    assert "cycle_wait" not in cm.predict(cm.Inputs(**{**x.__dict__, "framework": "ddp"}), f_ddp)["assumptions"]
