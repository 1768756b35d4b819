"""invoke.yaml's sections of the tasks: a key a task does not have is one sentence naming
the closest (invoke would drop it without a word), checked before the task does anything."""
import subprocess
import sys
from pathlib import Path

import pytest

from lab.host.cli.task_defaults import TaskDefaultsError, section, settings_of

REPO = Path(__file__).resolve().parent.parent


def test_a_section_is_checked_against_the_tasks_settings():
    def task(c, nodes=None, results_dir=None):
        pass
    assert settings_of(task) == {"nodes", "results_dir"}
    assert section({"up": {"nodes": 3}}, "up", {"nodes"}) == {"nodes": 3}
    assert section({}, "up", {"nodes"}) == {}
    with pytest.raises(TaskDefaultsError, match="has no setting 'node': did you mean 'nodes'"):
        section({"up": {"node": 3}}, "up", {"nodes", "scheduler"})
    with pytest.raises(TaskDefaultsError, match="it takes nodes, scheduler"):
        section({"up": {"zzz": 1}}, "up", {"nodes", "scheduler"})


@pytest.mark.parametrize("task,yaml,closest", [
    (["up"], "up:\n  node: 3\n", "'nodes'"),
    (["lab", "--dry-run"], "lab:\n  quik: true\n", "'quick'"),
    (["acceptance", "--dry-run"], "acceptance:\n  result_dir: x\n", "'results_dir'"),
    (["build"], "build:\n  flavour: cpu\n", "'flavor'"),
    (["bench", "--np", "1"], "bench:\n  epoch: 2\n", "'epochs'"),
])
def test_a_misspelt_key_of_invoke_yaml_is_one_sentence(tmp_path, task, yaml, closest):
    config = tmp_path / "invoke.yaml"
    config.write_text(yaml)
    cp = subprocess.run([sys.executable, "-m", "invoke", "-f", str(config), *task], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert f"did you mean {closest}?" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


def test_a_right_key_is_taken(tmp_path):
    config = tmp_path / "invoke.yaml"
    config.write_text(f"lab:\n  quick: true\n  results_dir: {tmp_path / 'r'}\n")
    cp = subprocess.run([sys.executable, "-m", "invoke", "-f", str(config), "lab", "--dry-run"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert str(tmp_path / "r") in cp.stdout and not (tmp_path / "r").exists()


REFUSED = "--ceiling measures the compute ceiling"     # a Kubernetes job's refusal of it


@pytest.mark.parametrize("yaml_says,flag,on", [
    ("true", [], True), ("true", ["--no-ceiling"], False), ("false", ["--ceiling"], True),
    ("false", ["--no-ceiling"], False), ("true", ["--ceiling"], True)])
def test_a_switch_given_wins_over_invoke_yaml_either_way(tmp_path, yaml_says, flag, on):
    """invoke.yaml's bench: ceiling: true holds when the flag is left off, and --no-ceiling
    turns it off (--ceiling on): seen through a place that refuses the ceiling before any
    job (--launcher k8s), so nothing runs."""
    config = tmp_path / "invoke.yaml"
    config.write_text(f"bench:\n  np: \"1\"\n  ceiling: {yaml_says}\n")
    cp = subprocess.run([sys.executable, "-m", "invoke", "-f", str(config), "bench", "--launcher", "k8s",
                         "--results-dir", str(tmp_path / "r"), *flag], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert (REFUSED in cp.stderr) == on, cp.stderr


def test_bench_help_names_the_off_form_of_each_switch_invoke_yaml_can_turn_on():
    from lab.common import options
    cp = subprocess.run([sys.executable, "-m", "invoke", "--help", "bench"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    for o in options.of_task("bench"):
        if o.kind is bool:
            assert (f"--[no-]{o.flag} " in cp.stdout) == o.setting, o.flag
