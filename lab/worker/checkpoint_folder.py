"""A checkpoint that a strategy writes itself, as a folder (DeepSpeed: each rank writes
its own files through engine.save_checkpoint), kept to lab.worker.checkpoint's rules:
whole or not at all, the newest lab.common.restarts.KEEP kept.

How it is written: every rank writes its part into <job folder>/.step-N.tmp (the
strategy's save_checkpoint_files; DeepSpeed's ends with a barrier, so every rank's files
are there when it returns), then rank 0 adds the kit's part (META: the position, the
ranks' random states and running losses), fsyncs every file and the folder, and renames
the folder to step-N (os.rename of a folder is atomic, as os.replace of a file is), then
fsyncs the job folder. A rank killed during the write leaves .step-N.tmp, which is never
listed as a checkpoint (lab.worker.checkpoint.FOLDER) and is removed by the next prune;
a checkpoint that does not load is skipped on a relaunch as a file is
(lab.worker.checkpoint.newest_loadable loads every file of the folder).

A `latest` file naming the newest checkpoint is written beside them (atomically), as
DeepSpeed's own save would (runtime/engine.py, save_checkpoint with save_latest), so that
DeepSpeed's tools (zero_to_fp32.py) find it; the kit does not read it: a relaunch takes
the newest folder that loads."""
from __future__ import annotations

import os
import shutil

import torch

from lab.worker import checkpoint


def tmp_name(step: int) -> str:
    return f".step-{step:08d}.tmp"


def save(cfg, d, strategy, meta: dict) -> None:
    """The checkpoint of meta['global_step'], written by every rank into a temporary folder
    that rank 0 completes and renames (every rank calls this)."""
    folder = checkpoint.job_folder(cfg)
    step = meta["global_step"]
    tmp = os.path.join(folder, tmp_name(step))
    if d.rank == 0:     # a relaunch re-writing a step whose writer was killed
        os.makedirs(folder, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    d.allgather_object(None)        # no rank writes into it before it is cleared
    strategy.save_checkpoint_files(folder, os.path.basename(tmp))
    if d.rank == 0:
        complete(folder, tmp, step, meta)


def complete(folder: str, tmp: str, step: int, meta: dict) -> None:
    """Rank 0: META written into `tmp`, everything in it fsynced, `tmp` renamed step-N."""
    checkpoint.write_atomic(os.path.join(tmp, checkpoint.META), lambda f: torch.save(meta, f))
    # fsync through a descriptor of this process flushes the file's pages whichever
    # process wrote them (the other ranks' files, on this machine or a shared folder).
    for root, dirs, names in os.walk(tmp):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        checkpoint.fsync_folder(root)
    final = os.path.join(folder, f"step-{step:08d}")
    if os.path.exists(final):       # one that did not load, left by an earlier launch
        old = os.path.join(folder, f".step-{step:08d}.tmp-old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    checkpoint.fsync_folder(folder)
    checkpoint.write_atomic(os.path.join(folder, "latest"),
                            lambda f: f.write(os.path.basename(final).encode()))
    checkpoint.prune(folder)
