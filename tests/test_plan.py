"""The plan (lab.host.request.plan): flags parsed and checked once into an immutable list of
jobs, read by bench, sweeps, invoke sbatch and invoke k8s."""
import dataclasses
import inspect
import re

import pytest

import tasks
from lab.common import options, results
from lab.common.config import RunConfig
from lab.host.errors import BenchError
from lab.host.request import plan as plans
from lab.host.request.checks import settings_from_flags
from lab.host.settings import BENCH_FLAGS, BenchSettings, base_config
from lab.report import records

DEFAULTS = {"np": "2", "timeout_s": 3600}


def make(tmp_path, k8s=None, **flags):
    return plans.make_plan({"results_dir": str(tmp_path), **flags}, DEFAULTS, sections={"k8s": k8s})


def test_the_jobs_are_every_combination_and_process_count_repeats_interleaved(tmp_path):
    p = make(tmp_path, np="1,2", backend="gloo,mpi", repeat=2)
    order = [(j.repeat, j.settings.backend, j.np) for j in p.jobs]
    assert order == [(0, "gloo", 1), (0, "gloo", 2), (0, "mpi", 1), (0, "mpi", 2),
                     (1, "gloo", 1), (1, "gloo", 2), (1, "mpi", 1), (1, "mpi", 2)]
    assert p.sweep and len(p.combinations) == 2
    # One run id, fixed once for every job (the table reads the run back by it).
    assert len({j.settings.run_id for j in p.jobs}) == 1 and p.settings.run_id
    # Immutable: nothing downstream can change a job of the plan.
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.jobs[0].np = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.jobs[0].settings.np = [4]


def test_attempt_names_are_unique_within_a_plan(tmp_path):
    p = make(tmp_path, np="1,2", compression="none,fp16", repeat=2)
    names = [j.attempt("ddp") for j in p.jobs]
    assert len(set(names)) == len(names) == 8
    assert names[0] == "000-ddp-gloo-none-n1-np1-r0"


def test_resume_leaves_out_what_has_an_ok_record(tmp_path):
    first = make(tmp_path, np="1,2", framework="ddp", run_id="r")
    rfile = results.run_dir(str(tmp_path), "r") / results.RESULTS_FILE
    rfile.parent.mkdir(parents=True)
    job = first.jobs[1]                                     # np 2 ran and wrote its record
    cfg = dataclasses.replace(base_config(job.settings, "ddp"), expected_np=2, repeat=0)
    results.append_record(rfile, results.make_record("ok", run_id="r", config=cfg.as_record(),
                                                     np=2, nodes=1, started_at=results.now_iso(),
                                                     figures={"throughput_img_s": 100.0}))
    again = plans.make_plan({"results_dir": str(tmp_path), "np": "1,2", "framework": "ddp",
                             "run_id": "r"}, DEFAULTS, resume=True)
    assert [j.np for j in again.jobs] == [1]
    with pytest.raises(BenchError, match="--resume continues a sweep: give its --run-id"):
        plans.make_plan({"results_dir": str(tmp_path)}, DEFAULTS, resume=True)


def test_resume_after_a_run_with_framework_auto_runs_nothing_again(tmp_path):
    """The records hold the framework auto resolved to (here horovod); --resume with the
    same flags (framework left at auto) finds them."""
    first = make(tmp_path, np="1,2", run_id="r")
    assert first.settings.framework == "auto" and len(first.jobs) == 2
    rfile = results.run_dir(str(tmp_path), "r") / results.RESULTS_FILE
    rfile.parent.mkdir(parents=True)
    for job in first.jobs:
        cfg = dataclasses.replace(base_config(job.settings, "horovod"), expected_np=job.np, repeat=0)
        results.append_record(rfile, results.make_record("ok", run_id="r", config=cfg.as_record(),
                                                         np=job.np, nodes=1, started_at=results.now_iso(),
                                                         figures={"throughput_img_s": 100.0}))
    again = plans.make_plan({"results_dir": str(tmp_path), "np": "1,2", "run_id": "r"}, DEFAULTS,
                            resume=True)
    assert again.jobs == () and len(again.already) == 1
    # an explicit framework that did not run is still run
    other = plans.make_plan({"results_dir": str(tmp_path), "np": "1,2", "run_id": "r",
                             "framework": "ddp"}, DEFAULTS, resume=True)
    assert [j.np for j in other.jobs] == [1, 2]


def test_the_even_spread_refuses_one_run_and_skips_a_sweeps_combination(tmp_path):
    with pytest.raises(BenchError, match="--np 3 does not spread evenly over 2 nodes"):
        make(tmp_path, np="3", nodes="2")
    p = make(tmp_path, np="1,2", nodes="1,2")
    # only np 1 on 2 nodes: np 2 on 2 nodes, and both on 1 node, run
    assert dict(p.refused) == {(1, 1): "--np 1 does not spread evenly over 2 nodes: use a multiple of 2"}
    assert [(j.settings.nodes, j.np) for j in p.jobs] == [(1, 1), (1, 2), (2, 1), (2, 2)]


@pytest.fixture
def first_host_here(monkeypatch):
    """This machine is h1, the first host (lab.host.places.hosts.check_first_host)."""
    from lab.host.places import hosts
    monkeypatch.setattr(hosts, "is_this_machine", lambda name: name == "h1")


def test_hosts_are_parsed_once_and_fill_their_slots(tmp_path, first_host_here):
    p = make(tmp_path, np="3", hosts="h1:2,h2:1")
    assert [(h.name, h.slots) for h in p.place_options] == [("h1", 2), ("h2", 1)]
    assert p.settings.nodes == 2 and p.jobs[0].settings.nodes == 2
    with pytest.raises(BenchError, match="the hosts offer 3 slot"):
        make(tmp_path, np="4", hosts="h1:2,h2:1")


def test_a_script_holds_one_job(tmp_path):
    assert make(tmp_path, np="4").single("a batch script").np == [4]
    with pytest.raises(BenchError, match="a batch script runs one combination: give --backend one value"):
        make(tmp_path, np="4", backend="gloo,mpi").single("a batch script")
    with pytest.raises(BenchError, match="a Kubernetes job runs one process count"):
        make(tmp_path, np="2,4").single("a Kubernetes job")


def test_the_settings_carry_every_run_field_by_name():
    """A field shared by RunConfig and BenchSettings reaches the ranks' configuration
    without a line of its own: change each from its default and find it there."""
    run = RunConfig()
    changed = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in BENCH_FLAGS and f.name not in ("framework", "repeat", "stall_s"):
            value = getattr(run, f.name)
            changed[f.name] = (value + 3 if isinstance(value, int) and not isinstance(value, bool)
                               else f"x-{value}")
    cfg = base_config(BenchSettings(np=[1], **changed), "ddp")
    assert {k: getattr(cfg, k) for k in changed} == changed
    assert cfg.repeat == 0          # the settings' repeat is a count, the configuration's an index


@pytest.mark.parametrize("option", options.OPTIONS, ids=lambda o: o.name)
def test_each_option_of_the_table_is_derived_everywhere_it_belongs(option, tmp_path):
    """One row of lab.common.options reaches every place derived from it: the flag and help
    of each task that takes it, bench's settings (and invoke.yaml's keys), the resume key,
    the report's setup. A new row is checked here without a line of its own."""
    helps = {"bench": tasks.BENCH_HELP, "sbatch": tasks.SBATCH_HELP, "k8s": tasks.K8S_HELP}
    for task in (tasks.bench, tasks.sbatch, tasks.k8s):
        params = inspect.signature(task.body).parameters
        if task.name in option.tasks:
            assert option.name in params and option.flag in helps[task.name], (task.name, option.name)
        elif task.name == "bench":      # sbatch and k8s have flags of their own by some names
            assert option.name not in params
    assert (option.name in BENCH_FLAGS) == option.setting
    if option.setting:
        assert getattr(BenchSettings(np=[1]), option.name) == (
            [1] if option.name == "np" else option.value)
        # invoke.yaml's `bench:` default is honoured, and a flag given wins over it
        # (a strategy's own setting with the first strategy that reads it)
        base = {"np": 1, **({"strategy": option.strategies[0]} if option.strategies else {})}
        default, _ = settings_from_flags({}, base)
        given = changed(option)
        from_yaml, _ = settings_from_flags({}, {**base, option.name: given})
        assert getattr(from_yaml, option.name) != getattr(default, option.name), option.name
        from_flag, _ = settings_from_flags({option.name: given}, {**base, option.name: option.value})
        assert getattr(from_flag, option.name) == getattr(from_yaml, option.name), option.name
    # records as the kit writes them: the ranks' configuration, as_record
    config = RunConfig()
    if option.name in {f.name for f in dataclasses.fields(RunConfig)}:
        config = dataclasses.replace(config, **{option.name: changed(option)})
    run = {"config": RunConfig().as_record(), "world": {"nodes": 1, "np": 2}}
    other = {**run, "config": config.as_record()}
    assert (plans.record_key(run) != plans.record_key(other)) == option.key, option.name
    if option.name == "repeat":
        assert plans.record_key(other)[-1] == changed(option)
    # the report never compares runs whose setup differs (the strategy enters the setup by
    # its name, summary.strategy_name, with the settings that make it)
    assert (records.setup_key(run) != records.setup_key(other)) == (
        option.setup or option.name == "strategy"), option.name


def changed(option):
    """A value other than the option's default (and RunConfig's), of its kind, as invoke.yaml
    or a flag gives it."""
    if option.kind is list:
        return "1,2"
    if option.kind in (int, float):
        return option.value + 3
    if option.kind is bool:
        return not option.value
    other = [c for c in option.choices if c not in (option.value, getattr(RunConfig, option.name, None))]
    return other[-1] if other else f"x-{option.value}"


def test_every_field_of_the_ranks_configuration_is_an_option_or_the_ranks_own():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert fields == (fields & set(options.BY_NAME)) | set(options.RANK_ONLY)
    assert not set(options.RANK_ONLY) & set(options.BY_NAME)


def test_every_flag_of_bench_is_an_option_of_the_table():
    params = set(inspect.signature(tasks.bench.body).parameters) - {"c"}
    assert params == {o.name for o in options.of_task("bench")}
    assert {k.replace("-", "_") for k in tasks.BENCH_HELP} == params


def test_resume_in_a_run_folder_of_another_model_runs_it(tmp_path):
    """The resume key holds every option that changes a run (the table's `key` column), not
    only the sweep's lists: a folder with MNIST's runs does not make --model lstm's done."""
    first = make(tmp_path, np="1", framework="ddp", run_id="r")
    rfile = results.run_dir(str(tmp_path), "r") / results.RESULTS_FILE
    rfile.parent.mkdir(parents=True)
    cfg = dataclasses.replace(base_config(first.jobs[0].settings, "ddp"), expected_np=1)
    results.append_record(rfile, results.make_record("ok", run_id="r", config=cfg.as_record(),
                                                     np=1, nodes=1, started_at=results.now_iso(),
                                                     figures={"throughput_img_s": 100.0}))
    same = dict(results_dir=str(tmp_path), np="1", framework="ddp", run_id="r")
    assert plans.make_plan(same, DEFAULTS, resume=True).jobs == ()
    for other in (dict(model="lstm"), dict(batch_size="32"), dict(seed="7"), dict(max_steps="3")):
        assert len(plans.make_plan({**same, **other}, DEFAULTS, resume=True).jobs) == 1, other


def test_hosts_take_no_setting_of_the_simulated_cluster(tmp_path, first_host_here):
    for flags, shown in ((dict(link="1gbit"), "--link 1gbit"), (dict(nodes="1,2"), "--nodes 2"),
                         (dict(nodes="2"), "--nodes 2")):
        with pytest.raises(BenchError, match=f"^{shown} is not honoured by your servers over SSH"):
            make(tmp_path, np="2", hosts="h1:1,h2:1", **flags)


def test_a_resumed_combination_that_is_skipped_records_only_what_was_not_recorded(tmp_path):
    """np 1 of ddp over nccl was recorded ok (made by the kit's writer); on --resume the
    combination cannot run here (no GPU) and is skipped: for np 2 only."""
    from lab.host.run import sweep
    rfile = results.run_dir(str(tmp_path), "r") / results.RESULTS_FILE
    rfile.parent.mkdir(parents=True)
    s = BenchSettings(np=[1], framework="ddp", backend="nccl", results_dir=str(tmp_path), run_id="r")
    cfg = dataclasses.replace(base_config(s, "ddp"), expected_np=1)
    results.append_record(rfile, results.make_record("ok", run_id="r", config=cfg.as_record(), np=1,
                                                     nodes=1, started_at=results.now_iso(),
                                                     figures={"throughput_img_s": 100.0}))
    p = plans.make_plan({"results_dir": str(tmp_path), "np": "1,2", "framework": "ddp",
                         "backend": "nccl", "compression": "none,fp16", "run_id": "r",
                         "local": True}, DEFAULTS, resume=True)
    lines: list[str] = []
    sweep.run_sweep(p, echo=lines.append)
    skipped = [(r["config"]["compression"], r["world"]["np"]) for r in results.read_records(rfile)[0]
               if r["status"] == "skipped"]
    assert sorted(skipped) == [("fp16", 1), ("fp16", 2), ("none", 2)], lines


def test_the_plan_holds_the_options_of_launcher_k8s(tmp_path):
    """invoke.yaml's k8s: section reaches the runner through the plan (no global)."""
    p = make(tmp_path, np="2", launcher="k8s", k8s={"api": "pytorchjob", "registry": "r.example/x"})
    assert p.place_options.opts.api == "pytorchjob" and p.place_options.opts.registry == "r.example/x"
    assert p.settings.stall_s == 0 and make(tmp_path, np="2").place_options is None   # watched over its log


def test_invoke_yamls_bench_switches_are_honoured_and_a_switch_given_wins(tmp_path):
    """ceiling, debug and frozen given as defaults hold when the flags are left off (None);
    --X (True) and --no-X (False) win over invoke.yaml either way."""
    from lab.host.request.checks import settings_from_flags
    flags = {"ceiling": None, "debug": None, "frozen": None, "local": False, "image": None, "np": None}
    on = {"np": "2", "ceiling": True, "debug": True, "frozen": True}
    s, _ = settings_from_flags(flags, on)
    assert s.ceiling and s.debug and s.frozen
    s, _ = settings_from_flags(dict(flags, ceiling=True), {"np": "2"})
    assert s.ceiling and not s.debug and not s.frozen
    s, _ = settings_from_flags(dict(flags, ceiling=False, debug=False, frozen=False), on)
    assert not (s.ceiling or s.debug or s.frozen)
    s, _ = settings_from_flags(dict(flags, debug=False), on)
    assert s.ceiling and not s.debug and s.frozen


@pytest.mark.parametrize("key,hint", [("epoch", "did you mean 'epochs'?"), ("cieling", "did you mean 'ceiling'?"),
                                      ("zzz", "one of ")])
def test_a_misspelt_bench_default_is_one_sentence_naming_the_closest(key, hint):
    from lab.host.request.checks import settings_from_flags
    with pytest.raises(BenchError, match=f"invoke.yaml's bench: has no setting '{key}': {re.escape(hint)}"):
        settings_from_flags({"np": None}, {"np": "2", key: 1})


def test_a_sweep_over_nodes_with_a_link_runs_one_node_unshaped_as_the_baseline(tmp_path):
    p = make(tmp_path, np="1,2", nodes="1,2", link="1gbit", framework="ddp")
    refused = dict(p.refused)
    got = sorted((j.settings.nodes, j.np, j.settings.link) for j in p.jobs
                 if (j.combination, j.np) not in refused)
    assert got == [(1, 1, ""), (1, 2, ""), (2, 2, "1gbit")]       # np 1 on 2 nodes: uneven
    with pytest.raises(BenchError, match="^--link 1gbit is not honoured by local processes"):
        make(tmp_path, np="1", nodes="1", link="1gbit", framework="ddp")


def test_a_launcher_that_is_no_place_is_one_sentence(tmp_path):
    with pytest.raises(BenchError, match=r"--launcher is one of direct, slurm, k8s, not 'pbs'"):
        make(tmp_path, launcher="pbs")




def test_a_task_body_receives_every_flag_of_the_table_given_or_not():
    """flag_help.takes: called from Python as from invoke's parser, the body gets each
    option (its not-given value), and a name the task does not take is refused."""
    from lab.host.cli.flag_help import takes

    @takes("k8s")
    def body(c, nodes=None, **run):
        return nodes, run
    nodes, run = body(None, np="2", nodes="1")
    assert nodes == "1" and run["np"] == "2"
    assert set(run) == {o.name for o in options.of_task("k8s")} - {"nodes"}
    assert run["seed"] is None
    with pytest.raises(TypeError, match="bogus"):
        body(None, bogus=1)


# A value other than the default for every option a script for another cluster carries.
# (the value, with the other flags it needs)
ONE_JOB_VALUES = {"framework": "horovod", "backend": ("mpi", {"framework": "horovod"}), "compression": "fp16", "model": "lstm",
                  "data": "digits", "device": "cuda", "batch_size": "36", "epochs": "3",
                  "max_steps": "7", "seed": "9", "threads": "2", "warmup_steps": "3",
                  "run_id": "rid-1", "strategy": "zero1",
                  "micro_batches": ("8", {"strategy": "pipeline", "framework": "ddp"}),
                  "schedule": ("1f1b", {"strategy": "pipeline", "framework": "ddp"}),
                  "zero_stage": ("2", {"strategy": "deepspeed"}), "data_dir": "elsewhere",
                  "precision": "bf16", "checkpoint_every": "10", "compile": "True",
                  "max_restarts": ("2", {"framework": "horovod"})}   # a TrainJob refuses it


@pytest.mark.parametrize("task", ["sbatch", "k8s"])
def test_each_option_of_a_script_for_another_cluster_reaches_its_ranks(task, tmp_path):
    """Every option `invoke sbatch` and `invoke k8s` take (the table's ONE_JOB rows) is in
    the ranks' command of the script or manifest they write, with its value."""
    from lab.host.places.k8s import manifest as kube
    from lab.host.places.slurm.script import script_for_request
    taken = [o.name for o in options.of_task(task) if o.name not in ("np", "results_dir")]
    assert set(taken) <= set(ONE_JOB_VALUES), set(taken) - set(ONE_JOB_VALUES)
    for name in taken:
        value, others = ONE_JOB_VALUES[name], {}
        if isinstance(value, tuple):
            value, others = value
        flags = {"results_dir": str(tmp_path), "np": "1", **others, name: value}
        s = plans.make_plan(flags, {"np": "2", "timeout_s": 3600}).single(task)
        if task == "sbatch":
            # the script's long lines go on after a backslash
            text = re.sub(r"\s*\\\n\s*", " ", script_for_request(s)[0])
        else:
            # checkpoints need a volume a retried pod reads them from (refused without one)
            pvc = {"pvc": "claim"} if name == "checkpoint_every" else {}
            text = str(kube.manifest_for_request(s, kube.options({"registry": "r.example/x", **pvc})).body)
            # with a volume the command stays a list (no shell printing the record after it)
            text = re.sub(r"'(--[\w-]+)', '", r"'\1 ", text)
        if task == "k8s" and name == "max_restarts":    # the operator's, which retries the ranks
            assert f"'backoffLimit': {value}" in text, text
            continue
        if task == "sbatch" and name == "max_restarts":     # the script's, retrying its step
            assert f"for restart in $(seq 0 {value}); do" in text and '--restart "$restart"' in text, text
            continue
        # the framework is the launcher's choice (horovodrun, torch.distributed.run)
        flag = f"--{options.BY_NAME[name].flag} " if name != "framework" else ""
        assert re.search(re.escape(flag) + r"(\S*/)?" + re.escape(value) + r"\b", text), (task, name)


def test_a_strategys_own_setting_without_that_strategy_is_refused():
    """--zero-stage 2 with ddp would be recorded and change nothing: refused in one line;
    in a sweep where one strategy reads it, it is taken."""
    with pytest.raises(BenchError, match="--zero-stage is for the deepspeed strategy, and this runs ddp: "
                                         "add --strategy deepspeed, or leave out --zero-stage"):
        settings_from_flags({"zero_stage": 2}, {"np": 1})
    with pytest.raises(BenchError, match="--schedule is for the pipeline strategy, and this runs ddp, zero1"):
        settings_from_flags({"schedule": "1f1b", "strategy": "ddp,zero1"}, {"np": 1})
    # invoke.yaml's default for the strategy that reads it holds for the others' runs
    assert settings_from_flags({}, {"np": 1, "schedule": "1f1b"})[0].schedule == "1f1b"
    s, lists = settings_from_flags({"zero_stage": 2, "strategy": "ddp,deepspeed"}, {"np": 1})
    assert s.zero_stage == 2 and lists["strategy"] == ["ddp", "deepspeed"]
    assert settings_from_flags({"micro_batches": 8, "strategy": "rpc-pipeline"}, {"np": 1})[0].micro_batches == 8
    for o in options.OPTIONS:           # every strategy named is one
        assert set(o.strategies) <= set(options.BY_NAME["strategy"].choices), o.name


@pytest.mark.parametrize("task", ["sbatch", "k8s"])
def test_a_scripts_help_says_the_defaults_bench_would_take(task):
    """invoke sbatch and invoke k8s take bench's defaults (invoke.yaml's `bench:`): their
    help says them, as bench's does."""
    helps = {"sbatch": tasks.SBATCH_HELP, "k8s": tasks.K8S_HELP}[task]
    for flag in ("backend", "batch-size", "model", "np"):
        assert re.search(r"\(default: \S+\)", helps[flag]), (task, flag, helps[flag])
    assert helps["np"].endswith("(default: 2)") and helps["batch-size"].endswith(f"(default: {RunConfig.batch_size})")
    # sbatch asks for a wall time only when given; a Kubernetes job has bench's limit
    assert ("(default: 3600)" in helps["timeout-s"]) == (task == "k8s")
