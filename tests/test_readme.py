"""Every command the README and the documentation pages (docs/pages/*.md) show, accounted
for: run here as written (with the small sizes the pages name for the slow ones), run by
another test or by .ci/run (named, and checked to exist), or not runnable on this
machine (with the reason). A command added to a page without a line here fails the first
test, and a line whose command left every page fails it too."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from tests.conftest import make_mnist_like

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = REPO / "docs" / "pages"
DOCUMENTS = [README, *sorted(PAGES.glob("*.md"))]
SWEEP = ("invoke bench --local --np 1,2 --framework horovod,ddp --backend gloo,mpi "
         "--compression none,fp16,int8,int8-naive --data digits --epochs 8 --batch-size 32 "
         "--run-id cpu-sweep")
STRATEGIES = ("invoke bench --local --np 1,2 --strategy ddp,zero1,fsdp,pipeline,model-parallel,"
              "deepspeed,rpc-pipeline --framework ddp --model resnet50 --data digits --batch-size 16 "
              "--epochs 1 --max-steps 20 --warmup-steps 3 --repeat 2 --run-id strategies-resnet50")
# The small sizes the README gives for the slow commands ("Running experiments").
SMALL = ["--epochs", "1", "--max-steps", "8"]

RUN = {   # command -> arguments the test adds (results go to a temporary folder)
    "bash docker/setup-venv.sh && .venv/bin/invoke bench --np 2": [],     # as given: MNIST's default size
    # Horovod over each back end: 60,000 synthetic MNIST samples by default, 25-40 s of
    # steps and start-up each; the size is the first command's, run as given above
    "invoke bench --np 1,2 --framework horovod --backend gloo": SMALL,
    "invoke bench --np 2 --framework horovod --backend mpi": SMALL,
    "invoke bench --np 2 --framework ddp --model resnet50 --batch-size 16 --max-steps 20":
        ["--batch-size", "8", "--max-steps", "3", "--warmup-steps", "1"],
    "invoke bench --np 2 --data mnist --epochs 10": [*SMALL, "--data-dir", "{mnist}"],
    "invoke bench --help": None,
    SWEEP: SMALL,
    "invoke report results/cpu-sweep": None,
    "invoke bench --run-id cpu-sweep --resume ...": None,
    ". .venv/bin/activate": None,   # test_activating_the_environment_puts_its_commands_first
}
COVERED = {   # command -> the test that runs it, or ".ci/run runs `what .ci/run holds`"
    "invoke bench --local --np 1,2 --framework ddp --data digits --batch-size 64 --max-steps 40 "
    "--run-id mnist-c": "tests/test_compile.py::test_the_mnist_cnn_compiled_against_eager_at_1_and_2_ranks",
    "invoke bench --local --np 1,2 --framework ddp --data digits --batch-size 64 --max-steps 40 "
    "--run-id mnist-c --compile":
        "tests/test_compile.py::test_the_mnist_cnn_compiled_against_eager_at_1_and_2_ranks",
    "invoke bench --local --np 2 --data synthetic --max-steps 40 --checkpoint-every 10 --max-restarts 1 "
    "--fault 1:15:kill": "tests/test_restarts.py::test_a_killed_rank_is_survived_from_the_last_checkpoint",
    "invoke acceptance --local":
        "tests/test_acceptance.py::test_without_docker_or_with_local_the_same_plan_runs_as_local_processes",
    "bash docker/setup-venv.sh .venv": ".ci/run runs `bash docker/setup-venv.sh .venv`",
    "bash docker/setup-venv.sh .venv && . .venv/bin/activate":
        ".ci/run runs `bash docker/setup-venv.sh .venv`; the activation: "
        "test_activating_the_environment_puts_its_commands_first",
    ".venv/bin/python -m pytest -q -rs -n 2 tests": ".ci/run runs `.venv/bin/python -m pytest -q -rs -n 2 tests`",
    ".venv/bin/ruff check .": ".ci/run runs `.venv/bin/ruff check .`",
    "invoke bench --local --np 2 --framework ddp --fault 1:20:hang --stall-s 20":
        "tests/test_stall.py::test_ddp_hang_through_invoke_names_rank_1_its_step_and_frames",
    "invoke bench --nodes 2 --np 2 --framework horovod --backend gloo --fault 1:20:hang --stall-s 20":
        "tests/test_cluster.py::test_a_rank_that_hangs_on_a_node_is_named_with_its_step_and_stack",
    "invoke build --gpu-ops NCCL": ".ci/run (invoke build --flavor gpu --gpu-ops NCCL on a local CUDA base)",
    "invoke build --gpu-ops MPI": ".ci/run (invoke build --flavor gpu --gpu-ops MPI on a local CUDA base)",
    "invoke build --flavor cpu": ".ci/run (invoke build --flavor cpu on a debootstrapped base)",
    "docker compose up -d":
        "tests/test_cluster.py::test_a_cluster_started_by_plain_compose_in_another_folder_is_the_one_bench_uses",
    "invoke up --nodes 2": "tests/test_cluster.py::up",
    "invoke up --nodes 2 --scheduler slurm": "tests/test_cluster.py::up",
    "docker compose exec -u lab node1 sinfo":
        "tests/test_cluster.py::test_slurm_runs_jobs_on_both_nodes_with_a_key_made_at_run_time",
    "docker compose exec -u lab node1 srun -N2 -n2 hostname":
        "tests/test_cluster.py::test_slurm_runs_jobs_on_both_nodes_with_a_key_made_at_run_time",
    "invoke bench --nodes 2 --np 4 --framework horovod --backend gloo":
        "tests/test_cluster.py::test_bench_runs_across_two_nodes",
    "invoke bench --nodes 2 --np 2 --framework horovod --backend mpi --link 1gbit":
        "tests/test_cluster.py::test_link_shaping_is_applied_and_recorded",
    "invoke bench --nodes 2 --np 2 --framework ddp": "tests/test_cluster.py::test_bench_runs_across_two_nodes",
    "invoke bench --nodes 2 --np 2 --framework ddp --launcher slurm":
        "tests/test_cluster.py::test_the_slurm_launcher_runs_each_framework_as_a_batch_job",
    "invoke bench --nodes 2 --np 2 --framework horovod --backend mpi --launcher slurm":
        "tests/test_cluster.py::test_the_slurm_launcher_runs_each_framework_as_a_batch_job",
    "invoke sbatch --nodes 2 --np 8 --model resnet50 --framework ddp --backend nccl --device cuda "
    "--partition gpu --container pyxis:registry.example.org/me/dl-lab-kit:gpu-nccl "
    "--max-steps 50 --results-dir /scratch/me/results --data-dir /scratch/me/data --timeout-s 1800 "
    "--run-id resnet-2x4 --output job.sbatch":
        "tests/test_slurm.py::test_the_readmes_script_is_what_invoke_sbatch_writes",
    "invoke bench --hosts node1:1,node2:1 --np 2 --framework ddp --results-dir /results --data-dir /data":
        "tests/test_cluster.py::test_bench_on_a_list_of_hosts_runs_from_the_first_over_ssh",
    "docker compose exec -u lab node1 ssh node2 hostname":
        "tests/test_cluster.py::test_the_nodes_publish_no_port_and_trust_only_the_clusters_key",
    "invoke down": "tests/test_cluster.py::up",
    "docker compose down -v":
        "tests/test_cluster.py::test_a_cluster_started_by_plain_compose_in_another_folder_is_the_one_bench_uses",
    "invoke clean": "tests/test_image.py::test_clean_removes_what_a_killed_bench_left",
    "invoke doctor": "tests/test_image.py::test_doctor_checks_the_stack_inside_the_cpu_image",
    "invoke doctor --np 4 --json": "tests/test_image.py::test_doctor_checks_the_stack_inside_the_cpu_image",
    "invoke doctor --local": "tests/test_doctor.py::test_doctor_on_this_machine_without_a_gpu",
    "python -m envcheck": "tests/test_doctor.py::test_report_completes_when_probes_fail_on_purpose",
    # each strategy through bench, and the comma list through the task's flags
    STRATEGIES: "tests/test_strategies.py::test_strategy_learns_on_digits",
    "invoke bench --local --np 1,2 --strategy deepspeed --zero-stage 3 --model resnet50 --data digits "
    "--batch-size 16 --epochs 1 --max-steps 20 --warmup-steps 3 --repeat 2 --run-id strategies-resnet50":
        "tests/test_strategy_deepspeed.py::test_stage3_partitions_the_parameters",
    "invoke k8s --np 4 --nodes 2 --framework horovod --backend mpi --registry registry.example.org/me "
    "--run-id hvd-2x2": "tests/test_k8s.py::test_the_readmes_examples_are_what_invoke_k8s_writes",
    "invoke k8s --np 8 --nodes 2 --device cuda --strategy fsdp --backend nccl --registry "
    "registry.example.org/me --pvc lab-results --timeout-s 1800 --run-id fsdp-2x4":
        "tests/test_k8s.py::test_the_readmes_examples_are_what_invoke_k8s_writes",
    "invoke bench --launcher k8s --np 2 --framework horovod --backend gloo --data synthetic --image "
    "registry.example.org/me/dl-lab-kit:cpu --run-id hvd-k8s":
        "tests/test_k8s_runner.py::test_invoke_bench_launcher_k8s_end_to_end",
    "invoke report results/strategies-resnet50":
        "tests/test_report.py::test_strategies_table_in_the_sources_shape",
    "invoke published --comparison horovod-512":
        "tests/test_published.py::test_invoke_published_prints_its_sources_assumptions_and_the_table",
    "invoke published --comparison horovod-512 --link-gbits 10":
        "tests/test_published.py::test_invoke_published_prints_its_sources_assumptions_and_the_table",
    "DRY=1 bash docker/gpu-host-mpi.sh":
        "tests/test_gpu_host_script.py::test_the_dry_run_plans_the_stack_and_runs_nothing",
}
LAB = "not runnable in the tests: its own test tests/test_lab.py"
KUBERNETES = "needs a Kubernetes cluster with the operator installed; no API server can run here"
NOT_HERE = {   # command -> why it cannot run on this machine
    "invoke bench --local --np 1 --model resnet50 --batch-size 8 --max-steps 12 --run-id r50":
        "measured by hand beside its --compile twin, whose compile takes minutes on a CPU (left out of "
        "CI); the compiled path is tests/test_compile.py's with the MNIST CNN",
    "invoke bench --local --np 1 --model resnet50 --batch-size 8 --max-steps 12 --run-id r50 --compile":
        "ResNet-50's compile takes minutes on a CPU (left out of CI); the compiled path is "
        "tests/test_compile.py's with the MNIST CNN",
    "invoke bench --local --device cuda --framework ddp --backend nccl --np 1 --model resnet50 "
    "--data synthetic --batch-size 256 --precision bf16 --max-steps 40 --run-id rn50-compile": "needs a GPU",
    "invoke bench --local --device cuda --framework ddp --backend nccl --np 1 --model resnet50 "
    "--data synthetic --batch-size 256 --precision bf16 --max-steps 40 --run-id rn50-compile --compile":
        "needs a GPU",
    "invoke lab": LAB,
    "invoke lab --dry-run": LAB,
    "invoke lab --quick": LAB,
    "invoke lab --resume": LAB,
    "invoke lab --results-dir DIR": LAB,
    "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash docker/setup-venv.sh .venv":
        "PyTorch's CPU index cannot be reached from this machine (.ci/run builds from pip's own "
        "index for that reason); the same script runs in .ci/run with the default index",
    ".venv/bin/python -m pytest -q -x tests/test_report.py":
        "the test suite inside one of its own tests; .ci/run runs every file",
    ".venv/bin/python -m pytest -q -x tests/test_report.py -k html":
        "the test suite inside one of its own tests; .ci/run runs every file",
    ".venv/bin/mkdocs serve -f docs/mkdocs.yml":
        "a server that runs until stopped; .ci/run builds the same site with mkdocs build --strict",
    "kubectl apply -f results/hvd-2x2/k8s/mpijob.yaml": KUBERNETES,
    "kubectl get mpijob lab-hvd-2x2 -w": KUBERNETES,
    "kubectl logs -f -l training.kubeflow.org/job-name=lab-hvd-2x2,training.kubeflow.org/job-role=launcher":
        KUBERNETES,
    "kubectl logs -l training.kubeflow.org/job-name=lab-hvd-2x2,training.kubeflow.org/job-role=launcher "
    "| sed -n 's/^lab-record: //p' >> results/hvd-2x2/results.jsonl": KUBERNETES,
    "invoke bench --np 4 --framework ddp --backend nccl --device cuda": "needs 4 GPUs; none here",
    "invoke bench --np 1,2,4 --device cuda --framework ddp --backend nccl":
        "needs GPUs; none here (tests/test_bench_checks.py runs its plan on a faked two-GPU stack)",
    "invoke build --gpu-ops NCCL --cuda 12.6": "its base, nvidia/cuda:12.6.3, cannot be pulled here "
                                               "(no registry) and this machine's toolkit is 13.0",
    "bash docker/stage-gpu-host.sh": "downloads from Debian's mirror and PyPI (about 11 MB), which "
                                     "the tests do not; shellcheck checks it in .ci/run",
    "OUT=/tmp/gpu-mpi bash docker/gpu-host-mpi.sh": "needs a GPU host (a CUDA torch, nvcc); its dry "
                                                    "run is tests/test_gpu_host_script.py",
    "invoke build --flavor cpu --extra-ca proxy-ca.pem --wheelhouse ./wheels --base-image my/debian:12":
        "an example naming a user's own files and base image; .ci/run passes --extra-ca, "
        "--wheelhouse and --base-image with this machine's",
}


# In a block marked sh or bash every line is a command; in an unmarked block (output, a
# script) only the lines that start like one.
COMMAND = re.compile(r"(invoke|\.venv/bin/invoke|bash docker/setup-venv\.sh|docker|python|pip|kubectl)\b")


def documented_commands() -> dict[str, list[str]]:
    """command -> the documents that show it (README.md, docs/pages/NAME.md): the lines of
    their code blocks, continuation lines joined, comments cut."""
    out: dict[str, list[str]] = {}
    for doc in DOCUMENTS:
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                cmd = re.sub(r"\s+", " ", line.split("#")[0]).strip()
                if cmd and (lang in ("sh", "bash") or COMMAND.match(cmd)):
                    out.setdefault(cmd, []).append(str(doc.relative_to(REPO)))
    return out


def test_every_documented_command_is_run_covered_or_explained():
    commands = documented_commands()
    planned = {**RUN, **COVERED, **NOT_HERE}
    assert {c: d for c, d in commands.items() if c not in planned} == {}, "commands without a plan here"
    assert [c for c in planned if c not in commands] == [], "plans for commands no page shows any more"


def test_the_pages_exist_and_the_site_lists_every_one():
    nav = (REPO / "docs" / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir: pages$", nav, re.M)
    listed = re.findall(r"^  - [^:]+: (\S+\.md)$", nav, re.M)
    assert sorted(listed) == sorted(p.name for p in PAGES.glob("*.md"))


def test_the_readmes_links_reach_files_of_the_checkout():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert links, "the README links its pages"
    assert [x for x in links if not x.startswith("http") and not (REPO / x).is_file()] == []


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: d.name)
def test_no_page_cites_what_users_do_not_have(doc):
    text = doc.read_text()
    assert not re.search(r"seeds?/0|the issue (asked|says)|seed 00[0-9]", text, re.I)
    assert "pytest-xdist internals" not in text and "item._nodeid" not in text


def test_activating_the_environment_puts_its_commands_first():
    """`. .venv/bin/activate`, with the environment this test runs in."""
    activate = Path(sys.prefix) / "bin" / "activate"
    if not activate.is_file():
        pytest.skip(f"{sys.prefix} is not a virtual environment with an activate script")
    cp = subprocess.run(["bash", "-c", f". {activate} && command -v invoke python"],
                        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0, cp.stderr
    assert [Path(x).parent for x in cp.stdout.split()] == [Path(sys.prefix) / "bin"] * 2, cp.stdout


@pytest.mark.parametrize("command", sorted(COVERED))
def test_the_covering_test_exists(command):
    where = COVERED[command]
    if where.startswith(".ci/run runs"):
        ci = (REPO / ".ci/run").read_text()
        assert all(quoted in ci for quoted in re.findall(r"`([^`]+)`", where)), where
        where = where.split("; the activation: ")[-1]
        if where.startswith(".ci/run"):
            return
        path, name = "tests/test_readme.py", where
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), where
        return
    if where.startswith(".ci/run"):
        flags = re.findall(r"--[\w-]+(?: [A-Za-z]+)?", where)
        ci = (REPO / ".ci/run").read_text()
        assert "invoke build" in ci and all(f.split()[0] in ci for f in flags), where
        return
    path, name = where.split("::")
    assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), where


def invoke(args, cwd=REPO, timeout=900):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def bench_args(command: str) -> list[str]:
    return command.split(" && ")[-1].split()[1:]           # after `invoke` / `.venv/bin/invoke`


def with_flags(args: list[str], extra: list[str]) -> list[str]:
    """args with each "--flag value" pair of extra replacing the README's value (invoke
    takes a flag once), or appended."""
    args = list(args)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def records(out: str) -> list[dict]:
    paths = re.findall(r"records: (\S+results\.jsonl)", out)
    assert paths, out[-3000:]
    return results.read_records(paths[-1])[0]


@pytest.mark.parametrize("command", [c for c, extra in RUN.items() if extra is not None and c != SWEEP])
def test_readme_bench_commands_run_to_a_table(command, tmp_path):
    extra = [a.replace("{mnist}", str(make_mnist_like(tmp_path / "mnist", 768, 256)))
             for a in RUN[command]]
    cp = invoke(with_flags(bench_args(command), [*extra, "--results-dir", str(tmp_path / "results")]))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    assert "Traceback" not in cp.stdout + cp.stderr
    assert re.search(r"^\| (strategy +\| )?model +\| framework", cp.stdout, re.M), cp.stdout[-3000:]
    recs = records(cp.stdout)
    assert recs and all(r["status"] in ("ok", "skipped") for r in recs)
    assert any(r["status"] == "ok" for r in recs)
    if "--strategy" in command:
        assert {r["config"]["strategy"] for r in recs if r["status"] == "ok"} == set(
            command.split("--strategy ")[1].split()[0].split(","))
    elif "resnet50" in command:
        assert all(r["config"]["model"] == "resnet50" for r in recs if r["status"] == "ok")


def test_bench_help_names_every_flag():
    cp = invoke(["bench", "--help"], timeout=120)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr
    for flag in ("--np", "--framework", "--backend", "--model", "--data", "--epochs",
                 "--compression", "--resume", "--run-id", "--results-dir", "--nodes"):
        assert flag in cp.stdout, flag


def test_the_readme_sweep_its_report_and_its_resume(tmp_path):
    res = tmp_path / "results"
    # The README's lists, but one of its four compressions: every run costs several
    # seconds, most of it start-up, and each codec has its own real runs in
    # test_compression.py; what this command adds is the sweep over the rest.
    args = with_flags(bench_args(SWEEP), [*SMALL, "--compression", "none",
                                          "--results-dir", str(res)])
    cp = invoke(args, timeout=1800)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    recs, _ = results.read_records(res / "cpu-sweep" / results.RESULTS_FILE)
    ok = [r for r in recs if r["status"] == "ok"]
    skipped = [r for r in recs if r["status"] == "skipped"]
    # Horovod over Gloo and MPI and DDP over Gloo, np 1 and 2; DDP has no MPI back end in
    # pip's torch, so those combinations are skipped, with the reason.
    assert len(ok) == 3 * 2, [(r["status"], r["config"]) for r in recs]
    assert skipped and all(r["config"]["framework"] == "ddp" and r["config"]["backend"] == "mpi"
                           for r in skipped)
    cp = invoke(["report", str(res / "cpu-sweep")], timeout=300)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    for name in ("report.md", "throughput.png", "speedup.png"):
        assert (res / "cpu-sweep" / name).stat().st_size > 0, name
    # "--resume ...": the same lists again, and nothing new runs.
    cp = invoke([*args, "--resume"], timeout=600)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    again, _ = results.read_records(res / "cpu-sweep" / results.RESULTS_FILE)
    assert len([r for r in again if r["status"] == "ok"]) == len(ok)
