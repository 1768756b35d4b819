"""--checkpoint-every and --max-restarts: checkpoints written atomically and a torn one
never loaded; bench's relaunch loop and its record; and real jobs of 2 ranks (DDP, ZeRO-1,
FSDP, DeepSpeed and the pipeline's two schedules over Gloo, Horovod over Gloo and MPI) that
lose rank 1 to SIGKILL at
step 15, are relaunched from the checkpoint of step 10 and end with the loss of an
uninterrupted run; the records' checkpoint overhead (figures.checkpoints) agrees with the
steps."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from lab.common import restarts, results
from lab.common.config import ConfigError, RunConfig
from lab.host import places
from lab.host.errors import BenchError
from lab.host.places.hosts import HostsRunner
from lab.host.places.local import LocalRunner
from lab.host.places.scripts import script_config
from lab.host.request.checks import check_settings, settings_from_flags
from lab.host.run import bench
from lab.host.settings import BenchSettings, base_config
from lab.report.bench_output import checkpoint_line, render, restart_line
from lab.worker import checkpoint
from tests.conftest import requires_horovod, requires_mpirun
from tests.test_strategy_deepspeed import needs_deepspeed

# ------------------------------------------------------------ checkpoint files


def test_a_checkpoint_is_written_whole_or_not_at_all(tmp_path):
    path = str(tmp_path / "step-00000010.pt")
    checkpoint.write_atomic(path, lambda f: torch.save({"format": 1, "v": 1}, f))

    def dies_halfway(f):
        f.write(b"PK\x03\x04 half of a zip")
        raise KeyboardInterrupt         # the writer killed mid-write
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_atomic(path, dies_halfway)
    # the old file is whole; the half-written one is a temporary name, not a checkpoint
    assert torch.load(path, weights_only=False)["v"] == 1
    leftovers = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert leftovers and [s for s, _ in checkpoint.listed(str(tmp_path))] == [10]
    checkpoint.prune(str(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_a_torn_checkpoint_is_skipped_and_the_one_before_it_loaded(tmp_path):
    folder = str(tmp_path)
    for step in (10, 20):
        checkpoint.write_atomic(checkpoint.path_of(folder, step),
                                lambda f, step=step: torch.save({"format": 1, "step": step}, f))
    newest = checkpoint.path_of(folder, 20)
    data = open(newest, "rb").read()
    with open(newest, "wb") as f:        # cut short, under its final name
        f.write(data[:len(data) // 2])
    said = []
    path, state = checkpoint.newest_loadable(folder, log=lambda *a, **k: said.append(a[0]))
    assert path == checkpoint.path_of(folder, 10) and state["step"] == 10
    assert len(said) == 1 and "step-00000020.pt does not load" in said[0]


def test_the_newest_two_are_kept(tmp_path):
    for step in (10, 20, 30):
        checkpoint.write_atomic(checkpoint.path_of(str(tmp_path), step), lambda f: f.write(b"x"))
    checkpoint.prune(str(tmp_path))
    assert [s for s, _ in checkpoint.listed(str(tmp_path))] == [30, 20]


def test_a_strategys_own_checkpoint_folder_is_listed_only_once_renamed_and_whole(tmp_path):
    """DeepSpeed's checkpoints (lab.worker.checkpoint.save_folder): a folder being written (its
    temporary name) is not a checkpoint, a renamed one with a file cut short is skipped,
    and prune removes the temporary folder and all but the newest two."""
    folder = str(tmp_path)
    for step in (10, 20, 30):
        tmp = os.path.join(folder, checkpoint.folder_tmp_name(step))
        os.makedirs(tmp)
        torch.save({"module": torch.ones(1000)}, os.path.join(tmp, "mp_rank_00_model_states.pt"))
        checkpoint.complete_folder(folder, tmp, step, {"format": 1, "global_step": step})
    os.makedirs(os.path.join(folder, checkpoint.folder_tmp_name(40)))     # a writer killed
    assert [s for s, _ in checkpoint.listed(folder)] == [30, 20]
    assert open(os.path.join(folder, "latest")).read() == "step-00000030"
    newest = os.path.join(folder, "step-00000030", "mp_rank_00_model_states.pt")
    data = open(newest, "rb").read()
    with open(newest, "wb") as f:
        f.write(data[:len(data) // 2])
    said = []
    path, state = checkpoint.newest_loadable(folder, log=lambda *a, **k: said.append(a[0]))
    assert path == os.path.join(folder, "step-00000020") and state["global_step"] == 20
    assert len(said) == 1 and "step-00000030 does not load" in said[0]
    checkpoint.prune(folder)
    assert not [n for n in os.listdir(folder) if n.startswith(".step-")]


def test_checkpoints_cover_the_data_parallel_and_pipeline_strategies_not_rpc():
    for strategy in ("ddp", "zero1", "fsdp", "deepspeed", "pipeline", "model-parallel"):
        RunConfig(checkpoint_every=10, strategy=strategy, framework="ddp").check()
    with pytest.raises(ConfigError) as e:
        RunConfig(checkpoint_every=10, strategy="rpc-pipeline", framework="ddp").check()
    assert str(e.value) == (
        "--checkpoint-every does not cover rpc-pipeline, whose optimizer state is held by "
        "TorchScript optimizers inside RPC's agent: leave it out, or use --strategy pipeline "
        "(the same stages over torch.distributed.pipelining, checkpointed)")
    with pytest.raises(ConfigError, match="^--checkpoint-every covers the ddp, zero1, fsdp, deepspeed, "
                                          "pipeline and model-parallel strategies without an 8-bit"):
        RunConfig(checkpoint_every=10, compression="int8").check()
    with pytest.raises(ConfigError, match="cannot be negative"):
        RunConfig(checkpoint_every=-1).check()


def test_a_pipeline_refuses_a_checkpoint_of_another_stage_layout():
    """Each rank loads its stage's part of the one file; a file whose stages were cut
    elsewhere (another --np or model) is refused in one sentence, before any loading."""
    from lab.worker.strategies.pipeline import Pipeline
    stage = Pipeline.__new__(Pipeline)
    stage.cfg, stage.bounds = RunConfig(strategy="pipeline"), [(0, 4), (4, 8)]
    saved = {"stage_layers": [[0, 3], [3, 6], [6, 8]], "stages": [{}, {}, {}]}
    with pytest.raises(ConfigError) as e:
        stage.load_checkpoint_state(saved, saved)
    assert str(e.value) == (
        "the checkpoint cuts mnist into the stages [[0, 3], [3, 6], [6, 8]] and this run into "
        "[[0, 4], [4, 8]] (layers per rank): a relaunch must keep --model and --np, or start "
        "without that run's checkpoints")


# ------------------------------------------------------------ bench's relaunch loop

def fake_job(outcomes, seen, rfile):
    """bench.run_one's stand-in: the launch's record as bench writes it, failed or ok."""
    def run_one(s, cfg, np, runner, rf, echo, load=None, torch_version=None):
        seen.append((cfg.restart, cfg.attempt))
        ok = outcomes[len(seen) - 1]
        if cfg.restart:
            restarts.write_resumed(restarts.folder(rfile.parent, cfg.attempt, cfg.restart), cfg.restart,
                                   from_step=10, checkpoint="step-00000010.pt", saved_at=1.0, resumed_at=2.0)
        rec = (results.make_record("ok", run_id="r", config={}, np=2, nodes=1, started_at="t",
                                   figures={"final_loss": 1.0}) if ok else
               results.make_record("failed", run_id="r", config={}, np=2, nodes=1, started_at="t",
                                   error={"rank": 1, "signal": 9, "reason": "rank 1 was killed"}))
        results.append_record(rf, rec)
        return 0 if ok else 1
    return run_one


def relaunched(tmp_path, monkeypatch, outcomes, **settings):
    rfile = tmp_path / "r" / results.RESULTS_FILE
    s = BenchSettings(np=[2], **settings)
    cfg = RunConfig(attempt="000-job")
    seen, lines = [], []
    monkeypatch.setattr(bench, "run_one", fake_job(outcomes, seen, rfile))
    failed = bench.run_job(s, cfg, 2, LocalRunner(str(tmp_path)), rfile, lines.append)
    return failed, seen, results.read_records(rfile)[0], lines


def test_without_max_restarts_a_failed_job_is_recorded_failed_once(tmp_path, monkeypatch):
    failed, seen, records, _ = relaunched(tmp_path, monkeypatch, [False, True])
    assert failed == 1 and seen == [(0, "000-job")]
    assert [r["status"] for r in records] == ["failed"] and "restarts" not in records[0]


def test_a_relaunch_that_ends_ok_is_one_ok_record_with_its_restart(tmp_path, monkeypatch):
    failed, seen, records, lines = relaunched(tmp_path, monkeypatch, [False, True], max_restarts=2,
                                              checkpoint_every=10)
    assert failed == 0 and seen == [(0, "000-job"), (1, "000-job-restart1")]
    assert [r["status"] for r in records] == ["ok"]
    (entry,) = records[0]["restarts"]
    assert {k: entry["error"][k] for k in ("rank", "signal", "reason")} == {
        "rank": 1, "signal": 9, "reason": "rank 1 was killed"}
    assert entry["resumed_from_step"] == 10 and entry["attempt"] == "000-job"
    assert entry["lost_s"] == pytest.approx(entry["redone_s"] + entry["relaunch_s"])
    assert any("relaunching the job (1 of at most 2)" in line for line in lines)
    assert restart_line(records[0]) == ("np=2: ok after 1 relaunch(es): rank 1 was killed, resumed "
                                        f"from step 10 ({entry['lost_s']:.1f} s lost)")


def test_a_job_failing_every_launch_is_recorded_failed_with_its_restarts(tmp_path, monkeypatch):
    failed, seen, records, lines = relaunched(tmp_path, monkeypatch, [False, False], max_restarts=1)
    assert failed == 1 and len(seen) == 2
    assert [r["status"] for r in records] == ["failed"] and len(records[0]["restarts"]) == 1
    assert any("without --checkpoint-every: a relaunch starts again from step 0" in line for line in lines)


def test_a_relaunch_that_raises_keeps_the_failed_launchs_record_with_its_restart(tmp_path, monkeypatch):
    """A relaunch refused or interrupted before it records anything: the failed launch's
    record stays (it is taken out only once a later launch recorded), with the restart."""
    rfile = tmp_path / "r" / results.RESULTS_FILE
    seen = []
    first = fake_job([False], seen, rfile)

    def run_one(s, cfg, *a, **k):
        if cfg.restart:
            raise KeyboardInterrupt
        return first(s, cfg, *a, **k)
    monkeypatch.setattr(bench, "run_one", run_one)
    with pytest.raises(KeyboardInterrupt):
        bench.run_job(BenchSettings(np=[2], max_restarts=1, checkpoint_every=10),
                      RunConfig(attempt="000-job"), 2, LocalRunner(str(tmp_path)), rfile, print)
    (record,) = results.read_records(rfile)[0]
    assert record["status"] == "failed" and record["error"]["rank"] == 1
    (entry,) = record["restarts"]
    assert "ended_at" not in entry and "lost_s" in entry, entry


def test_every_rank_waits_for_the_checkpoint_outside_its_steps(monkeypatch):
    """Rank 0 writes between two collectives, so no rank's next timed step waits for it."""
    calls = []

    class D:
        rank, size = 1, 2

        def allgather_object(self, obj):
            calls.append("collective")
            return [obj, obj]
    class Sharded:              # ZeRO-1, FSDP: every rank takes part in gathering the state
        def checkpoint_state(self):
            calls.append("gather")
    monkeypatch.setattr(checkpoint, "_write", lambda *a: calls.append("write"))
    checkpoint.save(RunConfig(), D(), Sharded(), 10, 0, 10, 0.0, [])
    assert calls == ["gather", "collective", "collective"]          # rank 1: no write, but waits
    calls.clear()
    D.rank = 0
    checkpoint.save(RunConfig(), D(), Sharded(), 10, 0, 10, 0.0, [])
    assert calls == ["gather", "collective", "write", "collective"]


def test_the_checkpoint_overhead_is_one_line_per_run():
    rec = results.make_record("ok", run_id="r", config={}, np=2, nodes=1, started_at="t", figures={
        "checkpoints": {"written": 4, "total_s": 0.5, "share": 0.05}})
    assert checkpoint_line(rec) == "np=2: checkpoints: 4 written, 0.125 s each, 5.0% of the run"
    rec["figures"]["checkpoints"] = {"written": 0, "total_s": 0.0, "share": 0.0}
    assert checkpoint_line(rec) == "np=2: checkpoints: 0 written, none, 0.0% of the run"
    del rec["figures"]["checkpoints"]
    assert checkpoint_line(rec) is None       # without --checkpoint-every


def test_the_flags_reach_bench_and_the_ranks():
    s, _ = settings_from_flags({"np": "2", "checkpoint_every": "10", "max_restarts": "1",
                                "local": True}, {"where": "auto"})
    assert (s.checkpoint_every, s.max_restarts) == (10, 1)
    cfg = base_config(s, "ddp")
    assert cfg.checkpoint_every == 10 and "--checkpoint-every" in cfg.to_args()
    assert places.for_request(s)[0].max_restarts == 1      # local processes honour both


def test_a_place_that_cannot_relaunch_refuses_in_one_sentence():
    hosts = HostsRunner.__new__(HostsRunner)
    with pytest.raises(BenchError, match=r"^--max-restarts 1 is not honoured by your servers over SSH") as e:
        bench.run_job(BenchSettings(np=[2], where="auto", max_restarts=1), RunConfig(), 2, hosts, None, print)
    assert "--local" not in str(e.value) and str(e.value).endswith(  # --local with --hosts is refused too
        "leave it out, or run where it is (local processes, the lab image, the simulated cluster, "
        "Slurm on the simulated cluster or Kubernetes)")
    with pytest.raises(BenchError, match="^--max-restarts counts retries: 0 or more, not -1"):
        check_settings(BenchSettings(np=[2], max_restarts=-1))


class _Ranks:
    """A process group's allgather_object over stated values (one per rank)."""
    def __init__(self, said, rank=0):
        self.said, self.rank, self.calls = said, rank, 0

    def allgather_object(self, value):
        self.calls += 1
        return list(self.said)


def test_under_torchruns_restarts_every_rank_takes_the_largest_count(monkeypatch):
    """torchrun's agents count restarts per node (a node restarted along says 0): the
    ranks agree on the largest, so none resumes alone nor fires --fault again; without
    torchrun's restarts no collective is made."""
    cfg = RunConfig(restart=0)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    group = _Ranks([0, 1])
    assert checkpoint.agree_restart(cfg, group) == 1 and cfg.restart == 1 and group.calls == 1
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    cfg, group = RunConfig(restart=0), _Ranks([0, 1])
    assert checkpoint.agree_restart(cfg, group) == 0 and group.calls == 0
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS")
    cfg, group = RunConfig(restart=2), _Ranks([0, 1])
    assert checkpoint.agree_restart(cfg, group) == 2 and group.calls == 0


def test_a_pytorchjobs_pods_agree_on_resuming(monkeypatch):
    """A PyTorchJob's pods each decide whether they resume (lab.host.places.k8s.jobs.resuming);
    where the manifest says so (restarts.AGREE_VAR) the ranks take the largest decision, so
    a pod that saw its attempt's checkpoints makes every rank resume, rank 0's too."""
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    monkeypatch.setenv(restarts.AGREE_VAR, "1")
    for said in ([0, 1], [1, 0]):
        cfg, group = RunConfig(restart=0), _Ranks(said)
        assert checkpoint.agree_restart(cfg, group) == 1 and cfg.restart == 1 and group.calls == 1
    cfg, group = RunConfig(restart=0), _Ranks([0, 0])
    assert checkpoint.agree_restart(cfg, group) == 0 and group.calls == 1


def test_a_first_launch_clears_its_jobs_old_checkpoints_before_it_writes(tmp_path):
    """A script submitted again (the same run id and launch name) must not let its retries
    resume from the submission before: its first launch's rank 0 clears the job's folder;
    a relaunch keeps it, and a run without checkpoints touches nothing."""
    cfg = RunConfig(results_dir=str(tmp_path), run_id="again", attempt="000-job", checkpoint_every=10)
    folder = checkpoint.job_folder(cfg)
    os.makedirs(folder)
    torch.save({"old": 1}, checkpoint.path_of(folder, 90))
    checkpoint.resume(dataclasses.replace(cfg, checkpoint_every=0), _Ranks([0, 0]), None)
    assert checkpoint.listed(folder) != []
    checkpoint.resume(cfg, _Ranks([0, 0], rank=1), None)           # not rank 0's to clear
    assert checkpoint.listed(folder) != []
    assert checkpoint.resume(cfg, _Ranks([0, 0]), None) == checkpoint.Position()
    assert checkpoint.listed(folder) == []


# ------------------------------------------------------------ real jobs

@pytest.fixture(scope="module")
def stack():
    return bench.probe_stack()


def bench_run(stack, tmp_path, run_id, **kw):
    kw = {"data": "synthetic", "synthetic_size": 2560, "max_steps": 40, **kw}
    s = BenchSettings(np=[2], results_dir=str(tmp_path), run_id=run_id, timeout_s=120, stall_s=60.0,
                      **kw)
    lines = []
    outcome = bench.run(s, echo=lines.append, stack=stack)
    return outcome, lines


def assert_checkpoints(figures, written):
    """The record's checkpoint overhead (figures.checkpoints) consistent with the steps."""
    c = figures["checkpoints"]
    assert c["written"] == written, c
    assert c["total_s"] > 0 and 0 < c["share"] < 1, c


@pytest.fixture(scope="module")
def uninterrupted(stack, tmp_path_factory):
    """The epochs' losses and the parameters' digest of a run that no fault interrupts,
    per reference strategy (and shape: epochs, steps), run once (the same loss for DDP and
    Horovod here: the same seed, batches, dropout masks and averaged gradients). It
    checkpoints too (outside the steps: the same loss), after steps 10, 20 and 30 of its 40."""
    done = {}

    def of(strategy="ddp", zero_stage=0, schedule="gpipe", **shape):
        key = (strategy, zero_stage, schedule, *sorted(shape.items()))
        if key not in done:
            outcome, lines = bench_run(stack, tmp_path_factory.mktemp("plain"), "plain",
                                       framework="ddp", strategy=strategy, zero_stage=zero_stage,
                                       schedule=schedule, checkpoint_every=10, **shape)
            assert outcome.failed == 0, "\n".join(lines[-20:])
            r = outcome.records[0]
            assert_checkpoints(r["figures"], written=3)
            done[key] = [e["train_loss"] for e in r["epochs"]], r["figures"]["parameter_digests"][0]
        return done[key]
    return of


@pytest.mark.parametrize("framework,backend,strategy,zero_stage,schedule", [
    ("ddp", "gloo", "ddp", 0, "gpipe"),
    ("ddp", "gloo", "zero1", 0, "gpipe"),
    ("ddp", "gloo", "fsdp", 0, "gpipe"),
    ("ddp", "gloo", "pipeline", 0, "gpipe"),
    ("ddp", "gloo", "pipeline", 0, "1f1b"),
    pytest.param("ddp", "gloo", "deepspeed", 0, "gpipe", marks=needs_deepspeed),
    pytest.param("ddp", "gloo", "deepspeed", 3, "gpipe", marks=needs_deepspeed),
    pytest.param("horovod", "gloo", "ddp", 0, "gpipe", marks=requires_horovod),
    pytest.param("horovod", "mpi", "ddp", 0, "gpipe", marks=[requires_horovod, requires_mpirun]),
])
def test_a_killed_rank_is_survived_from_the_last_checkpoint(stack, tmp_path, uninterrupted, framework,
                                                           backend, strategy, zero_stage, schedule):
    """ZeRO-1 and FSDP compute DDP's update (the same averaged gradients, SGD on each
    parameter), so their uninterrupted loss is DDP's: one reference run serves all. Over
    torch's Gloo the parameters end bit for bit as that run's (Horovod sums otherwise).
    DeepSpeed (its own checkpoint folder: engine.save_checkpoint and load_checkpoint; at
    ZeRO stage 3 every rank writes its partition) is held to its own uninterrupted run, and
    the pipeline (each stage gathered to rank 0's file; rank 1, the last stage, computes
    the loss) to its own with the same schedule (--schedule is the pipeline's only). The
    1f1b run is 2 epochs of 20 steps, killed at step 25: it resumes from the checkpoint
    taken at the first epoch's last step, before that epoch's loss is summed over the
    ranks, where rank 0 must count none."""
    pipeline = strategy == "pipeline"
    shape = {"epochs": 2, "max_steps": 20} if schedule == "1f1b" else {}
    resumed = 20 if shape else 10
    outcome, lines = bench_run(stack, tmp_path, "killed", framework=framework, backend=backend,
                               strategy=strategy, zero_stage=zero_stage, checkpoint_every=10,
                               max_restarts=1, fault=f"1:{resumed + 5}:kill", schedule=schedule,
                               **shape)
    assert outcome.failed == 0, "\n".join(lines[-30:])
    (r,) = outcome.records
    assert r["status"] == "ok" and results.missing_fields(r) == []
    assert r["manifest"]["kit_path"].startswith(os.path.dirname(os.path.dirname(__file__)))
    (entry,) = r["restarts"]
    own = strategy == "deepspeed"       # a folder of DeepSpeed's files, not one file
    assert entry["resumed_from_step"] == resumed
    assert entry["checkpoint"] == f"step-{resumed:08d}" + ("" if own else ".pt")
    assert entry["error"]["rank"] == 1 and entry["error"]["signal"] == 9     # named as before
    assert entry["lost_s"] > 0
    losses, digest = uninterrupted(*((strategy, zero_stage, schedule) if own or pipeline else ("ddp",)),
                                   **shape)
    if own:     # the newest checkpoint, whole: DeepSpeed's files of every rank and the kit's
        kept = os.path.join(restarts.folder(outcome.run_dir, entry["attempt"]), "step-00000030")
        names = set(os.listdir(kept))
        assert checkpoint.META in names and (
            {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= names if zero_stage
            else "mp_rank_00_model_states.pt" in names), names
    assert len(r["epochs"]) == len(losses), r["epochs"]
    assert all(abs(e["train_loss"] - loss) < 1e-4 for e, loss in zip(r["epochs"], losses)), (
        [e["train_loss"] for e in r["epochs"]], losses)
    if pipeline:        # each rank holds its stage only: no replica is digested
        assert r["figures"]["parameter_digests"] == [None, None]
    else:
        assert len(set(r["figures"]["parameter_digests"])) == 1
    if framework == "ddp" and not pipeline:
        assert r["figures"]["parameter_digests"][0] == digest
    # the relaunch's steps only, after its own warm-up (a fresh process's first steps):
    # 40 - resumed - 5 (--warmup-steps); its start-up measured from its first step
    assert r["figures"]["timed_steps"] == 35 - resumed and r["figures"]["startup_s"] is not None
    # the relaunch wrote every 10 steps after the one it resumed from (none after the last, 40)
    written = len(range(resumed + 10, 40, 10))
    assert_checkpoints(r["figures"], written=written)
    shown = render(outcome.records, outcome.run_dir).splitlines()
    assert any(line.startswith("np=2: ok after 1 relaunch(es): rank 1") for line in shown), shown
    assert checkpoint_line(r) in shown and checkpoint_line(r).startswith(
        f"np=2: checkpoints (its last launch): {written} written, "), shown



def test_under_torchruns_own_restarts_a_killed_rank_resumes_from_the_last_checkpoint(tmp_path,
                                                                                     uninterrupted):
    """torchrun's elastic agent (`--max-restarts 1`) in place of bench's relaunch, as on a
    cluster whose script runs torchrun itself: when rank 1 SIGKILLs itself at step 15 the
    agent restarts both ranks, which learn it from TORCHELASTIC_RESTART_COUNT
    (lab.common.restarts.of_launch), resume from step 10's checkpoint and end with an
    uninterrupted run's loss and parameters; the fault does not fire again."""
    s = BenchSettings(np=[2], data="synthetic", synthetic_size=2560, max_steps=40,
                      results_dir=str(tmp_path), run_id="torchrun", checkpoint_every=10,
                      fault="1:15:kill")
    cfg = dataclasses.replace(script_config(s, "ddp", 2), threads=1)
    # torchrun's rendezvous shares its TCPStore with the ranks' process group by default,
    # and a restarted rank 1 can read rank 0's address of the round before from it (Gloo:
    # "connectFullMesh failed ... Connection refused"; 4 runs in 5 here): pytorch/pytorch
    # #135712 and #167288. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives each round a store
    # of its own (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py,
    # use_agent_store); every torchrun the kit would run with --max-restarts needs it.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")},
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", "--max-restarts", "1", "-m", "lab.worker.train",
                         *cfg.to_args()], capture_output=True, text=True, timeout=300, env=env,
                        cwd=os.path.dirname(os.path.dirname(__file__)))
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-3000:]
    # the first round ended (torchrun names whichever rank it saw end first: the killed
    # rank 1, or rank 0 whose collective lost its peer)
    assert "failed (exitcode: " in cp.stderr and "resuming from step 10" in cp.stdout
    run = tmp_path / "torchrun"
    [r] = results.read_records(run / results.RESULTS_FILE)[0]
    assert r["status"] == "ok"
    with open(restarts.resumed_path(restarts.folder(run, cfg.attempt), 1)) as f:
        said = json.load(f)
    assert said["from_step"] == 10 and said["checkpoint"] == "step-00000010.pt"
    losses, digest = uninterrupted("ddp")
    assert r["figures"]["final_loss"] == pytest.approx(losses[-1], abs=1e-4)
    assert r["figures"]["parameter_digests"] == [digest, digest]
