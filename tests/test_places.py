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

from lab.common import heartbeat
from lab.host import places
from lab.host.errors import RunnerError
from lab.host.places.base import FEATURES, Runner
from lab.host.request import BenchError, BenchSettings

CELLS = [(name, feature) for name in places.PLACES for feature in FEATURES]


def request_for(name: str, **kw) -> BenchSettings:
    """A request that the registry's place_of sends to `name`."""
    how = {"local": dict(where="local"), "image": dict(where="image"), "compose": dict(nodes=2),
           "hosts": dict(hosts="a:1,b:1"), "k8s": dict(launcher="k8s", nodes=2, where="auto")}.get(name)
    s = BenchSettings(np=[2], timeout_s=60, **(how or dict(launcher=name, nodes=2)), **kw)
    assert places.place_of(s) == name
    return s


def overrides(cls, method: str) -> bool:
    return getattr(cls, method) is not getattr(Runner, method)


# What each feature needs of a place that says it works.
def stall_watch_works(cls, name):
    # The watch reads the heartbeats in the run's folder on this machine, or their marker
    # lines in the output run() streams to the echo bench hands it (lab.host.stall).
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
    # by the place (lab.common.forwarded_env.forwarded).
    sources = [inspect.getsource(sys.modules[c.__module__]) for c in cls.__mro__ if c is not object]
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
    with pytest.raises(RunnerError, match="leave out --nodes"):
        places.for_request(request_for("hosts"), sweep={"nodes": [1, 2]})


@pytest.mark.parametrize("setting", places.OWN_SETTINGS)
def test_a_setting_of_one_place_is_refused_elsewhere_with_its_line(setting):
    """OWN_SETTINGS: a setting only one place takes (--partition: Slurm's) is refused in
    one line in every other place, and where the engine decides."""
    owner, line = places.OWN_SETTINGS[setting]
    others = [request_for(n) for n in places.PLACES if n not in (owner, "hosts")]
    for s in [*others, BenchSettings(np=[1], where="auto")]:
        with pytest.raises(RunnerError, match=re.escape(line)):
            places.for_request(dataclasses.replace(s, **{setting: "x"}))
    s, _ = places.for_request(dataclasses.replace(request_for(owner), **{setting: "x"}))
    assert getattr(s, setting) == "x"


def test_the_hosts_own_refusal_comes_before_another_places_setting():
    """--hosts with --launcher slurm --partition p: the hosts' line (leave out --launcher),
    not Slurm's to someone who gave it."""
    s = dataclasses.replace(request_for("hosts"), launcher="slurm", partition="p")
    with pytest.raises(RunnerError, match="--hosts runs on your servers over SSH: leave out --nodes"):
        places.for_request(s)
    with pytest.raises(RunnerError, match="--partition is Slurm's"):
        places.for_request(dataclasses.replace(request_for("hosts"), partition="p"))
