"""`deepspeed`: DeepSpeed's engine with ZeRO stage 0 to 3 (--zero-stage), in fp32 (or its
own bf16/fp16 modes: --precision), on CPUs or GPUs. What this relies on, read in
DeepSpeed 0.19.8's source:

- The accelerator is DS_ACCELERATOR's when set, read once, the first time DeepSpeed asks
  for it (accelerator/real_accelerator.py, get_accelerator: the override before any
  detection), so it is set before deepspeed is imported: `cpu` for --device cpu,
  `cuda` for --device cuda. The CPU accelerator's communication back end is `ccl` when
  oneccl_bindings_for_pytorch imports and `gloo` otherwise (accelerator/cpu_accelerator.py,
  CPU_Accelerator.__init__: "fallback to gloo if oneccl_binding_for_pytorch is not
  installed").
- The process group is the one lab.worker.dist made. deepspeed.initialize calls
  deepspeed.comm.init_distributed, which makes a DeepSpeed back end of its own only for
  ccl (init_deepspeed_backend) and otherwise, finding torch.distributed initialised,
  wraps it in a TorchBackend and returns (deepspeed/comm/comm.py, init_distributed: "The
  user initialized torch.dist themselves, create cdb and short-circuit");
  TorchBackend.init_process_group calls torch's only when none is initialised
  (deepspeed/comm/torch.py). So the collectives run on --backend's group (gloo, mpi or
  nccl), whatever back end the accelerator would have chosen.
- The optimizer is the strategy's own torch.optim.SGD (no compiled op), passed as the
  client optimizer. ZeRO takes only the optimizers of ZERO_SUPPORTED_OPTIMIZERS
  (runtime/zero/utils.py: Adam, AdamW, Adagrad and DeepSpeed's own; not SGD) unless the
  configuration says `zero_allow_untested_optimizer` (runtime/engine.py,
  _do_optimizer_sanity_check, which then logs one warning). At stage 0 in fp32 the
  engine steps that SGD itself (_configure_optimizer: no wrapper) after averaging the
  gradients over the ranks in engine.backward.

What a rank holds (holdings(), measured by lab.worker.strategies.memory, each storage
counted once), between two steps:

- parameters: the module's. ZeRO 1/2 flatten them into one buffer per group and make
  each parameter a view of it (runtime/zero/stage_1_and_2.py, _update_model_bit16_weights):
  whole on every rank. ZeRO-3 empties a parameter's data (partition_parameters.py,
  free_param) and keeps this rank's partition in `p.ds_tensor` (_partition_param), a
  view of the optimizer's fp16_partitioned_groups_flat (stage3.py).
- gradients: the parameters' .grad (None after engine.step: engine.zero_grad) and ZeRO's
  gradient partitions (stage 1/2: averaged_gradients and the fp32 partition's .grad,
  both dropped after the step; ZeRO-3: grad_partitions_flat_buffer, kept). ZeRO's reduce
  buckets (ipg_buckets, reduce_bucket_size elements each, communication staging like
  DDP's buckets, which base.Strategy does not count either) are left out and reported
  in figures()["reduce_bucket_bytes"]: 0 at stages 1 and 2, which free them after every
  backward (stage_1_and_2.py, independent_gradient_partition_epilogue ->
  _release_ipg_buffers), one flat buffer at stage 3.
- when: between two steps, as for every strategy; DeepSpeed's engine.step ends with
  zero_grad (runtime/engine.py: param.grad = None), so stages 0-2 hold no gradient
  there, where torch's strategies, which clear gradients at the start of a step, still
  hold the last step's.
- optimizer_state: the wrapped SGD's state (momentum buffers, of this rank's partition
  under ZeRO) and ZeRO's fp32 master partition of the parameters, which ZeRO's paper
  counts among the optimizer states. ZeRO 1/2 clone this rank's share of the flat
  buffer into single_partition_of_fp32_groups even for an fp32 model
  (stage_1_and_2.py: "A partition of the fp32 master weights that will be updated by
  this process"); ZeRO-3 means to reuse the fp32 partition itself
  (stage3.py, _create_fp32_partitions) but compares the tensor's torch.device with the
  device's name, a str ('cpu'), which is never equal, and clones it too. So with SGD and
  momentum on 2 ranks stage 1/2 hold as much optimizer state as stage 0 (half the
  momentum plus half the parameters as master copy); figures()["optimizer_state_split"]
  gives the two apart per rank.
"""
from __future__ import annotations

import logging
import os
import warnings

import torch

from lab.worker import precision
from lab.worker.strategies import memory
from lab.worker.strategies.base import Strategy

# DeepSpeed's bucket sizes default to 5e8 elements (runtime/zero/config.py): 2 GB fp32
# buffers allocated whole (stage_1_and_2.py, setup_buckets). One as large as the model
# (and no larger than that) is one reduction per step.
DEFAULT_BUCKET = 500_000_000


def import_deepspeed(device_type: str):
    """deepspeed, imported with its accelerator set for this device, its logger at
    WARNING, and its shared-memory all-reduce op left unbuilt.

    That op: with the CPU accelerator, TorchBackend's constructor JIT-compiles
    deepspeed_shm_comm (C++ with g++ and ninja; 3 min on 2 cores here, then cached) when
    deepspeed.ops.__compatible_ops__ says it can (deepspeed/comm/torch.py, build_shm_op),
    and only inference_all_reduce uses it: training's collectives are torch.distributed's.
    That dict is computed once and kept so that edits to it persist
    (deepspeed/ops/__init__.py, __getattr__); marking the op incompatible makes
    build_shm_op return None. The CUDA accelerator has no such builder (None)."""
    os.environ["DS_ACCELERATOR"] = "cuda" if device_type == "cuda" else "cpu"
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import logger
    logger.setLevel(logging.WARNING)
    for h in logger.handlers:
        h.setLevel(logging.WARNING)
    # torch 2.13 deprecates the collectives ZeRO calls (torch/distributed/c10d_logger.py):
    # one FutureWarning per call site and rank, nothing to act on here.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.(all_gather_into_tensor|"
                                    r"reduce_scatter_tensor)` is deprecated")
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    return deepspeed


class DeepSpeed(Strategy):
    """`deepspeed`: deepspeed.initialize over the run's process group; a step is the
    engine's forward, engine.backward(loss), engine.step(). The batch is per rank
    (train_micro_batch_size_per_gpu, one micro-batch per step)."""

    # bf16/fp16: DeepSpeed's own modes ("bf16"/"fp16" of its configuration), no autocast:
    # the engine casts the module's parameters to the half type, and its floating buffers
    # only when data_types.buffer_dtype says so (runtime/engine.py,
    # _configure_distributed_model -> _cast_module_mixed_precision), so config() says so:
    # BatchNorm's fp32 running statistics beside half weights fail on the CPU ("expected
    # scalar type BFloat16 but found Float"). Its optimizer wrapper keeps fp32 master
    # weights, and fp16 scales the loss in engine.backward. The images are cast to the
    # module's dtype here (prepare): the engine's forward casts no inputs.
    autocasts = False
    parts_note = ("DeepSpeed's engine runs the step's communication inside its backward and step: "
                  "not split into parts")
    hook_gradients = False

    name = "deepspeed"

    def __init__(self, cfg, d, device):
        super().__init__(cfg, d, device)
        self.stage = cfg.zero_stage
        # ZeRO-3's forward gathers each module's parameters from all ranks.
        self.lockstep_eval = self.stage == 3
        self.deepspeed = import_deepspeed(device.type)
        self.engine = None

    def config(self, n_params: int) -> dict:
        b = self.cfg.batch_size
        bucket = min(DEFAULT_BUCKET, n_params)
        zero = {"stage": self.stage, "reduce_bucket_size": bucket,
                "allgather_bucket_size": bucket}
        if self.stage == 3:
            # Parameters under stage3_param_persistence_threshold elements (default 1e5:
            # all of the MNIST network's) stay whole on every rank (runtime/zero/config.py);
            # 0 partitions every one.
            zero.update({"stage3_param_persistence_threshold": 0,
                         "stage3_prefetch_bucket_size": bucket})
        return {
            "train_micro_batch_size_per_gpu": b,
            "gradient_accumulation_steps": 1,
            "train_batch_size": b * self.data_world,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": self.cfg.precision == "fp16"},
            "bf16": {"enabled": self.cfg.precision == "bf16"},
            **({"data_types": {"buffer_dtype": self.cfg.precision}}
               if self.cfg.precision in ("bf16", "fp16") else {}),
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }

    def build(self, model, loss_fn) -> None:
        self.loss_fn = loss_fn
        model = model.to(self.device)
        params = list(model.parameters())
        optimizer = self.new_optimizer(params)
        self.engine, self.optimizer, _, _ = self.deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config(sum(p.numel() for p in params)))
        self.model = self.engine

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        dtype = precision.autocast_dtype(self.cfg.precision)
        return x if dtype is None else x.to(dtype)

    def step(self, x, y):
        with self.watching(self.engine) as seen:
            out = self.engine(self.prepare(x))
        self.saw(seen, out)
        loss = self.loss_fn(out, y)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def train_mode(self, training: bool) -> None:
        self.engine.train(training)

    def evaluate(self, split, batch: int) -> tuple[int, int]:
        """The base evaluation; with ZeRO-3, then every parameter partitioned again: an
        eval forward leaves them gathered (partitioned_param_coordinator.py keeps those
        it expects to reuse within stage3_max_reuse_distance, default 1e9), whole on
        every rank when holdings() measures them (engine.empty_partition_cache:
        partition_all_parameters)."""
        out = super().evaluate(split, batch)
        if self.stage == 3:
            self.engine.empty_partition_cache()
        return out

    def eval_module(self) -> torch.nn.Module:
        # The engine, whose forward with ZeRO-3 gathers the parameters (a collective:
        # lockstep_eval).
        return self.engine

    # -- what this rank holds
    def _zero(self):
        """The engine's ZeRO optimizer; None at stage 0 (the SGD itself)."""
        return self.engine.optimizer if self.stage > 0 else None

    def _parameter_tensors(self) -> list[torch.Tensor]:
        params = list(self.engine.module.parameters())
        return [p.ds_tensor for p in params] if self.stage == 3 else params

    def _master_tensors(self) -> list[torch.Tensor]:
        z = self._zero()
        if z is None:
            return []
        return list(getattr(z, "single_partition_of_fp32_groups", None)
                    or getattr(z, "fp32_partitioned_groups_flat", None) or [])

    def _gradient_tensors(self) -> list[torch.Tensor]:
        out = [p.grad for p in self.engine.module.parameters()]
        z = self._zero()
        if z is not None:
            out += [t.grad for t in self._master_tensors()]
            out += list(memory.tensors_in(getattr(z, "averaged_gradients", {})))
            out.append(getattr(z, "grad_partitions_flat_buffer", None))
        return [t for t in out if t is not None]

    def _bucket_tensors(self) -> list[torch.Tensor]:
        z = self._zero()
        buckets = getattr(z, "ipg_buckets", {}) if z is not None else {}
        return [t for b in buckets.values() for t in memory.tensors_in(getattr(b, "buffer", None))]

    def _breakdown(self) -> dict[str, int]:
        counted: set = set()
        p = memory.storage_bytes(self._parameter_tensors(), counted=counted)
        g = memory.storage_bytes(self._gradient_tensors(), exclude=counted, counted=counted)
        m = memory.storage_bytes(self._master_tensors(), exclude=counted, counted=counted)
        states = memory.optimizer_states(self.engine.optimizer)
        s = memory.storage_bytes((t for st in states for t in memory.tensors_in(st)),
                                 exclude=counted, counted=counted)
        buckets = memory.storage_bytes(self._bucket_tensors(), exclude=counted)
        return {"parameters": p, "gradients": g, "master_weights": m, "optimizer_state": s,
                "buckets": buckets}

    def holdings(self) -> dict[str, int]:
        b = self._breakdown()
        state = b["master_weights"] + b["optimizer_state"]
        return {"parameters": b["parameters"], "gradients": b["gradients"],
                "optimizer_state": state, "total": b["parameters"] + b["gradients"] + state}

    def parameter_digest(self) -> str | None:
        """With ZeRO-3, of the parameters gathered whole (GatheredParameters all-gathers
        them and partitions them again on leaving; every rank calls this)."""
        if self.stage != 3:
            return super().parameter_digest()
        with self.deepspeed.zero.GatheredParameters(list(self.engine.module.parameters())):
            return super().parameter_digest()

    # -- checkpoints (--checkpoint-every): DeepSpeed's own, each rank writing its part
    own_checkpoint = True

    def save_checkpoint_files(self, folder: str, tag: str) -> None:
        """engine.save_checkpoint (runtime/engine.py, DeepSpeedEngine.save_checkpoint), on
        every rank: <folder>/<tag>/mp_rank_00_model_states.pt (module, the optimizer's
        state at stage 0, global_steps; written by data-parallel rank 0,
        save_non_zero_checkpoint) and at ZeRO stages each rank's optimizer partition,
        zero_pp_rank_R_mp_rank_00_optim_states.pt (_save_zero_checkpoint; stage 3 writes
        each rank's zero_pp_rank_R_mp_rank_00_model_states.pt too). It ends with
        dist.barrier(). save_latest=False: the `latest` file would name the temporary
        folder; lab.worker.checkpoint.save_folder writes it once the folder has its name."""
        self.engine.save_checkpoint(folder, tag=tag, save_latest=False)

    def load_checkpoint_files(self, folder: str, tag: str) -> None:
        """engine.load_checkpoint (runtime/engine.py, DeepSpeedEngine.load_checkpoint) of
        that tag, on every rank: the module, the optimizer (load_optimizer_states: the
        client SGD's state at stage 0, _load_checkpoint; ZeRO's partitions,
        _load_zero_checkpoint, which refuses another data-parallel world size), the LR
        scheduler (none here) and global_steps. It returns (None, None) when it found no
        checkpoint file: refused here rather than training on from scratch."""
        path, _ = self.engine.load_checkpoint(folder, tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag} in {folder}")

    def close(self) -> None:
        """DeepSpeedEngine.destroy: the engine's own clean-up (runtime/engine.py: the
        optimizer's destroy, compiled state), before the group is destroyed."""
        self.engine.destroy()

    def figures(self) -> dict:
        """The ZeRO stage and DeepSpeed's version; per rank, the optimizer state split
        into ZeRO's fp32 master partition and the wrapped optimizer's own state, and the
        bytes of ZeRO's reduce buckets (left out of holdings)."""
        b = self._breakdown()
        parts = self.d.allgather_object(b)
        return {"zero_stage": self.stage, "deepspeed_version": self.deepspeed.__version__,
                "optimizer_state_split": [{"master_weights": p["master_weights"],
                                           "wrapped_optimizer_state": p["optimizer_state"]}
                                          for p in parts],
                "reduce_bucket_bytes": [p["buckets"] for p in parts]}
