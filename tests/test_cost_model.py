"""The cost model of the data-parallel step (lab.report.cost_model) on constructed inputs:
the alpha-beta fit, the bucket schedules, the overlap they allow, and the report's
prediction and prediction.json built from records made by the code's own writers
(RunConfig.as_record, results.make_record, lab.worker.step_parts.record,
lab.common.collectives.bandwidths). No timing is measured here."""
import json
from types import SimpleNamespace

import pytest

from lab.common import collectives, results
from lab.common.config import RunConfig
from lab.report import cost_model as cm
from lab.report import lab_report, model_check, prediction
from lab.worker import step_parts

MIB = 2**20


def points(alpha, beta, sizes, n=2, op="allreduce"):
    return [{"op": op, "size_bytes": s, "ranks": n,
             "time_s": alpha * cm.steps(op, n) + beta * cm.wire_bytes(op, s, n)} for s in sizes]


def test_the_fit_recovers_latency_and_per_byte_cost_and_extrapolates_in_n_and_size():
    alpha, beta = 50e-6, 1 / 0.1e9          # 50 us a step, 0.1 GB/s
    f = cm.fit(points(alpha, beta, [4096, 65536, 1 << 20, 16 << 20]))
    assert f.alpha_s == pytest.approx(alpha, rel=1e-6) and f.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert f.sizes == 4 and f.how == "least squares"
    # ring all-reduce at 8 ranks: 14 latency steps, 2*7/8 of the bytes (nccl-tests' bus factor)
    assert f.time("allreduce", 1e6, 8) == pytest.approx(14 * alpha + 1.75e6 * beta)
    assert cm.wire_bytes("allreduce", 1e6, 8) == 1e6 * collectives.bus_factor("allreduce", 8)
    assert cm.steps("allgather", 4) == 3 and f.time("allreduce", 1e6, 1) == 0
    # noise that would make the latency negative keeps it at 0
    noisy = points(0.0, beta, [1e5, 1e6]) + [{"op": "allreduce", "size_bytes": 1e5, "ranks": 2, "time_s": 1e-7}]
    g = cm.fit(noisy)
    assert g.alpha_s >= 0 and g.beta_s_per_byte >= 0
    one = cm.fit(points(alpha, beta, [1 << 20]))
    assert one.alpha_s == 0 and one.how.startswith("one size")
    assert cm.fit([]) is None


def test_another_link_replaces_the_fitted_links_cost_and_delay():
    host = 1 / 2e9                            # the host's own per-byte cost
    f = cm.fit(points(1e-3, host + 1 / 0.125e9, [1 << 16, 1 << 24]), link_gbs=0.125, delay_s=1e-3)
    ten = f.on_link(1.25)                     # 10 Gbit/s, no delay
    assert ten.beta_s_per_byte == pytest.approx(host + 1 / 1.25e9)
    assert ten.alpha_s == pytest.approx(0.0, abs=1e-9)
    assert f.on_link(None).beta_s_per_byte == pytest.approx(host)


def test_ddp_buckets_are_a_first_small_one_then_the_cap():
    assert cm.ddp_buckets(87_360) == [87_360]
    b = cm.ddp_buckets(102e6)
    assert b[0] == 1 * MIB and b[1:4] == [25 * MIB] * 3 and sum(b) == pytest.approx(102e6)
    assert len(b) == 5


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
    # a cycle longer than the backward: one fused buffer after it, all exposed
    slow = cm.horovod_schedule(50e6, 1.0, 0.010, f, "allreduce", 2, tensors=161, cycle_s=1.0)
    assert slow["buckets"] == 1 and slow["exposed_s"] == pytest.approx(1.0 - 0.010 + f.time("allreduce", 50e6, 2))
    # a fusion threshold of 10 MB cuts that buffer into 5
    cut = cm.horovod_schedule(50e6, 1.0, 0.010, f, "allreduce", 2, tensors=161, cycle_s=1.0, fusion=10e6)
    assert cut["buckets"] == 5
    # 1 ms cycles over a 1 s backward: no more collectives than tensors, most of it hidden
    fast = cm.horovod_schedule(50e6, 1.0, 1.0, f, "allreduce", 2, tensors=161, cycle_s=0.001)
    assert fast["buckets"] == 161 and fast["exposed_s"] < 0.01 * fast["collective_s"] + 0.001


def rec(np, step_s, parts, nodes=1, link="", coll_s=None, framework="ddp", compression="none",
        ceiling=None, payload=87_360):
    """An ok record from the writers: step parts per rank from lab.worker.step_parts, the
    collective figure as lab.worker.collective.measure composes it."""
    cfg = RunConfig(framework=framework, backend="gloo", data="digits", epochs=1, batch_size=32,
                    compression=compression, link=link).as_record()
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


def records():
    return [rec(1, 0.0165, PARTS_ONE, ceiling=2000.0),
            rec(2, 0.030, PARTS_TWO, coll_s=0.002, ceiling=3200.0),              # slowdown 1.25
            rec(1, 0.0160, PARTS_ONE, compression="fp16", payload=43_680),
            rec(2, 0.025, PARTS_TWO, coll_s=0.0012, compression="fp16", payload=43_680)]


def test_the_prediction_is_its_terms_and_the_error_is_against_the_measured_step(tmp_path):
    recs = records()
    preds = {p["row"]["record"]["config"]["compression"]: p for p in prediction.predictions(recs)}
    p = preds["none"]
    m = p["model"]
    # two sizes of the same back end and place: alpha and beta from both
    assert p["fit"].sizes == 2 and p["fit"].alpha_s > 0
    assert m["slowdown"] == pytest.approx(2 * 2000 / 3200)
    assert m["buckets"] == 1 and m["exposed_s"] == pytest.approx(p["fit"].time("allreduce", 87_360, 2))
    assert m["exposed_s"] == pytest.approx(0.002, rel=1e-6)     # the fit goes through its own points
    assert m["waiting_s"] == pytest.approx(0.003, rel=1e-3)
    assert p["predicted_ms"] == pytest.approx((16.5 * 1.25) + 2.0 + 3.0, rel=1e-3)
    assert p["unexplained_ms"] == pytest.approx(30.0 - p["predicted_ms"])
    assert p["error"] == pytest.approx(p["predicted_ms"] / 30.0 - 1)
    assert p["predicted_speedup"] == pytest.approx(2 * 16.5 / p["predicted_ms"])
    assert "ready" in m["assumptions"] and "slowdown" not in m["assumptions"]
    assert "slowdown" in preds["fp16"]["model"]["assumptions"]      # no ceiling at 2 there

    run = tmp_path / "m"
    for r in recs:
        results.append_record(run / results.RESULTS_FILE, r)
    lab_report.write(str(run))
    doc = json.loads((run / "prediction.json").read_text())
    [c] = [c for c in doc["configurations"] if c["configuration"] == "ddp / gloo"]
    t = c["terms"]
    assert c["predicted_step_ms"] == pytest.approx(t["compute_ms"] + t["exposed_communication_ms"] + t["waiting_ms"])
    assert t["compute_ms"] == pytest.approx(t["compute_one_worker_ms"] * t["slowdown"])
    assert c["error"] == pytest.approx(c["predicted_step_ms"] / c["measured_step_ms"] - 1)
    assert {w["workers"] for w in doc["what_if"]} == {1, 2, 4, 8, 16, 64}
    assert {w["link_gbit"] for w in doc["what_if"]} == {1, 10, 100} and all(w["extrapolated"] for w in doc["what_if"])
    md = (run / "report.md").read_text()
    section = md.split("## Why it scales as it does", 1)[1].split("\n## ", 1)[0]
    header = next(ln for ln in section.splitlines() if ln.startswith("| configuration"))
    assert [h.strip() for h in header.strip("|").split("|")] == prediction.HEADERS
    assert "What if (extrapolated, not measured)" in section and "1 Gbit/s" in section
    assert cm.ASSUMPTIONS["ready"] in section and cm.ASSUMPTIONS["link"] in section
    assert max(len(ln) for ln in section.splitlines() if ln.startswith("|")) <= 160


def test_what_if_grows_with_workers_on_a_slow_link_and_shrinks_on_a_fast_one():
    preds = prediction.predictions(records())
    cases = [c for c in prediction.what_if(records(), preds) if c["configuration"] == "ddp / gloo"]
    step = {(c["workers"], c["link_gbit"]): c["predicted_step_ms"] for c in cases}
    assert step[(1, 1)] == pytest.approx(16.5)                      # one worker: the compute alone
    assert step[(64, 1)] > step[(2, 1)] and step[(2, 1)] > step[(2, 100)]
    assert all(step[(n, 1)] >= step[(n, 10)] >= step[(n, 100)] for n in prediction.WHAT_IF_WORKERS)


def test_rows_without_a_timed_collective_are_listed_not_predicted_and_no_file_without_workers(tmp_path):
    recs = [rec(1, 0.0165, PARTS_ONE), rec(2, 0.030, PARTS_TWO)]
    assert prediction.predictions(recs) == []
    [u] = prediction.unpredicted(recs)
    assert "no collective timed" in u["why"]
    assert prediction.document(recs)["configurations"][0]["predicted_step_ms"] is None
    assert prediction.write_json(recs[:1], tmp_path) is None and not (tmp_path / "prediction.json").exists()


def test_the_published_cases_are_read_back_from_their_figures():
    cases = {name: (pred, meas) for name, pred, meas in model_check.published()}
    assert len(cases) == 6
    # the measured steps are the published speedups' (2 x compute / speedup)
    pred, meas = cases["DDP MNIST, 1 machine, 2 workers"]
    assert 2 * (meas - 11.7) / meas == pytest.approx(1.16)
    # the MNIST CNN's gradients are one DDP bucket: the collective is all exposed
    assert pred == pytest.approx(meas - 11.7 + 0.9 + 0.19 * 11.7)
