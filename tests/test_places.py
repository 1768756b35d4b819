"""Every feature that spans runs x every registered place to run, generated from the
registry (lab.host.places.PLACES) and the interface's list (lab.host.places.base.FEATURES):
a cell either works, by what the interface says of the place and what the feature needs
of it, or the place says in one line why it does not and the user is told that line.
A place added to the registry, or a feature added to the list, is covered without being
named here. The toy place at the end is added as a place is: one module, one line."""
import dataclasses
import inspect
import re
import sys
import textwrap

import pytest

from lab.common import heartbeat, options
from lab.common.config import RunConfig
from lab.host import places
from lab.host.errors import BenchError, RunnerError
from lab.host.places import launch
from lab.host.places.base import FEATURES, Runner
from lab.host.request.checks import settings_from_flags
from lab.host.settings import BenchSettings

CELLS = [(name, feature) for name in places.PLACES for feature in FEATURES]


@pytest.fixture(autouse=True)
def first_host_here(monkeypatch):
    """This machine is `a`, request_for's first host (hosts.check_first_host)."""
    from lab.host.places import hosts
    monkeypatch.setattr(hosts, "is_this_machine", lambda name: name == "a")


def request_for(name: str, **kw) -> BenchSettings:
    """A request that the registry's place_of sends to `name`, asking for nothing the
    place does not honour (where: auto, as invoke.yaml's, outside local processes)."""
    how = {"local": dict(where="local"), "image": dict(where="image"), "compose": dict(nodes=2),
           "hosts": dict(hosts="a:1,b:1"), "k8s": dict(launcher="k8s", nodes=2)}.get(name)
    how = how or dict(launcher=name, nodes=2)
    s = BenchSettings(np=[2], timeout_s=60, **{"where": "auto", **how, **kw})
    assert places.place_of(s) == name
    return s


def overrides(cls, method: str) -> bool:
    return getattr(cls, method) is not getattr(Runner, method)


# What each feature needs of a place that says it works.
def stall_watch_works(cls, name):
    # The watch reads the heartbeats in the run's folder on this machine, or their marker
    # lines in the output run() streams to the echo bench hands it (lab.host.watch.stall).
    assert cls.heartbeat_channel in heartbeat.CHANNELS
    if cls.heartbeat_channel != "folder":
        assert overrides(cls, "run") and "echo" in inspect.signature(cls.run).parameters
    s, _ = places.for_request(request_for(name, stall_s=30.0))
    assert s.stall_s == 30.0


def progress_works(cls, name):
    # Rank 0's progress lines reach bench through the echo run() streams every line to.
    assert overrides(cls, "run") and "echo" in inspect.signature(cls.run).parameters


def oversubscription_works(cls, name):
    # Judged by machines(): a place's own, or the interface's one machine of known cores.
    assert overrides(cls, "machines") or cls.machine_name


def ceiling_placement_works(cls, name):
    # The ceiling runs where the ranks run: a probe on each host of placement().
    assert overrides(cls, "output") or overrides(cls, "output_on")
    assert places.for_request(request_for(name, ceiling=True))[0].ceiling


def failure_naming_works(cls, name):
    # The dead rank's own file (failures/<attempt>/rank-N.json) is read from the run's
    # folder; a place whose ranks write elsewhere says which of its hosts died.
    assert cls.rank_files == "folder" or overrides(cls, "dead")


def resume_works(cls, name):
    # --resume reads the records in this machine's results file: the ranks write there,
    # or the place appends what its ranks print (the API's logs).
    assert cls.rank_files in ("folder", "logs")


def forwarded_variables_work(cls, name):
    # The host's NCCL/UCX/MPI variables: inherited by local processes, else handed over
    # by the place (lab.common.forwarded_env.forwarded), in its runner's module or another
    # of its own package (Kubernetes: the manifest's, which both of its tasks write).
    own = {c.__module__ for c in cls.__mro__ if c is not object}
    packages = {m.rsplit(".", 1)[0] for m in own if m.count(".") > 3}      # lab.host.places.<place>.
    sources = [inspect.getsource(mod) for name, mod in list(sys.modules.items())
               if name in own or any(name.startswith(p + ".") for p in packages)]
    assert any("forwarded(os.environ" in s or "dict(os.environ" in s for s in sources)


WORKS = {"stall watch": stall_watch_works, "progress": progress_works,
         "oversubscription": oversubscription_works, "ceiling placement": ceiling_placement_works,
         "failure naming": failure_naming_works, "resume": resume_works,
         "forwarded variables": forwarded_variables_work}


def told_line(cls, name, feature, monkeypatch) -> str:
    """What the user sees of a feature the place cannot offer, when the request uses it."""
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    if feature == "ceiling placement":
        with pytest.raises((RunnerError, BenchError)) as e:
            places.for_request(request_for(name, ceiling=True))
        return str(e.value)
    lines: list[str] = []
    s, _ = places.for_request(request_for(name, stall_s=30.0), echo=lines.append)
    if feature == "stall watch":
        assert s.stall_s == -1          # and it is off, not silently wrong
    return next((line for line in lines if line == cls.cannot(feature)), "")


def test_every_feature_has_its_check():
    assert set(WORKS) == set(FEATURES)


@pytest.mark.parametrize("name,feature", CELLS, ids=[f"{n}-{f.replace(' ', '_')}" for n, f in CELLS])
def test_a_feature_works_in_a_place_or_the_user_is_told_why_in_one_line(name, feature, monkeypatch):
    cls = places.place(name)
    reason = cls.cannot(feature)
    if reason is None:
        WORKS[feature](cls, name)
        return
    assert reason.strip() and "\n" not in reason and len(reason) < 240, reason
    assert told_line(cls, name, feature, monkeypatch) == reason


def test_the_cell_check_fails_for_a_place_that_is_silently_wrong():
    """The check itself works: a place whose heartbeats reach this machine by no channel
    the watch reads, and that does not say the stall watch is off there, fails its cell."""
    k8s = places.place("k8s")
    quiet = type("Quiet", (k8s,), {"unsupported": {}, "heartbeat_channel": "nowhere"})
    with pytest.raises(AssertionError):
        stall_watch_works(quiet, "k8s")


def test_an_unknown_feature_is_an_error():
    with pytest.raises(ValueError, match="no feature 'gpus'"):
        Runner.cannot("gpus")


TOY = '''
"""A toy place: local processes that say the stall watch is off."""
from lab.host.places.local import LocalRunner


class ToyRunner(LocalRunner):
    kind = "toy"
    title = "the toy place"
    honours = LocalRunner.honours | {"launcher", "nodes"}
    unsupported = {"stall watch": "the toy place keeps no time: the stall watch is off"}
'''


def test_a_place_is_its_module_and_one_registry_line(tmp_path, monkeypatch):
    (tmp_path / "toy_place.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(places.PLACES, "toy", "toy_place:ToyRunner")       # the one line
    cls = places.place("toy")
    for feature in FEATURES:
        test_a_feature_works_in_a_place_or_the_user_is_told_why_in_one_line("toy", feature, monkeypatch)
    lines: list[str] = []
    s, _ = places.for_request(dataclasses.replace(request_for("toy"), stall_s=30.0), echo=lines.append)
    assert s.stall_s == -1 and lines == [cls.unsupported["stall watch"]]
    # bench makes the runner of a request the toy place runs through the registry
    runner, where = places.runner_for(dataclasses.replace(s, results_dir=str(tmp_path)))
    assert type(runner) is cls and where == runner.describe()


@pytest.mark.parametrize("name", [n for n in places.PLACES if n not in ("local", "image")])
def test_a_place_a_request_names_makes_its_runner_from_the_request(name):
    """bench asks the registry (places.runner_for) for the runner of a request; every place
    the request names (not the engine's choice of local processes or the image) makes it
    from the request and the options its for_request made (Runner.from_request)."""
    cls = places.place(name)
    assert cls.from_request.__func__ is not Runner.from_request.__func__, name


def test_the_hosts_are_parsed_by_their_place_and_make_its_runner(tmp_path):
    s, hosts = places.for_request(dataclasses.replace(request_for("hosts"), results_dir=str(tmp_path)))
    assert [(h.name, h.slots) for h in hosts] == [("a", 1), ("b", 1)] and s.nodes == 2
    runner, _ = places.runner_for(s, hosts)
    assert runner.hosts == list(hosts)
    with pytest.raises(RunnerError, match=r"^--nodes 2 is not honoured by your servers"):
        places.for_request(request_for("hosts"), sweep={"nodes": [1, 2]})


def test_the_hosts_own_refusal_comes_before_another_places_setting():
    """--hosts with --launcher slurm --partition p: refused for --launcher (the first of
    them in the option table), naming the servers, not as Slurm's to someone who gave it."""
    s = dataclasses.replace(request_for("hosts"), launcher="slurm", partition="p")
    with pytest.raises(RunnerError, match=r"^--launcher slurm is not honoured by your servers over SSH"):
        places.for_request(s)
    with pytest.raises(RunnerError, match=r"^--partition p is not honoured by your servers"):
        places.for_request(dataclasses.replace(request_for("hosts"), partition="p"))


# ------------------------------------------------ every option x every place

# A value of each option of reach "place" that asks for it (places.asked): a new such row
# needs one here, and every place must then honour it or refuse it.
ASK = {"local": dict(where="local"), "where": dict(where="image"), "image": dict(image="x:1"),
       "frozen": dict(frozen=True), "nodes": dict(nodes=2), "link": dict(link="1gbit"),
       "launcher": dict(launcher="slurm"), "partition": dict(partition="p"),
       "hosts": dict(hosts="a:1,b:1"), "hostfile": dict(hostfile="hosts.txt"),
       "results_dir": dict(results_dir="elsewhere"), "data_dir": dict(data_dir="elsewhere"),
       "checkpoint_every": dict(checkpoint_every=10), "max_restarts": dict(max_restarts=1)}
OPTION_CELLS = [(name, o.name) for name in places.PLACES for o in options.OPTIONS]


def reaches_the_ranks(o) -> bool:
    """In the ranks' arguments (a field of RunConfig) or their environment (job_env)."""
    return (o.name in {f.name for f in dataclasses.fields(RunConfig)}
            or f"s.{o.name}" in inspect.getsource(launch.job_env))


def passes_the_ranks_through(cls) -> bool:
    """The place's commands carry the launch's arguments and environment."""
    sources = "".join(inspect.getsource(sys.modules[c.__module__]) for c in cls.__mro__
                      if c is not object and c is not Runner)
    return ("worker_args" in sources or "to_args" in sources or "run=cfg" in sources) and (
        "job.environment" in sources or "job_env" in sources or "environ" in sources)


@pytest.mark.parametrize("name,option", OPTION_CELLS, ids=[f"{n}-{o}" for n, o in OPTION_CELLS])
def test_an_option_is_honoured_by_a_place_or_refused_in_one_sentence(name, option):
    """Every row of the option table x every place of the registry: the row's reach
    (lab.common.options.Option.reach) says how, and a place honours it or refuses it."""
    o, cls = options.BY_NAME[option], places.place(name)
    if o.reach == "ranks":
        # the default: what the ranks get, which every place passes through
        assert reaches_the_ranks(o), (f"--{o.flag} reaches neither the ranks' arguments nor their "
                                      f"environment: declare its reach in lab/common/options.py")
        assert passes_the_ranks_through(cls), name
    elif o.reach == "bench":
        # bench's own, on this machine; a feature it asks for is the place's to offer
        # or to say why not (the feature x place cells above)
        assert not o.feature or o.feature in FEATURES, o.feature
    else:
        assert o.name in ASK, f"give ASK a value that asks for --{o.flag}"
        s = dataclasses.replace(BenchSettings(np=[2], where="auto"), **ASK[o.name])
        assert places.asked(s, o)
        if o.name in cls.honours:
            return
        line = places.refusal(s, name)
        assert line and "\n" not in line and len(line) < 240, line
        assert line.startswith(places.shown(s, o)) and cls.title in line, line


def test_what_a_place_honours_is_an_option_of_its_own():
    """A misspelt name in a place's honours would refuse the option it meant."""
    own = {o.name for o in options.OPTIONS if o.reach == "place"}
    for name in places.PLACES:
        assert places.place(name).honours <= own, name
        assert places.place(name).title != Runner.title, name


def test_the_option_check_fails_for_an_undeclared_row(monkeypatch):
    """A row that reaches neither the ranks nor a place's declaration fails its cells."""
    row = options.Option("colour", "a setting no rank reads", options.GROUPS[0], default="red")
    monkeypatch.setitem(options.BY_NAME, "colour", row)
    with pytest.raises(AssertionError, match="declare its reach"):
        test_an_option_is_honoured_by_a_place_or_refused_in_one_sentence("local", "colour")
    placed = dataclasses.replace(row, reach="place")
    monkeypatch.setitem(options.BY_NAME, "colour", placed)
    with pytest.raises(AssertionError, match="give ASK a value"):
        test_an_option_is_honoured_by_a_place_or_refused_in_one_sentence("local", "colour")


def flags(**kw):
    """The request `invoke bench` makes of these flags, over invoke.yaml's where: auto."""
    return settings_from_flags({"np": "2", **kw}, {"where": "auto"})


@pytest.mark.parametrize("given,refused", [
    (dict(local=True, nodes="2"), "--local is not honoured by the simulated cluster (--nodes)"),
    (dict(local=True, nodes="1,2"), "--local is not honoured by the simulated cluster (--nodes)"),
    (dict(local=True, launcher="slurm"), "--local is not honoured by Slurm on the simulated cluster"),
    (dict(local=True, hosts="a:1,b:1"), "--local is not honoured by your servers over SSH (--hosts)"),
    (dict(image="dl-lab-kit:gpu-nccl", hosts="a:1,b:1"),
     "--image dl-lab-kit:gpu-nccl is not honoured by your servers over SSH (--hosts)"),
    (dict(image="x:1", launcher="slurm"), "--image x:1 is not honoured by Slurm"),
    (dict(image="x:1", nodes="2"), "--image x:1 is not honoured by the simulated cluster"),
    (dict(image="x:1", local=True), "--image x:1 is not honoured by local processes"),
    (dict(frozen=True, local=True), "--frozen is not honoured by local processes"),
    (dict(frozen=True, hosts="a:1,b:1"), "--frozen is not honoured by your servers over SSH"),
    (dict(data_dir="/d", launcher="k8s", nodes="2"), "--data-dir /d is not honoured by Kubernetes"),
    (dict(partition="p", local=True), "--partition p is not honoured by local processes"),
    (dict(partition="p"), "--partition p is not honoured by local processes or the lab image"),
])
def test_a_flag_its_place_cannot_honour_is_refused_before_anything_runs(given, refused):
    s, lists = flags(**given)
    with pytest.raises(RunnerError, match="^" + re.escape(refused)):
        places.for_request(s, sweep=lists)


def test_frozen_where_the_engine_decides_insists_on_the_image(monkeypatch):
    """--frozen (the image's own kit) never falls back to local processes."""
    from lab.common import docker_api
    def no_engine():
        raise docker_api.DockerUnavailable("no Docker engine answers")
    monkeypatch.setattr(docker_api, "client", no_engine)
    s, lists = flags(frozen=True)
    assert places.for_request(s, sweep=lists)[0].frozen
    with pytest.raises(RunnerError, match="no Docker engine answers"):
        places.choose_runner(where="auto", frozen=True)
    runner, _ = places.choose_runner(where="auto")
    assert runner.kind == "local"
