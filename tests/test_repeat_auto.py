"""--repeat auto (lab.host.run.repeat_auto): more repeats of the configurations whose
mean throughputs a t test does not tell apart, until it does or a maximum is reached. Records are
made by the code's own writers (results.make_record over the plan's run configuration)."""
import dataclasses
import subprocess
import sys

import pytest

from lab.common import results
from lab.host.errors import BenchError
from lab.host.request import plan as plans
from lab.host.run import repeat_auto, sweep
from lab.host.settings import base_config

DEFAULTS = {"np": "2", "timeout_s": 3600}


def make(tmp_path, **flags):
    return plans.make_plan({"results_dir": str(tmp_path), "run_id": "auto", **flags}, DEFAULTS)


def write(plan, tmp_path, throughputs: dict):
    """ok records of np 2 for each combination index: {index: [images/s per repeat]}."""
    rfile = results.run_dir(str(tmp_path), "auto") / results.RESULTS_FILE
    rfile.parent.mkdir(parents=True, exist_ok=True)
    for i, values in throughputs.items():
        c = plan.combinations[i]
        for rep, v in enumerate(values):
            cfg = dataclasses.replace(base_config(c, c.framework), expected_np=2, repeat=rep)
            results.append_record(rfile, results.make_record(
                "ok", run_id="auto", config=cfg.as_record(), np=2, nodes=1,
                started_at=results.now_iso(), figures={"throughput_img_s": v}))
    return results.read_records(rfile)[0]


def test_auto_and_its_maximum_are_parsed_and_a_bad_one_is_one_sentence(tmp_path):
    p = make(tmp_path, framework="ddp,horovod", repeat="auto")
    assert (p.settings.repeat, p.settings.repeat_max) == (3, 10)
    assert {j.repeat for j in p.jobs} == {0, 1, 2}
    p = make(tmp_path, framework="ddp,horovod", repeat="auto:6")
    assert (p.settings.repeat, p.settings.repeat_max) == (3, 6)
    for bad in ("auto:5", "auto:x", "automatic"):
        with pytest.raises(BenchError, match="--repeat auto takes its maximum as auto:N"):
            make(tmp_path, framework="ddp,horovod", repeat=bad)
    with pytest.raises(BenchError, match="--repeat auto is `invoke bench`'s"):
        make(tmp_path, repeat="auto").single("invoke sbatch")


def test_overlapping_intervals_ask_for_another_repeat_of_those_two_only(tmp_path):
    p = make(tmp_path, framework="ddp,horovod", backend="gloo", compression="none,fp16", repeat="auto")
    names = [plans.label(c) for c in p.combinations]
    # 0 and 1 are not told apart at 3 repeats (means 105 and 117, spread 5: about 7 repeats
    # each would, at 80% power); 2 and 3 are far below and apart from each other.
    recs = write(p, tmp_path, {0: [100, 105, 110], 1: [112, 117, 122], 2: [50, 52, 51], 3: [20, 21, 22]})
    todo, line = repeat_auto.next_round(p, recs, 10)
    # one more repeat of each a round
    assert todo == {(0, 2): 4, (1, 2): 4}
    assert line.startswith("--repeat auto: up to 4 repeats (at most 10) of ")
    assert "(not told apart: the 99.38% interval of their difference holds 0)" in line
    assert names[0] in line and names[1] in line and names[2] not in line


def test_separated_intervals_stop_and_so_does_the_maximum(tmp_path):
    p = make(tmp_path, framework="ddp,horovod", repeat="auto")
    recs = write(p, tmp_path, {0: [100, 101, 102], 1: [110, 111, 112]})
    assert repeat_auto.next_round(p, recs, 10) == (
        {}, "--repeat auto: every compared configuration is told apart after 3 repeats")
    (tmp_path / "auto" / results.RESULTS_FILE).unlink()
    recs = write(p, tmp_path, {0: [100, 110, 120, 100], 1: [105, 115, 125, 104]})
    todo, line = repeat_auto.next_round(p, recs, 4)
    assert todo == {} and line.startswith("--repeat auto: stopped at its maximum, 4 repeats")


def test_a_difference_too_small_for_the_maximum_stops_early_and_says_they_are_the_same(tmp_path):
    p = make(tmp_path, framework="ddp,horovod", repeat="auto")
    recs = write(p, tmp_path, {0: [100, 120, 110], 1: [101, 121, 111]})    # 1% apart, 10% spread
    todo, line = repeat_auto.next_round(p, recs, 10)
    assert todo == {}
    assert "would need about" in line and "they perform the same within this machine's noise" in line


def test_one_configuration_per_world_has_nothing_to_compare(tmp_path):
    p = make(tmp_path, framework="ddp", np="1,2", repeat="auto")
    recs = write(p, tmp_path, {0: [100, 110, 120]})
    assert repeat_auto.next_round(p, recs, 10) == (
        {}, "--repeat auto: nothing to compare (one configuration per world)")


def _sweep_writing(tmp_path, status, values):
    """A stand-in for the sweep that records each job it is given through the code's
    own writer: ok with the next of `values`, or failed."""
    ran = []

    def run_sweep(plan, echo):
        rfile = results.run_dir(str(tmp_path), "auto") / results.RESULTS_FILE
        for job in plan.jobs:
            ran.append((job.combination, job.repeat))
            cfg = dataclasses.replace(base_config(job.settings, job.settings.framework),
                                      expected_np=job.np, repeat=job.repeat)
            extra = ({"figures": {"throughput_img_s": next(values)}} if status == "ok"
                     else {"error": {"reason": "rank 1 exited with 1"}})
            results.append_record(rfile, results.make_record(
                status, run_id="auto", config=cfg.as_record(), np=job.np, nodes=1,
                started_at=results.now_iso(), **extra))
        return []
    return run_sweep, ran


def test_a_round_whose_runs_all_fail_ends_the_repeats(tmp_path, monkeypatch):
    p = make(tmp_path, framework="ddp,horovod", repeat="auto")
    write(p, tmp_path, {0: [100, 105, 110], 1: [112, 117, 122]})
    run_sweep, ran = _sweep_writing(tmp_path, "failed", iter(()))
    lines = []
    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    sweep.repeat_until_apart(p, lines.append)
    assert ran == [(0, 3), (1, 3)]                                    # one more each
    assert lines[-1] == "--repeat auto: stopped: no run of the last round finished (their records say why)"


def test_rounds_go_on_until_the_intervals_part(tmp_path, monkeypatch):
    """Not apart at 3 repeats (means 102 and 108, spread 2); a fourth run of each narrows
    the interval of their difference until it leaves out 0."""
    p = make(tmp_path, framework="ddp,horovod", repeat="auto")
    write(p, tmp_path, {0: [100, 102, 104], 1: [106, 108, 110]})
    run_sweep, ran = _sweep_writing(tmp_path, "ok", iter([102, 108]))
    lines = []
    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    sweep.repeat_until_apart(p, lines.append)
    assert ran == [(0, 3), (1, 3)]
    assert lines[-1] == "--repeat auto: every compared configuration is told apart after 4 repeats"


def test_at_5_repeats_the_interval_is_still_the_range_and_at_6_it_is_not():
    from lab.common import stats
    assert stats.fewest_to_separate() == 6
    five, six = [100, 102, 109, 101, 103], [100, 102, 109, 101, 103, 102]
    assert (stats.summarize(five).low, stats.summarize(five).high) == (100, 109)
    assert stats.summarize(six).high < 109


def test_auto_runs_real_ranks_until_the_two_separate_or_its_maximum(tmp_path):
    """Two configurations on real ranks: three repeats of each, then, while they are not
    told apart, one more a round up to 6 (auto:6, the most); every line says what it does."""
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "2", "--framework",
                         "ddp", "--backend", "gloo", "--compression", "none,fp16", "--data", "digits",
                         "--max-steps", "12", "--warmup-steps", "2", "--repeat", "auto:6",
                         "--run-id", "auto", "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    recs = results.read_records(tmp_path / "auto" / results.RESULTS_FILE)[0]
    by = {}
    for r in recs:
        by.setdefault(r["config"]["compression"], []).append(r["config"]["repeat"])
    said = [ln for ln in cp.stdout.splitlines() if ln.startswith("--repeat auto:")]
    assert said, cp.stdout[-2000:]
    # each round's line is followed by the runs it names; the last line says why it stopped
    rounds = len(said) - 1
    assert sorted(by["none"]) == sorted(by["fp16"]) == list(range(3 + rounds))
    assert rounds <= 3 and ("told apart" in said[-1] or "stopped" in said[-1]), said


def test_a_configuration_repeated_first_in_a_later_round_goes_on_from_its_own_last_repeat(tmp_path, monkeypatch):
    """Repeat indices run on per configuration: one with 3 repeats, now compared with one
    that already has 6, gets repeats 3, 4, ... (not 6, 7, ...: the sweep's highest)."""
    p = make(tmp_path, framework="ddp", compression="none,fp16,int8", repeat="auto")
    write(p, tmp_path, {0: [200, 201, 202, 203, 204, 205], 1: [100, 101, 102, 103, 104, 105],
                        2: [103, 108, 112]})
    run_sweep, ran = _sweep_writing(tmp_path, "failed", iter(()))
    lines = []
    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    sweep.repeat_until_apart(p, lines.append)
    assert lines[0].startswith("--repeat auto: up to 7 repeats"), lines
    assert sorted(ran) == [(1, 6), (2, 3), (2, 4), (2, 5), (2, 6)]
