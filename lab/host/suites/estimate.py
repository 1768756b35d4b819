"""The one cost model behind every time the suites announce: `invoke lab`'s plan (a CPU
machine like the kit's CI VM) and `invoke acceptance`'s (a GPU machine, at a slow and a
fast end). A bench run costs its start (launcher, imports, rendezvous, data, model,
warm-up, evaluation, the record) plus its timed steps; the suites add their fixed steps
(the cluster up and down, doctor, the report). Each number says where it comes from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Costs:
    """What runs cost on one kind of machine."""
    run_start_s: dict[str, float]                # seconds a run costs besides its timed steps
    step_s: dict[str, tuple[float, float]]       # seconds a step, at 1 and at 2 or more workers
    cluster_extra_s: float = 0.0                 # a run on the simulated cluster's nodes: ssh, the containers


# A CPU machine: the kit's CI VM (2 vCPUs, AMD EPYC, no GPU), fitted to the time between
# one run's launch and the next in `invoke lab --quick` (2 min 35 s) and `invoke lab`
# (13 min 39 s) on it, with Horovod built (2026-11-28, nothing else running): a run's
# start (launcher, imports, rendezvous, data, model, its evaluations and record) 4 s;
# a step at 1 and 2 workers: the MNIST CNN at batch 32, 15 and 25 ms (its per-epoch
# evaluation included); the LSTM at 64, 65 and 90 ms; ResNet-50 at 16, 0.8 and 1.6 s (its
# warm-up steps included). `invoke lab` prints each part's time beside its estimate, and
# the whole lab's at its end: refit these when they part by more than 1.5x. Refitted
# 2026-11-29 to `invoke lab --quick --results-dir /tmp/labq` on the same VM, nothing else
# running (6 min 04 s against 5 min estimated, with oneCCL, VGG-16 and doctor's sweeps
# added; the launch stamps of its records give each run's share): an MNIST run on the
# simulated cluster's nodes 9.9 s against 7 s on this machine (docker exec, ssh, the
# containers' start), so 4 s more; ResNet-50's start 8 s (the parallel strategies' runs
# took 14 s each for 4 steps; its run across two servers 22 s, whose start held its
# collective timed alone, lab.worker.collective, 4 all-reduces of its 94 MB);
# VGG-16's start 40 s (its run across two servers, batch 16 on the digits padded to
# 32x32, 2 steps: 63 s, of which 45.6 s to its first timed step: its 537 MB
# all-reduced 5 times alone at 4.4 s each over the 1 Gbit/s link, DDP's first broadcast
# of it, 138M parameters built; a step at 2 workers 6.5 s; at 1 worker 2.5 s, not
# refitted: the quick lab runs none).
# Refitted again 2026-11-29 after two changes (`invoke lab --quick --results-dir /tmp/lq2`,
# 4 min 50 s against 5 min estimated; with these costs /tmp/lq3 took 4 min 40 s against 285 s): a run's collective timed alone runs 2 all-reduces
# where one takes longer than its budget (VGG-16's start 40 s -> 27 s), and Horovod on the
# cluster's nodes starts without horovodrun's build checks (3.5 s -> 0.8 s a run), so a run
# there costs 1.5 s more than on this machine, not 4.
CPU = Costs(
    run_start_s={"mnist": 4.0, "lstm": 4.0, "resnet50": 8.0, "vgg16": 27.0},
    step_s={"mnist": (0.015, 0.025), "lstm": (0.065, 0.09), "resnet50": (0.8, 1.6), "vgg16": (2.5, 6.5)},
    cluster_extra_s=1.5)
CLUSTER_UP_S = 20.0             # `invoke up --nodes 2` with the image built, and down
LAB_REPORT_S = 15.0             # `invoke report` of the lab's parts

# A GPU machine, at two ends; the acceptance budget is checked at the slow end.
# The fast end, measured: the kit's runs on one NVIDIA H100 80GB HBM3, driver 580.159.04,
# torch 2.11.0+cu130, local processes, 2026-11-26: ResNet-50 in strict fp32 (TF32 off, as
# --precision fp32 runs it) at batch 256, 851 img/s (an H200 ran 850 img/s at batch 128),
# taken as proportional to the batch; the 1,701 img/s measured first ran cuDNN in TF32,
# not fp32. The MNIST CNN, 2.1-2.5 ms a step; 7-10 s from the launch to the first timed step.
# The slow end: a run's fixed cost (the container, the launcher, torch's import, CUDA and
# NCCL set-up, the model built) taken as 25 s: the kit's CPU acceptance on a 2-vCPU
# machine took 13.5 min for 39 runs, training included (docs/pages/doctor.md, "Collecting
# a GPU machine's evidence"), about 21 s a run. ResNet-50: NVIDIA DeepLearningExamples,
# PyTorch/Classification/ConvNets/resnet50v1.5 README, "Training performance: NVIDIA
# DGX-1 16GB (8x V100 16GB)": 367 img/s on one V100 in FP32, the slowest GPU and precision
# the kit's images run; 7.76x at 8 GPUs, so a step of a fixed per-rank batch barely
# lengthens with the process count, which this model ignores. MNIST: the H100's 2.5 ms,
# four times over (its step is bounded by Python's and the kernel launches' overhead,
# which a slower host's CPU lengthens; an assumption).
GPU = {"slow": Costs(run_start_s={"mnist": 25.0, "resnet50": 25.0},
                     step_s={"resnet50": (64 / 367,) * 2, "mnist": (0.010,) * 2}),
       "fast": Costs(run_start_s={"mnist": 10.0, "resnet50": 10.0},
                     step_s={"resnet50": (64 / 851,) * 2, "mnist": (0.0025,) * 2})}
# Horovod with MPI GPU operations all-reduces through CUDA-aware Open MPI instead of NCCL;
# its steps are assumed to take twice as long (an assumption, to be replaced by the first
# archive's numbers).
MPI_GPU_FACTOR = 2.0
HOROVOD_BUILD_S = 147.0     # docker/install-horovod.sh on 16 cores (measured on the H100's host)
# nccl-tests: all_reduce_perf's defaults are 5 warm-up and 20 timed iterations per size,
# out-of-place and in-place (nccl-tests README); sizes double from 8 B to the largest. A
# bandwidth of 10 GB/s (algbw; about a PCIe 3.0 x16 link) is assumed, the slow end of
# machines with several GPUs. Plus a fixed cost per -g count like a bench run's.
NCCL_ITERS = 5 + 2 * 20
NCCL_ALGBW_BPS = 10e9
NCCL_START_S = 15.0
# doctor (the host, the stack in each GPU image, its own short all_reduce_perf) and the
# report of an acceptance archive: assumptions, both minutes at most on the kit's CPU machine.
DOCTOR_S = 180.0
ACCEPTANCE_REPORT_S = 60.0


def run_s(costs: Costs, model: str, np: int, steps: int, place: str = "local",
          step_factor: float = 1.0) -> float:
    """Seconds one bench run of `steps` timed steps at `np` workers costs."""
    extra = costs.cluster_extra_s if place == "cluster" else 0.0
    return costs.run_start_s[model] + extra + steps * costs.step_s[model][min(np, 2) - 1] * step_factor


def nccl_tests_s(counts: list[int], max_bytes: int) -> float:
    """Seconds all_reduce_perf takes at each -g count, sizes doubling up to max_bytes."""
    moved = sum(NCCL_ITERS * (2 ** k) / NCCL_ALGBW_BPS for k in range(3, max_bytes.bit_length()))
    return len(counts) * (NCCL_START_S + moved)
