"""Each step split into its parts (lab.worker.step_parts) and the report's use of them
(lab.report.step_parts, the prediction's measured split): the arithmetic on marks made
by the class itself, then real ranks of Horovod and DDP over Gloo and MPI, a rank made
slow on purpose, and the report of those records."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.common import results
from lab.report import lab_report, prediction
from lab.report import step_parts as report_parts
from lab.worker import step_parts
from tests.conftest import requires_horovod, requires_mpirun

REPO = Path(__file__).resolve().parent.parent


class Clock:
    """A settable clock for StepParts' marks on the CPU."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def one_step(sp: step_parts.StepParts, clock: Clock, spans: dict, horovod: bool) -> None:
    """Mark one step as the training loop and Strategy.step do, `spans` seconds apart."""
    def at(where, after=0.0):
        clock.t += after
        sp.mark(where)
    at("data")
    at("step", spans["data"])
    at("forward", spans["other"])
    at("backward", spans["forward"])
    if horovod:
        at("communication", spans["backward"])
        at("optimizer", spans["communication"])
    else:
        clock.t += spans["backward"]
        sp._at["computed"] = clock()            # what the last gradient's hook records
        at("optimizer", spans["communication"])
    at("end", spans["optimizer"])
    sp.end(timed=True)


SPANS = {"data": 0.001, "other": 0.002, "forward": 0.010, "backward": 0.020,
         "communication": 0.005, "optimizer": 0.003}


@pytest.mark.parametrize("horovod", [True, False])
def test_one_steps_parts_come_from_its_marks_and_add_up_to_it(horovod, monkeypatch):
    clock = Clock()
    sp = step_parts.StepParts(None, enabled=True)
    monkeypatch.setattr(sp, "_now", clock)
    one_step(sp, clock, SPANS, horovod)
    [row] = sp.rows
    step = sum(v for k, v in SPANS.items() if k != "data")
    assert row.pop("step") is None                # end() was given no loop time
    assert row == pytest.approx({**SPANS, "waiting": 0.0})
    sp.rows[0]["step"] = step                    # as the training loop timed it
    s = step_parts.summary(sp.rows, None, [step])
    assert s["sum_s"] == pytest.approx(step) and s["sum_within_tolerance"]
    # a step the marks do not cover (time spent outside them) fails the check
    sp.rows[0]["step"] = step * 1.2
    assert not step_parts.summary(sp.rows, None, [step])["sum_within_tolerance"]


def test_a_step_without_its_marks_is_not_kept_and_warm_up_steps_are_not_kept(monkeypatch):
    clock = Clock()
    sp = step_parts.StepParts(None, enabled=True)
    monkeypatch.setattr(sp, "_now", clock)
    sp.mark("data")
    sp.mark("end")
    sp.end(timed=True)                           # a strategy whose step marks nothing
    sp.mark("data")
    sp.end(timed=False)
    assert sp.rows == []
    off = step_parts.StepParts(None, enabled=False)
    off.mark("data")
    off.end(timed=True)
    assert off.rows == [] and off._at == {}


def test_the_least_exposed_rank_is_the_one_waited_for():
    # step 0: rank 1 arrived last (least exposed); step 1: rank 0 did
    split = step_parts.split_waiting([[0.010, 0.004], [0.003, 0.009]])
    assert split[0] == [pytest.approx((0.003, 0.007)), pytest.approx((0.004, 0.0))]
    assert split[1] == [pytest.approx((0.003, 0.0)), pytest.approx((0.004, 0.005))]
    assert step_parts.split_waiting([[0.1, 0.2, 0.3], [0.1]]) == [[(0.1, 0.0)], [(0.1, 0.0)]]


def test_the_typical_steps_leave_out_the_long_and_the_short_ones():
    rows = [{p: 0.0 for p in step_parts.PARTS} for _ in range(8)]
    for i, r in enumerate(rows):
        r["forward"] = 0.010 + 0.001 * i
    rows[7]["forward"] = 5.0                    # another process took the cores
    for r in rows:
        r["step"] = r["forward"]
    kept = step_parts.central(rows)
    assert all(r["forward"] < 1 for r in kept) and 2 <= len(kept) <= 6
    s = step_parts.summary(rows, None, [0.0135])
    assert s["parts_s"]["forward"] < 0.02 and s["sum_within_tolerance"]


# ------------------------------------------------------------------- real ranks

def bench(tmp_path, *extra, run_id="sp"):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--data", "digits",
                         "--epochs", "1", "--max-steps", "12", "--warmup-steps", "2",
                         "--results-dir", str(tmp_path), "--run-id", run_id, *extra],
                        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    return results.read_records(tmp_path / run_id / results.RESULTS_FILE)[0]


@pytest.mark.parametrize("framework,backend", [
    pytest.param("horovod", "gloo", marks=requires_horovod),
    pytest.param("horovod", "mpi", marks=[requires_horovod, requires_mpirun]),
    ("ddp", "gloo")])
def test_every_rank_splits_its_steps_and_the_parts_add_up(framework, backend, tmp_path):
    recs = bench(tmp_path, "--np", "1,2", "--framework", framework, "--backend", backend)
    by_np = {r["world"]["np"]: r for r in recs if r["status"] == "ok"}
    assert set(by_np) == {1, 2}, [r.get("error") for r in recs]
    for n, r in by_np.items():
        sp = r["figures"]["step_parts"]
        assert sp["note"] is None and len(sp["ranks"]) == n
        for rank in sp["ranks"]:
            parts = rank["parts_s"]
            assert set(parts) == set(step_parts.PARTS)
            assert rank["sum_within_tolerance"], rank
            assert rank["sum_s"] == pytest.approx(sum(v for p, v in parts.items() if p != "data"),
                                                  abs=1e-6)
            assert parts["forward"] > 0 and parts["backward"] > 0 and parts["optimizer"] > 0
    # two ranks exchange their gradients: some of it is exposed after the backward
    assert all(x["parts_s"]["communication"] > 0 for x in by_np[2]["figures"]["step_parts"]["ranks"])
    assert by_np[1]["figures"]["step_parts"]["ranks"][0]["parts_s"]["waiting"] == 0


@pytest.mark.parametrize("framework", [pytest.param("horovod", marks=requires_horovod), "ddp"])
def test_a_slow_rank_is_waited_for_by_the_other(framework, tmp_path):
    """Rank 1 takes 50 ms longer in every step from step 0 on: rank 0 waits about that
    long inside each collective, rank 1 hardly at all."""
    [r] = bench(tmp_path, "--np", "2", "--framework", framework, "--fault", "1:0:slow")
    assert r["status"] == "ok", r.get("error")
    zero, one = (x["parts_s"] for x in r["figures"]["step_parts"]["ranks"])
    from lab.common.config import SLOW_FAULT_S
    # Checked on its structure, not its speed (a loaded 2-core machine stretches and
    # shifts every wait): the delay is spent in rank 1's "other" part, and rank 0 waits
    # for it inside the collective more than rank 1 waits for rank 0.
    assert one["other"] >= SLOW_FAULT_S, one       # the sleep itself: a lower bound
    assert zero["waiting"] - one["waiting"] > 0.1 * SLOW_FAULT_S, (zero, one)


def test_a_strategy_whose_step_is_not_split_says_so(tmp_path):
    [r] = bench(tmp_path, "--np", "2", "--framework", "ddp", "--strategy", "pipeline",
                "--model", "mnist")
    sp = r["figures"]["step_parts"]
    assert sp["ranks"] == [] and "not split" in sp["note"]


def test_the_report_shows_each_step_by_part_and_the_measured_split(tmp_path):
    """The split is a measurement: runs without --ceiling are not predicted, and their split
    is in the report all the same."""
    recs = bench(tmp_path, "--np", "1,2", "--framework", "ddp", "--backend", "gloo")
    rows = report_parts.table(recs)
    assert [row[1] for row in rows] == [1, 2]
    assert prediction.predictions(recs) == []                # no compute ceiling in these runs
    [p] = prediction.measured(recs)
    assert p["prediction"] is None
    g = p["gap"]
    two = report_parts.of_row(p["row"])
    assert g["communication"] == pytest.approx(two["communication"])
    assert g["lost"] == pytest.approx(g["communication"] + g["waiting"] + g["compute"] + g["unexplained"])
    lab_report.write(str(tmp_path / "sp"))
    md = (tmp_path / "sp" / "report.md").read_text()
    section = md.split("## Why it scales as it does", 1)[1].split("\n## ", 1)[0]
    assert "exposed comm." in section and "| yes" in section
    assert max(len(ln) for ln in section.splitlines() if ln.startswith("|")) <= 160
    if g["lost"] > 0:
        assert "is exposed communication (the allreduce of" in section and "(not predicted)" in section
    # a record whose parts do not add up to its step is flagged, not hidden
    bad = [dict(r) for r in recs]
    two_rec = next(r for r in bad if r["world"]["np"] == 2)
    two_rec["figures"] = {**two_rec["figures"], "step_parts": {
        **two_rec["figures"]["step_parts"],
        "ranks": [{**x, "step_s": x["step_s"] * 2} for x in two_rec["figures"]["step_parts"]["ranks"]]}}
    assert any(str(row[-1]).startswith("no: ") for row in report_parts.table(bad))


def test_fp16_is_predicted_from_the_measured_parts_then_measured(tmp_path):
    """From the row's measured parts, not the cost model: no compute ceiling needed."""
    recs = bench(tmp_path, "--np", "1,2", "--framework", "ddp", "--compression", "none,fp16")
    splits = prediction.measured(recs)
    [none] = [p for p in splits if p["row"]["record"]["config"]["compression"] == "none"]
    parts = report_parts.of_row(none["row"])
    [line] = prediction.fp16_sentences(recs, splits)
    predicted = (parts["step"] - parts["communication"] / 2) * 1000
    assert f"predicted step {predicted:.1f} ms" in line
    fp16 = next(p for p in splits if p["row"]["record"]["config"]["compression"] == "fp16")
    assert f"measured {report_parts.of_row(fp16['row'])['step'] * 1000:.1f} ms" in line


def test_what_a_strategy_cannot_separate_is_said():
    import torch

    from lab.common.config import RunConfig
    from lab.worker.strategies.base import DataParallel
    from lab.worker.strategies.sharded import FSDP, Zero1

    def note(cls, **kw):
        return cls(RunConfig(**kw), None, torch.device("cpu")).parts_note
    assert note(DataParallel, framework="ddp", compression="none") is None
    assert note(DataParallel, framework="horovod", compression="int8") is None   # synchronize() apart
    assert "all-gather" in note(DataParallel, framework="ddp", compression="int8")
    assert "broadcast" in note(Zero1, framework="ddp", strategy="zero1")
    assert "reduce-scatters" in note(FSDP, framework="ddp", strategy="fsdp")


def test_on_a_gpu_the_marks_are_events_read_once_the_last_has_completed(monkeypatch):
    """No GPU here: torch.cuda.Event is replaced by a recorder of what StepParts asks of
    it (record at each mark, synchronize on the last before any elapsed_time), with
    times from a clock; the GPU path itself is untested."""
    import torch
    calls, clock = [], Clock()

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            self.t = clock()
            calls.append("record")

        def synchronize(self):
            calls.append("synchronize")

        def elapsed_time(self, other):
            assert "synchronize" in calls, "read before the last event completed"
            return (other.t - self.t) * 1000.0          # milliseconds, as CUDA's
    monkeypatch.setattr(torch.cuda, "Event", Event)
    sp = step_parts.StepParts(torch.device("cuda", 0), enabled=True)
    one_step(sp, clock, SPANS, horovod=True)
    [row] = sp.rows
    assert calls.count("synchronize") == 1 and calls.index("synchronize") == len(calls) - 1
    assert {k: row[k] for k in SPANS} == pytest.approx(SPANS)


def test_every_rank_times_the_same_number_of_collectives_whatever_its_own_clock_says(monkeypatch):
    """The run's collective timed alone (lab.worker.collective): two ranks whose own
    operations take different times around the budget still run the same number, since
    the counts come from the slowest rank's shared figure; ranks deciding alone would
    leave one waiting on a collective the other never joins."""
    import threading

    from lab.worker import collective
    monkeypatch.setattr(collective, "BUDGET_S", 0.06)
    barrier, shared, lock = threading.Barrier(2), [], threading.Lock()

    def slowest(seconds):
        with lock:
            shared.append(seconds)
        barrier.wait()
        top = max(shared[-2:])
        barrier.wait()
        return top

    calls = {}

    def rank(name, took_s):
        n = [0]

        def call():
            n[0] += 1
            time.sleep(took_s)
        times = collective.timed(call, lambda: None, slowest)
        calls[name] = (n[0], len(times))

    # alone, the fast rank (5 ms) would time 7 and the slow one (25 ms) 3
    threads = [threading.Thread(target=rank, args=a) for a in (("fast", 0.005), ("slow", 0.025))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert calls["fast"] == calls["slow"] == (collective.WARMUP + 3, 3)


def test_a_collective_longer_than_the_budget_is_run_twice_not_five_times():
    from lab.worker import collective
    assert collective.counts(collective.BUDGET_S * 2) == (False, 1)
    assert collective.counts(collective.BUDGET_S / 100) == (True, collective.REPEATS)
    assert collective.counts(collective.BUDGET_S / 2.5) == (True, 3)
