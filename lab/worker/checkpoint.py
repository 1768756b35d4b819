"""--checkpoint-every N: the ranks' checkpoints, and where a relaunched job resumes.

What a checkpoint holds: the model's and the optimizer's state (and fp16's gradient
scaler), the position in the data (the global step, the epoch and the step within it:
the epoch's batch order is drawn from (seed, epoch), lab.worker.data.shard_indices), the
epochs finished so far, and each rank's own random states (torch's, CUDA's, Python's,
NumPy's: the MNIST CNN's dropout draws from them) and its running loss of the epoch,
so that a resumed run takes the same batches, the same dropout masks and reports the
same loss as an uninterrupted one.

How it is written: every rank hands the strategy's whole state to rank 0
(Strategy.checkpoint_state: ddp replicates it, so rank 0's copy is it; zero1
consolidates the optimizer's shards on rank 0; fsdp gathers them whole with
torch.distributed.checkpoint.state_dict.get_state_dict; pipeline and model-parallel, sharded
by stage, gather every stage's state to rank 0 with torch.distributed.gather_object, with
the stage layout: lab.worker.strategies.pipeline says why), rank 0 gathers the ranks' own
parts (random states, running loss) and writes one file with torch.save (one file can
be replaced atomically, a folder of torch.distributed.checkpoint's shards cannot). The
file is written under a temporary name in the same folder, flushed and fsynced, then
renamed over its final name (os.replace) and the folder fsynced: a rank killed during
the write leaves the temporary file, never a torn step-N.pt. The newest
lab.common.restarts.KEEP are kept. DeepSpeed writes its own checkpoint, a folder step-N
of every rank's files made by engine.save_checkpoint, kept to the same rules
(save_folder, below).

How it is read (a relaunch: RunConfig.restart > 0): rank 0 tries the checkpoints from
the newest down and takes the first that loads (a file that does not load, say one cut
short on a disk that lied about fsync, is skipped with a line saying so), then tells
every rank which. DDP, ZeRO-1, FSDP, the pipelines: every rank loads that file (the same
on each) and the strategy keeps its own part (Strategy.load_checkpoint_state; a pipeline's
rank its stage, refusing a file whose stage layout is not the run's). Horovod: rank 0
has loaded it; hvd.broadcast_parameters and hvd.broadcast_optimizer_state hand its state
to the others, as Horovod's examples do at start. DeepSpeed: every rank reads the kit's
part of the folder and calls engine.load_checkpoint on it. Each rank then takes its own random
states and running loss."""
from __future__ import annotations

import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field

import torch

from lab.common import restarts, results
from lab.common.config import ConfigError
from lab.worker.strategies import memory

NAME = re.compile(r"^step-(\d{8})\.pt$")
FOLDER = re.compile(r"^step-(\d{8})$")       # a strategy's own checkpoint (DeepSpeed's tag)
META = "lab-state.pt"                          # the kit's part of such a checkpoint
FORMAT = 1
# This launch's checkpoint writes, in seconds each (rank 0's: from the gathering of the
# state to the end of the write, all ranks waiting; lab.worker.checkpoint.figures).
WRITES: list[float] = []


@dataclass
class Position:
    """Where a run starts: step 0, or where its checkpoint left it."""
    global_step: int = 0
    epoch: int = 0
    step: int = 0               # the next step within `epoch`
    epochs: list = field(default_factory=list)
    loss_sum: float | None = None
    checkpoint: str | None = None

    def first_step(self, epoch: int) -> int:
        return self.step if epoch == self.epoch else 0

    def epoch_loss(self, epoch: int, device) -> torch.Tensor:
        """The epoch's running loss: restored in the epoch resumed, else zero."""
        value = self.loss_sum if epoch == self.epoch and self.loss_sum is not None else 0.0
        return torch.tensor(value, dtype=torch.float64, device=device)


def _unsaid(nbytes: int) -> None:
    """Where nobody asks for a checkpoint's size."""


def state_bytes(state) -> int:
    """Bytes of the tensors' storages in a state (dicts, lists, tuples of tensors): what
    torch.save writes of it, less its small pickled rest."""
    return memory.storage_bytes(memory.tensors_in(state)) if state is not None else 0


def disk_bytes(path: str) -> int:
    """Bytes of a checkpoint on disk: its file, or every file of its folder."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(path)
               for n in names)


def job_folder(cfg) -> str:
    return restarts.folder(results.run_dir(cfg.results_dir, cfg.run_id), cfg.attempt, cfg.restart)


def path_of(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step:08d}.pt")


def listed(folder: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoints in `folder`, newest first (temporary files are not
    checkpoints)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(folder, n)) for n in names
             if (m := NAME.match(n) or FOLDER.match(n))]
    return sorted(found, reverse=True)


def fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, write) -> None:
    """`write(file)` into a temporary file beside `path`, fsynced, then renamed over it."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_folder(folder)


def prune(folder: str, keep: int = restarts.KEEP) -> None:
    """All but the newest `keep` checkpoints removed, and temporary files left by a
    writer that died (this rank is the only writer, and it is not writing)."""
    for _, path in listed(folder)[keep:]:
        _remove(path)
    for n in os.listdir(folder):
        if n.startswith((".step-", ".latest.tmp-")) and ".tmp" in n:
            _remove(os.path.join(folder, n))


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def own_state(loss_sum) -> dict:
    """This rank's part: its random states and the epoch's running loss (None on a rank
    that computes no loss: a pipeline's stages before the last)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "loss_sum": None if loss_sum is None else float(loss_sum)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy
        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def restore_own(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy
        numpy.random.set_state(state["numpy"])


def save(cfg, d, strategy, global_step: int, epoch: int, step: int, loss_sum, epochs: list,
         sized=_unsaid) -> None:
    """A checkpoint after `global_step` steps (`step` steps into `epoch`): every rank
    hands rank 0 its own part (a collective), rank 0 writes the file (a strategy that
    writes its own, DeepSpeed: every rank writes its part, save_folder, below).
    `sized(bytes)`: told, once known, the bytes of the state this rank writes or hands
    on (the whole state on rank 0; the heartbeat's checkpoint phase bounds the save by
    them: lab.common.heartbeat.bound_s)."""
    started = time.perf_counter()
    if getattr(strategy, "own_checkpoint", False):
        held = strategy.holdings()          # each rank writes its own part
        sized(held["parameters"] + held["optimizer_state"])
        save_folder(cfg, d, strategy, meta(cfg, d, global_step, epoch, step, epochs,
                                           d.allgather_object(own_state(loss_sum))))
    else:
        whole = strategy.checkpoint_state()     # on every rank: ZeRO-1 and FSDP gather here
        sized(state_bytes(whole))
        parts = d.allgather_object(own_state(loss_sum))
        if d.rank == 0:
            _write(cfg, d, strategy, whole, global_step, epoch, step, epochs, parts)
    # Every rank waits for the write here, outside the timed steps: otherwise the other
    # ranks' next step would hold it (waiting in its collective for rank 0).
    d.allgather_object(None)
    WRITES.append(time.perf_counter() - started)


def meta(cfg, d, global_step, epoch, step, epochs, parts) -> dict:
    """What the kit saves besides the model and optimizer: the position, the ranks' parts."""
    return {"format": FORMAT, "global_step": global_step, "epoch": epoch, "step": step,
            "world": d.size, "seed": cfg.seed, "epochs": list(epochs), "ranks": parts,
            "saved_at": time.time()}


def figures(loop_s: float) -> dict:
    """This launch's checkpoint writes: how many, their seconds in all, and their share
    of the launch's training loop (`loop_s`, the seconds from its first step to its last
    epoch's end, which the writes are inside of)."""
    total = sum(WRITES)
    return {"checkpoints": {"written": len(WRITES), "total_s": total,
                            "share": total / loop_s if loop_s > 0 else None}}


def _write(cfg, d, strategy, whole, global_step, epoch, step, epochs, parts) -> None:
    model_state, optimizer_state = whole
    state = {**meta(cfg, d, global_step, epoch, step, epochs, parts),
             "model": model_state, "optimizer": optimizer_state,
             "scaler": strategy.scaler.state_dict() if strategy.scaler else None}
    folder = job_folder(cfg)
    write_atomic(path_of(folder, global_step), lambda f: torch.save(state, f))
    prune(folder)


def newest_loadable(folder: str, log=print) -> tuple[str | None, dict | None]:
    """The newest checkpoint of `folder` that loads, and its state; (None, None) when none.
    Loaded on the CPU: the random states must stay CPU tensors, and load_state_dict
    copies parameters and optimizer state onto their own device."""
    for _, path in listed(folder):
        try:
            state = _load(path)
            if state.get("format") != FORMAT:
                raise ValueError(f"format {state.get('format')!r}, not {FORMAT}")
            return path, state
        except Exception as e:      # noqa: BLE001 - a torn or foreign file is skipped, said
            log(f"checkpoint {os.path.basename(path)} does not load ({type(e).__name__}: {e}); "
                f"trying the one before it", flush=True)
    return None, None


def _load(path: str) -> dict:
    """A checkpoint file's state; a folder's (a strategy's own checkpoint): every file in
    it loaded (one that does not raises), its META's state returned."""
    if not os.path.isdir(path):
        return torch.load(path, map_location="cpu", weights_only=False)
    for root, _, names in os.walk(path):
        for n in sorted(names):
            if n.endswith(".pt") and n != META:
                torch.load(os.path.join(root, n), map_location="cpu", weights_only=False)
    return torch.load(os.path.join(path, META), map_location="cpu", weights_only=False)


def agree_restart(cfg, d) -> int:
    """Which relaunch this launch is, the same on every rank. Under torchrun's own
    --max-restarts each node's agent counts its restarts itself: it lowers its count only
    when its own workers failed, and restarts healthy ones for a membership change without
    counting it (torch/distributed/elastic/agent/server/api.py, SimpleElasticAgent._invoke_run;
    pytorch/pytorch#135712), so the ranks of a node that did not fail say 0 where the failed
    node's say 1. So do the pods of a PyTorchJob, each of which decides for itself
    (restarts.AGREE_VAR, set by its manifest). The largest is the launch's. A collective
    only under such a torchrun (TORCHELASTIC_MAX_RESTARTS > 0; the kit's launchers give 0
    or none) or such pods."""
    if (str(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")).strip() not in ("", "0")
            or os.environ.get(restarts.AGREE_VAR) == "1"):
        cfg.restart = max(d.allgather_object(int(cfg.restart)))
    return cfg.restart


def resume(cfg, d, strategy, log=print, sized=_unsaid) -> Position:
    """Where this launch starts: step 0 on a first launch, or the newest checkpoint
    that loads on a relaunch (then the model, optimizer and this rank's random states
    are restored); rank 0 writes where it resumed (lab.common.restarts.write_resumed).
    A first launch that checkpoints clears its job's folder first (rank 0, before any
    rank's first write): a script submitted again under the same run id and launch name
    must not resume its retries from the checkpoints of the submission before (bench
    clears it before a first launch too: lab.host.run.restart). `sized(bytes)`: told,
    on a relaunch, the bytes of the checkpoint this rank reads, before it reads them
    (rank 0: the newest; the heartbeat's checkpoint phase)."""
    if not cfg.restart:
        if cfg.checkpoint_every and d.rank == 0:
            shutil.rmtree(job_folder(cfg), ignore_errors=True)
        return Position()
    folder = job_folder(cfg)
    if d.rank == 0:
        found = listed(folder)
        sized(disk_bytes(found[0][1]) if found else 0)
    path, state = newest_loadable(folder, log) if d.rank == 0 else (None, None)
    # rank 0's choice to every rank (the same type on each: Horovod names an object
    # collective by its type, horovod/torch/functions.py allgather_object)
    path = d.allgather_object(path or "")[0] or None
    horovod = cfg.framework == "horovod"
    own = getattr(strategy, "own_checkpoint", False)
    if path is not None and d.rank != 0 and not horovod:
        sized(disk_bytes(path))
        state = torch.load(os.path.join(path, META) if own else path, map_location="cpu",
                           weights_only=False)
    if path is not None and state is not None:
        if state["world"] != d.size:
            raise ConfigError(f"the checkpoint {path} was written by {state['world']} ranks, not "
                              f"{d.size}: a relaunch must keep --np")
        if own:     # every rank reads its part (save_folder, below)
            strategy.load_checkpoint_files(os.path.dirname(path), os.path.basename(path))
        else:
            strategy.load_checkpoint_state(state["model"], state["optimizer"])
        if strategy.scaler and state.get("scaler"):
            strategy.scaler.load_state_dict(state["scaler"])
    if path is not None and horovod:        # rank 0's state to every rank
        hvd = d.hvd
        hvd.broadcast_parameters(strategy.eval_module().state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(strategy.optimizer, root_rank=0)
        if strategy.scaler:
            strategy.scaler.load_state_dict(hvd.broadcast_object(strategy.scaler.state_dict(), 0))
        meta = d.allgather_object({k: state[k] for k in ("global_step", "epoch", "step", "epochs",
                                                          "ranks", "saved_at")} if d.rank == 0 else {})[0]
        state = meta
    pos = Position()
    if path is not None:
        own = state["ranks"][d.rank]
        restore_own(own)
        pos = Position(state["global_step"], state["epoch"], state["step"], list(state["epochs"]),
                       own["loss_sum"], os.path.basename(path))
    if d.rank == 0:
        restarts.write_resumed(folder, cfg.restart, from_step=pos.global_step,
                               checkpoint=pos.checkpoint, resumed_at=time.time(),
                               saved_at=state["saved_at"] if path else None)
        where = f"step {pos.global_step} ({pos.checkpoint})" if path else "step 0 (no checkpoint)"
        log(f"relaunch {cfg.restart}: resuming from {where}", flush=True)
    return pos


def due(cfg, global_step: int, total_steps: int) -> bool:
    """Whether a checkpoint is written after `global_step` steps (never after the last)."""
    return bool(cfg.checkpoint_every) and global_step % cfg.checkpoint_every == 0 \
        and global_step < total_steps


# ---- A checkpoint that a strategy writes itself, as a folder (DeepSpeed: each rank writes
# its own files through engine.save_checkpoint), kept to the same rules as a file:
# whole or not at all, the newest lab.common.restarts.KEEP kept.
#
# How it is written: every rank writes its part into <job folder>/.step-N.tmp (the
# strategy's save_checkpoint_files; DeepSpeed's ends with a barrier, so every rank's files
# are there when it returns), then rank 0 adds the kit's part (META: the position, the
# ranks' random states and running losses), fsyncs every file and the folder, and renames
# the folder to step-N (os.rename of a folder is atomic, as os.replace of a file is), then
# fsyncs the job folder. A rank killed during the write leaves .step-N.tmp, which is never
# listed as a checkpoint (FOLDER) and is removed by the next prune;
# a checkpoint that does not load is skipped on a relaunch as a file is
# (newest_loadable loads every file of the folder).
#
# A `latest` file naming the newest checkpoint is written beside them (atomically), as
# DeepSpeed's own save would (runtime/engine.py, save_checkpoint with save_latest), so that
# DeepSpeed's tools (zero_to_fp32.py) find it; the kit does not read it: a relaunch takes
# the newest folder that loads.


def folder_tmp_name(step: int) -> str:
    return f".step-{step:08d}.tmp"


def save_folder(cfg, d, strategy, meta: dict) -> None:
    """The checkpoint of meta['global_step'], written by every rank into a temporary folder
    that rank 0 completes and renames (every rank calls this)."""
    folder = job_folder(cfg)
    step = meta["global_step"]
    tmp = os.path.join(folder, folder_tmp_name(step))
    if d.rank == 0:     # a relaunch re-writing a step whose writer was killed
        os.makedirs(folder, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    d.allgather_object(None)        # no rank writes into it before it is cleared
    strategy.save_checkpoint_files(folder, os.path.basename(tmp))
    if d.rank == 0:
        complete_folder(folder, tmp, step, meta)


def complete_folder(folder: str, tmp: str, step: int, meta: dict) -> None:
    """Rank 0: META written into `tmp`, everything in it fsynced, `tmp` renamed step-N."""
    write_atomic(os.path.join(tmp, META), lambda f: torch.save(meta, f))
    # fsync through a descriptor of this process flushes the file's pages whichever
    # process wrote them (the other ranks' files, on this machine or a shared folder).
    for root, dirs, names in os.walk(tmp):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_folder(root)
    final = os.path.join(folder, f"step-{step:08d}")
    if os.path.exists(final):       # one that did not load, left by an earlier launch
        old = os.path.join(folder, f".step-{step:08d}.tmp-old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_folder(folder)
    write_atomic(os.path.join(folder, "latest"), lambda f: f.write(os.path.basename(final).encode()))
    prune(folder)
