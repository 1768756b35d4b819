"""A flag or a value the kit does not know: one line naming the closest, no traceback."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.host.cli.cli_hints import hint

REPO = Path(__file__).resolve().parent.parent


def invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,words", [
    (["bench", "--epoch", "2"], "`invoke bench` has no flag --epoch: did you mean --epochs?"),
    (["bench", "--framwork", "ddp"], "did you mean --framework?"),
    (["bench", "--gpus", "2"], "use --np N --device cuda"),
    (["bench", "--nproc-per-node=2"], "has no flag --nproc-per-node: use --np"),
    (["k8s", "--gpus-per-nod", "2"], "`invoke k8s` has no flag --gpus-per-nod: did you mean --gpus-per-node?"),
    (["doctor", "--wid"], "did you mean --wide?"),
])
def test_an_unknown_flag_names_the_closest(args, words):
    cp = invoke(*args)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and words in cp.stderr, cp.stderr
    assert f"`invoke {args[0]} --help` lists them" in cp.stderr


def test_an_unknown_value_names_the_closest(tmp_path):
    cp = invoke("bench", "--local", "--np", "1", "--framework", "horovd", "--results-dir", str(tmp_path))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert "unknown --framework 'horovd': did you mean 'horovod'?" in cp.stderr
    assert not list(tmp_path.iterdir())


def test_other_parse_errors_are_left_as_invoke_says_them():
    class Context:
        name, flags = "bench", {"--np": None}
    assert hint("'--np' needs a value", Context()) == "'--np' needs a value"
    assert hint("No idea what 'bnech' is!", None) == "No idea what 'bnech' is!"


def test_a_flag_before_a_tasks_argument_is_the_unknown_flag():
    """`invoke report --results-dir DIR`: invoke takes the flag for the folder and DIR for a
    task; the line names the flag and the command meant."""
    cp = invoke("report", "--results-dir", "/tmp/x")
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert cp.stderr.startswith("error: `invoke report` has no flag --results-dir: ") and \
        cp.stderr.rstrip().endswith("; the path is given without a flag (`invoke report PATH`; "
                                    "`invoke report --help` lists them)"), cp.stderr
    cp = invoke("report", "--formt", "html", "/tmp/x")
    assert "has no flag --formt: did you mean --format?" in cp.stderr, cp.stderr


def test_a_flag_without_its_value_is_one_line():
    cp = invoke("bench", "--np")
    assert cp.returncode == 2 and cp.stderr.strip() == (
        "error: `invoke bench` --np needs a value (`invoke bench --help` says what it takes)")


def test_an_unknown_task_names_the_closest():
    cp = invoke("bnech", "--np", "2")
    assert cp.returncode == 2 and cp.stderr.strip() == "error: no task 'bnech': did you mean `invoke bench`?"


def test_bench_help_groups_every_flag_shows_defaults_and_ends_with_examples():
    from lab.host.cli.flag_help import BENCH_EXAMPLES, BENCH_GROUPS, BENCH_HELP
    out = invoke("bench", "--help").stdout
    titles = [line for line in out.splitlines() if line.startswith("Options, ")]
    assert titles == [f"Options, {t}:" for t in BENCH_GROUPS]
    shown = re.sub(r"--\[no-\]", "--", out)        # a switch invoke.yaml can turn on: --[no-]flag
    for flag in BENCH_HELP:                       # every flag once, under its group
        assert shown.count(f"--{flag}=") + shown.count(f"--{flag} ") + shown.count(f"--{flag}\n") >= 1, flag
    grouped = [f for fs in BENCH_GROUPS.values() for f in fs]
    assert sorted(grouped) == sorted(BENCH_HELP)  # no flag left to the catch-all
    exp = out[out.index("Options, the experiment:"):out.index("Options, where it runs:")]
    assert "--np=" in exp and "(default: 2)" in exp and "--epochs=" in exp and "(default: 1)" in exp
    assert out.rstrip().endswith(BENCH_EXAMPLES[-1][0])
    other = invoke("up", "--help").stdout                   # other tasks: invoke's own layout
    assert "Options:" in other and "Options, " not in other
