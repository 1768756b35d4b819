"""The one run a script for another cluster holds (invoke sbatch, invoke k8s, and the
Slurm and Kubernetes places): its configuration checked as a rank would check it, and the
GPUs it asks of each node."""
from __future__ import annotations

import dataclasses

from lab import models
from lab.common import results
from lab.common.config import ConfigError, RunConfig
from lab.host.errors import BenchError
from lab.host.places.launch import HostsError, ranks_per_node
from lab.host.settings import BenchSettings, attempt_name, base_config, check_run_id


def gpus_per_node(s: BenchSettings, np: int, given: int | None) -> int:
    """The GPUs a script for another cluster asks of each node (Slurm's --gres, a pod's
    nvidia.com/gpu): one per rank on the node unless `given` (--gpus-per-node); fewer than
    the node's ranks, or any for CPU ranks, is refused in one sentence."""
    try:
        per = ranks_per_node(np, s.nodes)       # the even-spread rule
    except HostsError as e:
        raise BenchError(str(e)) from None
    if s.device != "cuda":
        if given:
            raise BenchError("--gpus-per-node is for --device cuda: add it, or leave out --gpus-per-node")
        return 0
    gpus = per if given is None else given
    if gpus < per:
        raise BenchError(f"--np {np} over {s.nodes} node(s) puts {per} ranks on each node, "
                         f"each needing a GPU of its own, and --gpus-per-node is {gpus}: "
                         f"lower --np, add --nodes, or raise --gpus-per-node")
    return gpus


def script_config(s: BenchSettings, framework: str, np: int) -> RunConfig:
    """The one run a script for another cluster holds (invoke sbatch, invoke k8s): its
    run id checked or made, its configuration checked as a rank would, as a BenchError."""
    check_run_id(s.run_id)
    cfg = dataclasses.replace(base_config(s, framework), run_id=s.run_id or results.new_run_id(),
                              expected_np=np, attempt=attempt_name(s, framework, np))
    try:
        cfg.check()
        cfg.check_world(np)
        # at least one timed step, as bench checks before its ranks start (MNIST's size
        # as its model's spec holds it: the files are on the cluster, not necessarily here)
        cfg.check_timing(cfg.train_size() or models.get("mnist").synthetic_samples, np)
    except ConfigError as e:
        raise BenchError(str(e)) from None
    return cfg
