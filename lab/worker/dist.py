"""The three ways a worker trains: alone (`none`), with Horovod, or with
torch.distributed's DistributedDataParallel. Each adapter offers the same few calls,
so the training loop is written once."""
from __future__ import annotations

import datetime
import os
import socket

import torch

from lab.common import ccl
from lab.common.config import ConfigError
from lab.common.kit import (
    NO_MPI_IN_PIP_TORCH,
    horovod_controller,
    horovod_gpu_operations,
    horovod_gpu_path_problem,
)

# How long a collective may wait for a peer before the job gives up (seconds). The
# launchers end a job as soon as one rank dies; this bounds any case they miss.
COLLECTIVE_TIMEOUT_S = int(os.environ.get("LAB_COLLECTIVE_TIMEOUT", "300"))


class Local:
    """One process, no communication: the serial baseline."""
    name = "none"
    controller = "none"
    # Whether the process must run its exit handlers after shutdown() (train.main).
    finalizes_at_exit = False

    def __init__(self, cfg):
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1

    def wrap(self, model, optimizer, compression):
        return model, optimizer

    def allgather_object(self, obj):
        return [obj]

    def shutdown(self):
        pass


class Horovod:
    """Horovod: DistributedOptimizer averaging gradients, state broadcast from rank 0."""
    name = "horovod"
    finalizes_at_exit = False   # hvd.shutdown() finalizes MPI when Horovod initialised it

    def __init__(self, cfg):
        try:
            import horovod.torch as hvd
        except ImportError as e:
            raise ConfigError(f"Horovod does not import ({e}): build it with "
                              f"docker/install-horovod.sh, or use --framework ddp") from None
        self.hvd = hvd
        if cfg.backend == "ccl":
            if not hvd.ccl_built():
                raise ConfigError("this Horovod was built without oneCCL: rebuild it with "
                                  "docker/install-horovod.sh (HOROVOD_WITH_CCL=1), or use "
                                  "--backend gloo or mpi")
            problem = ccl.transport_problem(os.environ)
            if problem:
                raise ConfigError(problem)
        # The CPU operations (and oneCCL's own variables), read by hvd.init() (lab.common.ccl).
        os.environ.update(ccl.horovod_env(cfg.backend, os.environ))
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        if hvd.mpi_enabled():
            self.controller = "mpi"
        elif hvd.gloo_enabled():
            self.controller = "gloo"
        else:
            self.controller = "unknown"
        want = horovod_controller(cfg.backend)
        if cfg.backend in ("gloo", "mpi", "ccl") and self.controller != want and self.size > 1:
            raise ConfigError(f"asked for the {cfg.backend} back end but Horovod runs on "
                              f"{self.controller}: launch with horovodrun --{want}")
        # What carried the all-reduce, as Horovod's timeline named it (--backend ccl).
        self.ccl_check = None
        if cfg.backend == "ccl":
            self.ccl_check = ccl.allreduce_ops(hvd, torch, self.rank)
            if self.ccl_check["ops"] != ["CCL_ALLREDUCE"]:
                raise ConfigError(f"asked for the ccl back end but Horovod's timeline shows "
                                  f"{', '.join(self.ccl_check['ops']) or 'no all-reduce'}: check "
                                  f"HOROVOD_CPU_OPERATIONS in the ranks' environment")
            self.controller = "ccl"
        if cfg.backend == "nccl" and not hvd.nccl_built():
            raise ConfigError("this Horovod was built without NCCL: rebuild it with "
                              "HOROVOD_GPU_OPERATIONS=NCCL, or use --backend gloo or mpi")
        self.gpu_operations = horovod_gpu_operations(hvd)
        if cfg.device == "cuda":
            problem = horovod_gpu_path_problem(self.gpu_operations, cfg.backend)
            if problem:
                raise ConfigError(problem)
        if cfg.backend == "nccl":
            self.controller = "nccl"

    def wrap(self, model, optimizer, compression):
        from lab.worker import compression as codecs
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if compression in codecs.CODECS:
            # 8-bit payloads are all-gathered, not all-reduced (int8 sums overflow).
            self.codec = codecs.CODECS[compression]()
            # GPU payloads stay on the GPU where Horovod has GPU operations (NCCL, or
            # CUDA-aware MPI under the MPI controller: the check above guarantees it).
            return model, codecs.AllgatherOptimizer(optimizer, model.parameters(), self.codec, hvd,
                                                    device_payloads=self.gpu_operations is not None)
        comp = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression]
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=comp)
        return model, optimizer

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj)

    def shutdown(self):
        self.hvd.shutdown()


class DDP:
    """torch.distributed with DistributedDataParallel, as started by torch.distributed.run."""
    name = "ddp"

    def __init__(self, cfg):
        import torch.distributed as dist
        self.dist = dist
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ConfigError("--framework ddp expects to be started by torch.distributed.run "
                              "(RANK and WORLD_SIZE are unset): use invoke bench, or "
                              "python -m torch.distributed.run --nproc-per-node N -m lab.worker.train")
        available = {"gloo": dist.is_gloo_available(), "mpi": dist.is_mpi_available(),
                     "nccl": dist.is_nccl_available()}
        if not available[cfg.backend]:
            hint = {"mpi": NO_MPI_IN_PIP_TORCH + ", or --backend gloo",
                    "nccl": "install a CUDA build of torch, or use --backend gloo",
                    "gloo": "install a torch build with Gloo"}[cfg.backend]
            raise ConfigError(f"this torch has no {cfg.backend} back end for torch.distributed: {hint}")
        self.controller = cfg.backend
        # torch's MPI back end calls MPI_Finalize from a C atexit handler
        # (ProcessGroupMPI.cpp, initMPIOnce registers mpiExit), which os._exit would skip
        # and mpirun would report as a rank exiting without finalizing. Horovod finalizes
        # MPI in hvd.shutdown() itself (horovod/common/mpi/mpi_context.cc, Finalize).
        self.finalizes_at_exit = cfg.backend == "mpi"
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        kw = {}
        if cfg.device == "cuda":
            # The rank's GPU is chosen before the process group exists: NCCL's
            # communicator (and Gloo's CUDA buffers) belong to the current device, and a
            # group made first would put every rank's context on GPU 0 (PyTorch's DDP
            # tutorial and torch.distributed.run's docs: set_device(LOCAL_RANK) first).
            # device_id binds the group to that GPU, so NCCL's communicator is made at
            # once rather than at the first collective (init_process_group, torch >= 2.3).
            select_gpu(self.local_rank, self.local_size)
            if cfg.backend == "nccl":
                kw["device_id"] = torch.device("cuda", self.local_rank)
        dist.init_process_group(cfg.backend,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kw)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = None

    def wrap(self, model, optimizer, compression):
        from torch.nn.parallel import DistributedDataParallel

        from lab.worker.lean import ddp_without_compiler
        device_ids = [self.local_rank] if next(model.parameters()).is_cuda else None
        with ddp_without_compiler():        # nothing compiles: torch._dynamo stays unimported
            model = DistributedDataParallel(model, device_ids=device_ids)  # broadcasts rank 0's state
        if compression == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif compression != "none":
            from lab.worker import compression as codecs
            self.codec = codecs.CODECS[compression]()
            model.register_comm_hook(None, codecs.ddp_hook(self.codec))
        return model, optimizer

    def allgather_object(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    def shutdown(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def select_gpu(local_rank: int, local_size: int) -> torch.device:
    """Make this rank's GPU (its local rank) the current device, or say why it cannot."""
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no GPU: check the driver and "
                          "`invoke doctor`, or use --device cpu")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"{local_size} ranks on this host but only "
                          f"{torch.cuda.device_count()} GPUs: lower --np")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


FRAMEWORK_ADAPTERS = {"none": Local, "horovod": Horovod, "ddp": DDP}


def create(cfg):
    return FRAMEWORK_ADAPTERS[cfg.framework](cfg)


def hostname() -> str:
    return socket.gethostname()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)
