"""`invoke lab`: its plan (pure: every part a request bench accepts, within the time the
kit promises here) and a shrunk lab run end to end with real ranks into a temporary
folder, its report holding each part's section."""
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.host.request.checks import settings_from_flags
from lab.host.request.plan import make_plan
from lab.host.suites import course, course_plan, estimate
from tests.conftest import requires_horovod

REPO = Path(__file__).resolve().parent.parent


def cpu_plan(quick=False, **kw):
    return course_plan.plan("results", quick=quick, gpus=0, backends=("gloo", "mpi", "ccl"), **kw)


@pytest.mark.parametrize("quick", [False, True])
def test_every_part_is_a_request_bench_accepts(quick):
    for part in cpu_plan(quick).parts:
        s, lists = settings_from_flags(dict(part.flags), {})
        assert s.run_id == part.run_id
        # the command shown is the part: parsing it back gives the same flags
        words = part.command().split()[2:]
        assert words[0].startswith("--") and f"--run-id {part.run_id}" in part.command()


@pytest.mark.parametrize("quick", [False, True])
def test_the_estimate_fits_the_promise_on_a_two_core_machine(quick):
    p = cpu_plan(quick)
    assert 0 < p.estimate_s <= course_plan.BUDGET_MIN[quick] * 60
    assert p.estimate_s == pytest.approx(
        sum(x.estimate_s for x in p.parts) + estimate.LAB_REPORT_S + estimate.CLUSTER_UP_S + p.sweeps.estimate_s)


@pytest.mark.parametrize("quick", [False, True])
def test_the_lab_first_saves_doctors_sweeps_where_its_report_finds_them(quick, tmp_path):
    """What the report's cost model needs beside the 1-worker runs: doctor's collective
    sweeps, saved in the lab's results folder (the folder above every part's run folder)."""
    from lab.host.suites import course
    from lab.report import model_inputs
    p = course_plan.plan(str(tmp_path), quick=quick, gpus=0, backends=("gloo", "mpi"))
    assert p.sweeps.kind == "doctor" and p.sweeps.command() == f"invoke doctor --local --np 2 --save {tmp_path}"
    assert p.render().splitlines()[1].startswith("  first: the collectives' cost")
    # every part with multi-worker data-parallel rows also runs them at 1 worker (the model's
    # input); but --quick's model comparison, which runs 2 workers across 2 servers alone to fit
    # its minutes (its rows are compared, not predicted)
    for part in p.parts:
        comparison_only = quick and part.name in ("across-resnet50", "across-vgg16", "strategies")
        if (part.flags.get("strategy", "ddp") == "ddp" and "compression" not in part.flags
                and not part.skipped and not comparison_only):
            assert "1" in str(part.flags["np"]).split(","), part.name
    # the strategies' plain DDP at 2 workers has its 1-worker run, in the same configuration
    strategies = {q.name: q.flags for q in p.parts if q.name.startswith("strategies")}
    if not quick:
        multi, one = strategies["strategies"], strategies["strategies-one"]
        assert "ddp" in multi["strategy"].split(",") and (one["np"], one["strategy"]) == ("1", "ddp")
        assert {k: v for k, v in multi.items() if k not in ("np", "strategy", "run_id")} == \
            {k: v for k, v in one.items() if k not in ("np", "strategy", "run_id")}
    else:
        assert list(strategies) == ["strategies"]
    # resumed with the sweeps saved: not measured again
    (tmp_path / model_inputs.SWEEP_FILE).write_text("")
    assert course.sweeps(p.sweeps, True) == "ok (saved before)"


@pytest.mark.parametrize("quick", [False, True])
def test_every_section_of_the_lab_is_a_part(quick):
    """The sections in the report's order; the model comparison (ResNet-50 beside VGG-16
    across servers) in every plan, both models run the same way, so the report compares
    them (lab.report.model_comparison); --quick at 2 workers on 2 servers only."""
    parts = cpu_plan(quick).parts
    assert [p.title for p in parts] == [
        "results within one server", "results across servers", "results across servers (ResNet-50)",
        "results across servers (VGG-16)", "a recurrent model (LSTM)", "gradient compression",
        *["parallel strategies (ResNet-50)"] * (1 if quick else 2)]
    for across in parts[1:4]:
        assert across.place == "cluster" and across.flags["link"] == "1gbit"
        assert across.flags["nodes"] == ("2" if quick and across is not parts[1] else "1,2")
    resnet, vgg = parts[2].flags, parts[3].flags
    assert (resnet["model"], vgg["model"]) == ("resnet50", "vgg16")
    same = ("nodes", "np", "framework", "backend", "link", "data", "batch_size")
    assert {k: resnet[k] for k in same} == {k: vgg[k] for k in same}


@pytest.mark.parametrize("quick", [False, True])
def test_oneccl_has_rows_within_and_across_servers_for_horovod(quick):
    """oneCCL beside MPI and Gloo: Horovod's back end in the within-server part and the
    cross-server one (the quick plan's too), counted once in the estimate (DDP skips it)."""
    within, across = cpu_plan(quick).parts[:2]
    assert "ccl" in within.flags["backend"].split(",") and "ccl" in across.flags["backend"].split(",")
    assert "horovod" in within.flags["framework"] and "horovod" in across.flags["framework"]
    without = course_plan.plan("results", quick=quick, gpus=0, backends=("gloo", "mpi")).parts[0]
    assert within.estimate_s == pytest.approx(without.estimate_s * (3 + 1) / (2 + 1))


def test_gpus_add_nccl_and_their_counts():
    p = course_plan.plan("r", gpus=4, backends=("gloo", "mpi", "nccl"))
    within = p.parts[0]
    assert within.flags["device"] == "cuda" and within.flags["np"] == "1,2,4"
    assert "nccl" in within.flags["backend"]
    # the simulated cluster is the CPU image: its parts are CPU processes with GPUs too
    assert "device" not in p.parts[1].flags and "nccl" not in p.parts[1].flags["backend"]
    assert not any("NCCL needs GPUs" in n for n in p.notes)
    assert any("NCCL needs GPUs" in n for n in cpu_plan().notes)


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("docker", [True, False])
@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_every_section_has_a_part_that_runs_and_no_gpu_part_asks_for_more_ranks_than_gpus(gpus, docker, quick):
    """On any machine: each section of the report has a part that runs (the cross-server
    ones skipped with the reason where no Docker engine is), every part is a request bench
    accepts whose process counts all fit this machine's GPUs by bench's own check, and
    with GPUs every model, framework and back end runs at np 1 on them."""
    from lab.host.request.checks import refused_counts
    backends = ("gloo", "mpi") + (("nccl",) if gpus else ())
    why = "" if docker else "no Docker engine here (socket refused); the cross-server part needs one"
    p = course_plan.plan("r", quick=quick, gpus=gpus, backends=backends, cluster=why)
    assert list(dict.fromkeys(x.title for x in p.parts)) == list(dict.fromkeys(x.title for x in cpu_plan(quick).parts))
    for title in dict.fromkeys(x.title for x in p.parts):
        mine = [x for x in p.parts if x.title == title]
        if title.startswith("results across servers") and not docker:
            assert all(x.skipped == why for x in mine)
        else:
            assert any(not x.skipped for x in mine), title
    stack = {"cuda_available": bool(gpus), "gpus": gpus}
    on_gpus = set()
    for part in p.parts:
        s, lists = settings_from_flags(dict(part.flags), {})
        assert refused_counts(s, stack, "ddp") == {}, part.command()
        assert part.gpu == (s.device == "cuda")
        if part.gpu:
            assert max(s.np) <= gpus and lists["nodes"] == [1]
            on_gpus |= {(s.model, f, b, n) for f in lists["framework"] for b in lists["backend"]
                        for n in s.np}
        else:
            assert "nccl" not in lists["backend"] and "GPU" not in part.devices.split("beside")[0]
    if gpus:
        assert {m for m, _, _, _ in on_gpus} == {"mnist", "lstm", "resnet50"}
        assert {(f, b) for m, f, b, n in on_gpus if m == "mnist" and n == 1} == {
            (f, b) for f in ("horovod", "ddp") for b in backends}
    assert len({x.run_id for x in p.parts}) == len(p.parts)


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("gpus", [0, 1])
def test_without_horovod_every_section_still_runs_and_the_plan_says_why_and_costs_less(gpus, quick):
    """A GPU host without Horovod ran the quick lab's compression part (Horovod's alone)
    and ended "nothing ran: all 4 run(s) were skipped"; now it runs over DDP there, and
    Horovod's runs cost the estimate nothing."""
    why = "Horovod is not installed here (docker/install-horovod.sh builds it)"
    backends = ("gloo", "mpi") + (("nccl",) if gpus else ())
    with_it = course_plan.plan("r", quick=quick, gpus=gpus, backends=backends)
    p = course_plan.plan("r", quick=quick, gpus=gpus, backends=backends, horovod=why)
    assert [x.title for x in p.parts] == [x.title for x in with_it.parts]
    for part in p.parts:
        if part.place == "cluster":          # the cluster's image has its own Horovod
            same = next(x for x in with_it.parts if x.name == part.name)
            assert (part.flags, part.estimate_s) == (same.flags, same.estimate_s)
            continue
        frameworks = part.flags.get("framework", "ddp").split(",")
        assert "ddp" in frameworks, part.command()
    compression = [x for x in p.parts if x.title == "gradient compression"]
    assert all("ddp" in x.flags["framework"] for x in compression)
    assert any(n.startswith(why) and ("over DDP" in n) == quick for n in p.notes)
    assert not any(why in n for n in with_it.notes)
    local = [(x, next(y for y in with_it.parts if y.name == x.name)) for x in p.parts if x.place != "cluster"]
    assert all(x.estimate_s <= y.estimate_s for x, y in local)
    assert p.estimate_s < with_it.estimate_s


@requires_horovod
def test_the_lab_finds_this_machines_horovod():
    assert course.look("cpu").horovod == ""


def test_the_lab_looks_for_horovod_where_its_local_ranks_run(monkeypatch):
    """From the stack probe bench makes of the local ranks: not installed, or installed
    and not importing (bench would skip every Horovod run either way)."""
    stacks = iter([{"torch": "2.13.0"},
                   {"torch": "2.13.0", "horovod_error": "ImportError: undefined symbol: _ZN3c10"},
                   {"torch": "2.13.0", "horovod": {"gloo": True, "mpi": False}}])
    monkeypatch.setattr(course, "probe_stack", lambda runner=None: next(stacks))
    assert course.horovod_here().startswith("Horovod is not installed here")
    assert course.horovod_here() == ("Horovod does not import here (ImportError: undefined symbol: "
                                     "_ZN3c10; rebuild it with docker/install-horovod.sh)")
    assert course.horovod_here() == ""


def test_a_cluster_that_cannot_run_is_said_in_the_plan_and_costs_nothing():
    why = "no Docker engine here (socket refused); the cross-server part needs one"
    p = cpu_plan(cluster=why)
    assert p.parts[1].skipped == p.parts[2].skipped == why
    assert f"results across servers: skipped: {why}" in p.render()
    assert p.estimate_s == pytest.approx(sum(x.estimate_s for x in p.parts if not x.skipped)
                                         + estimate.LAB_REPORT_S + p.sweeps.estimate_s)


def test_an_earlier_lab_is_not_mixed_into(tmp_path):
    p = course_plan.plan(str(tmp_path), quick=True)
    (tmp_path / "lab-lstm").mkdir()
    with pytest.raises(course.CourseError, match=r"already holds an earlier lab \(lab-lstm\).*--resume"):
        course.check_folders(p, resume=False)
    course.check_folders(p, resume=True)


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "invoke", "lab", "--quick", "--dry-run", "--device", "cpu",
                         "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert "the lab (--quick, estimated" in cp.stdout and "invoke bench" in cp.stdout
    assert list(tmp_path.iterdir()) == []


@requires_horovod
@pytest.mark.slow
def test_a_shrunk_lab_runs_every_local_part_and_reports_them(tmp_path):
    """The quick plan with the steps cut to a few and one process count: real ranks, the
    real sweep, the report of all parts in one folder."""
    plan = course.make(str(tmp_path), True, course.Machine(0, ("gloo",), "not in this test", False))
    plan.sweeps = None           # doctor's 50 s of probes: tests/test_doctor.py runs them
    for part in plan.parts:      # six short runs in all
        part.flags.update(max_steps=3, warmup_steps=1, epochs=1, np="2")
        if part.name == "strategies":
            part.flags.update(strategy="zero1", model="mnist")
        if part.name == "compression":
            part.flags.update(compression="none,int8-naive")
    lines = []
    outcome = course.run(plan, echo=lines.append)
    across = [p.name for p in plan.parts if p.place == "cluster"]
    assert across == ["across", "across-resnet50", "across-vgg16"]
    assert all(outcome[name] == "skipped: not in this test" for name in across)
    assert {k: v for k, v in outcome.items() if k not in (*across, "report")} == {
        "within": "ok", "lstm": "ok", "compression": "ok", "strategies": "ok"}, "\n".join(lines)
    md = (tmp_path / "lab-report" / "report.md").read_text()
    assert (tmp_path / "lab-report" / "report.html").exists()
    for heading in ("## Results within one server", "## Gradient compression"):
        assert heading in md
    assert "lstm" in md and "| zero1" in md
    assert any(line.startswith(f"== lab part 2/{len(plan.parts)}: results across servers: skipped")
               for line in lines)
    # a second run with --resume runs nothing again: no record is added
    def records():
        return {p.name: len(results.read_records(tmp_path / p.run_id / results.RESULTS_FILE)[0])
                for p in plan.parts if not p.skipped}
    before = records()
    assert all(before.values())
    assert all(len(make_plan(dict(p.flags), {}, resume=True).jobs) == 0 for p in plan.parts if not p.skipped)
    course.run(plan, resume=True, echo=lines.append)
    assert records() == before


def test_a_part_whose_every_run_was_skipped_is_not_ok():
    from lab.host.run.bench import Outcome
    from lab.host.settings import BenchSettings, base_config
    cfg = base_config(BenchSettings(np=[2], run_id="x"), "ddp").as_record()

    def rec(status):
        extra = {"figures": {"throughput_img_s": 1.0}} if status == "ok" else {"error": {"reason": "r"}}
        return results.make_record(status, run_id="x", config=cfg, np=2, nodes=1,
                                   started_at=results.now_iso(), **extra)
    assert course.part_outcome(Outcome("x", [rec("skipped"), rec("skipped")], 0, [])) == (
        "nothing ran: all 2 run(s) were skipped (the lines above and the records say why)")
    assert course.part_outcome(Outcome("x", [rec("skipped"), rec("ok")], 0, [])) == "ok"
    assert course.part_outcome(Outcome("x", [rec("ok")], 1, [])) == "1 run(s) failed"


def test_an_unknown_device_is_one_sentence():
    with pytest.raises(course.CourseError, match=r"--device is one of auto, cpu or cuda, not 'gpu'"):
        course.look("gpu")


@pytest.mark.parametrize("below", [False, True])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_results_dir_that_is_a_file_is_one_sentence_and_the_file_is_left_alone(tmp_path, below, dry_run):
    afile = tmp_path / "afile"
    afile.write_text("kept")
    where = afile / "below" if below else afile
    cp = subprocess.run([sys.executable, "-m", "invoke", "lab", "--quick", "--device", "cpu",
                         "--results-dir", str(where), *dry_run], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and "is a file, not a folder" in cp.stderr
    assert f"{afile} is a file" in cp.stderr and "lab part" not in cp.stdout
    assert afile.read_text() == "kept" and list(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_the_strategies_ddp_rows_at_2_workers_each_have_their_1_worker_run(gpus):
    """The full lab's strategies part runs plain DDP at 2 workers (on the GPUs, or as CPU
    processes beside one GPU): a part with the same flags at 1 worker gives the report's cost
    model its input, on the same device (a CPU row is never paired with a GPU one)."""
    backends = ("gloo", "mpi") + (("nccl",) if gpus else ())
    parts = course_plan.plan("r", gpus=gpus, backends=backends).parts
    ignore = ("np", "strategy", "run_id")

    def same(flags):
        return {k: v for k, v in flags.items() if k not in ignore}
    multi = [q.flags for q in parts if q.name.startswith("strategies")
             and "2" in str(q.flags["np"]).split(",") and "ddp" in q.flags["strategy"].split(",")]
    ones = [q.flags for q in parts if q.name.startswith("strategies") and str(q.flags["np"]) == "1"
            and q.flags["strategy"] == "ddp"]
    assert multi, [q.name for q in parts]
    for flags in multi:
        assert any(same(o) == same(flags) for o in ones), (flags, ones)
