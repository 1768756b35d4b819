"""`python -m lab.benchmarks.startup_bench`: a run's fixed cost against Horovod's own example,
side by side on this machine, and a one-step run against a bare `import torch`.

1. Horovod's examples/pytorch/pytorch_mnist.py (v0.28.1) under `horovodrun --gloo`
   against `invoke bench --local --framework horovod --backend gloo` on the same
   MNIST-sized data (60,000 training images of 28x28, batch 64 per rank, one thread per
   rank), one and two epochs each, interleaved and repeated: per epoch = T(2) - T(1), the
   rest of T(1) is the run's fixed cost. Also, per run, the time from the command to the
   first step: the example's first "Train Epoch: 1 [0/" line (printed after its first
   step), the kit's record (figures.startup_total_s, to its first timed step).
2. `invoke bench --local --np 1 --framework ddp --max-steps 1 --warmup-steps 0` (one step,
   the first one timed) against `python -c "import torch, torch.distributed"`,
   interleaved: the whole run, and from the command to the first step (its record's
   figures.startup_total_s).

The example is not part of the kit: give its path with --reference, or it is fetched at
run time from GitHub (REFERENCE_URL) into a temporary folder. MNIST itself cannot be
downloaded everywhere, so both sides get synthetic data of MNIST's size: the kit its
--data synthetic --synthetic-size 60000 (random images, as whole tensors), the example
random 28x28 images and labels written as MNIST's raw IDX files where torchvision's
MNIST data set looks for them (<data>/MNIST/raw/), which it then reads as it reads
MNIST (no download: the files exist). The test sets differ: the example's 10,000
images, the kit's an eighth of its training set (7,500).

Run from the checkout (invoke needs tasks.py): python -m lab.benchmarks.startup_bench
[--np 1,2] [--repeats 3] [--kit NAME=CHECKOUT ...] [--one-step-only | --side-by-side-only]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lab.common import kit as kitfacts

REFERENCE_URL = ("https://raw.githubusercontent.com/horovod/horovod/v0.28.1/"
                 "examples/pytorch/pytorch_mnist.py")
TRAIN, TEST, SIZE, BATCH = 60000, 10000, 28, 64


def reference_script(path: str | None, into: Path) -> Path:
    if path:
        return Path(path)
    dest = into / "pytorch_mnist.py"
    with urllib.request.urlopen(REFERENCE_URL, timeout=60) as r:
        dest.write_bytes(r.read())
    return dest


def write_reference_data(root: Path, seed: int = 0) -> None:
    """Random MNIST-shaped images and labels as torchvision's MNIST reads them:
    <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (uncompressed IDX)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)

    def idx(path, shape, body):        # IDX: 0, 0, type 0x08 (unsigned byte), dimensions
        path.write_bytes(bytes([0, 0, 0x08, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + body)
    for prefix, n in (("train", TRAIN), ("t10k", TEST)):
        idx(raw / f"{prefix}-images-idx3-ubyte", (n, SIZE, SIZE), rng.randbytes(n * SIZE * SIZE))
        idx(raw / f"{prefix}-labels-idx1-ubyte", (n,), bytes(b % 10 for b in rng.randbytes(n)))


def timed(cmd: list[str], cwd: str | Path, env: dict, log: Path, first: str | None = None):
    """The command's wall time, and with `first` (a text its output holds once its first
    training step is done) the time until that line appeared: (seconds, seconds or None)."""
    t0 = time.perf_counter()
    seen = None
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in p.stdout:
            if seen is None and first and first.encode() in line:
                seen = time.perf_counter() - t0
            out.write(line)
        rc = p.wait()
    took = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {log}")
    return took, seen


def newest_record(results_dir: Path) -> dict:
    path = max(results_dir.glob("*/results.jsonl"), key=lambda p: p.stat().st_mtime)
    return json.loads(path.read_text().splitlines()[-1])


def kit_env(checkout: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f} (median {statistics.median(values):.1f})"


def side_by_side(args, work: Path, kits: dict[str, Path], log: Path) -> str:
    python = sys.executable
    horovodrun = kitfacts.horovodrun(python)
    ref = reference_script(args.reference, work)
    write_reference_data(work / "data")
    ref_env = dict(os.environ, OMP_NUM_THREADS="1")

    def ref_cmd(np_, epochs):
        return [horovodrun, "-np", str(np_), "--gloo", python, str(ref), "--epochs", str(epochs),
                "--batch-size", str(BATCH), "--data-dir", str(work / "data"), "--no-cuda"]

    def kit_cmd(checkout, np_, epochs):
        return [python, "-m", "invoke", "bench", "--local", "--np", str(np_), "--framework", "horovod",
                "--backend", "gloo", "--data", "synthetic", "--synthetic-size", str(TRAIN),
                "--batch-size", str(BATCH), "--threads", "1", "--epochs", str(epochs),
                "--results-dir", str(work / "results")]
    # The example prints "Train Epoch: 1 [0/..." after its first step; the kit's record
    # has its time from the command to the first timed step (figures.startup_total_s).
    sides = {"ref": lambda n, e: timed(ref_cmd(n, e), work, ref_env, log, first="Train Epoch: 1 [0/")}

    def kit_side(c):
        def run(n, e):
            took, _ = timed(kit_cmd(c, n, e), c, kit_env(c), log)
            f = newest_record(work / "results")["figures"]
            return took, f.get("startup_total_s")
        return run
    for name, checkout in kits.items():
        sides[name] = kit_side(checkout)
    # Untimed first round: the files in the page cache, the kit's stack probe cached.
    for name, run in sides.items():
        run(1, 1)
    times: dict = {}
    firsts: dict = {}
    for rep in range(args.repeats):
        for np_ in args.np:
            for epochs in (1, 2):
                order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
                for name in order:
                    t, first = sides[name](np_, epochs)
                    times.setdefault((name, np_, epochs), []).append(t)
                    if first is not None:
                        firsts.setdefault((name, np_), []).append(first)
                    print(f"  repeat {rep + 1}, np {np_}, {epochs} epoch(s), {name}: {t:.1f} s"
                          + (f" (first step at {first:.1f} s)" if first is not None else ""), flush=True)
    lines = ["| np | who | per epoch, s | fixed cost, s | to the first step, s | T(1 epoch), s |",
             "|---|---|---|---|---|---|"]
    for np_ in args.np:
        for name in sides:
            t1, t2 = times[(name, np_, 1)], times[(name, np_, 2)]
            per = [b - a for a, b in zip(t1, t2)]
            fixed = [a - p for a, p in zip(t1, per)]
            first = firsts.get((name, np_))
            lines.append(f"| {np_} | {name} | {spread(per)} | {spread(fixed)} | "
                         f"{spread(first) if first else '-'} | {spread(t1)} |")
    return "\n".join(lines)


def one_step(args, work: Path, kits: dict[str, Path], log: Path) -> str:
    python = sys.executable
    bare = [python, "-c", "import torch, torch.distributed"]
    rows: dict = {}
    results_dir = work / "one-step"

    def kit_run(name, checkout):
        before = set(results_dir.glob("*/results.jsonl")) if results_dir.exists() else set()
        cmd = [python, "-m", "invoke", "bench", "--local", "--np", "1", "--framework", args.framework,
               "--max-steps", "1", "--warmup-steps", "0", "--results-dir", str(results_dir)]
        t, _ = timed(cmd, checkout, kit_env(checkout), log)
        (new,) = set(results_dir.glob("*/results.jsonl")) - before
        f = json.loads(new.read_text().splitlines()[-1])["figures"]
        first = f.get("startup_total_s")
        return t, first if first is not None else f.get("startup_s")
    for name, checkout in kits.items():       # untimed: caches warm
        kit_run(name, checkout)
    timed(bare, work, dict(os.environ), log)
    for rep in range(args.repeats):
        rows.setdefault("bare", []).append(timed(bare, work, dict(os.environ), log)[0])
        for name, checkout in (kits.items() if rep % 2 == 0 else list(kits.items())[::-1]):
            rows.setdefault(name, []).append(kit_run(name, checkout))
    b = rows["bare"]
    lines = ["| who | whole run, s | to the first step, s | whole / bare import |", "|---|---|---|---|",
             f"| import torch, torch.distributed | {spread(b)} | - | 1.0 |"]
    for name in kits:
        whole = [w for w, _ in rows[name]]
        first = [f for _, f in rows[name] if f is not None]
        ratios = [w / x for w, x in zip(whole, b)]
        lines.append(f"| {name}: bench --np 1 --framework {args.framework} --max-steps 1 | "
                     f"{spread(whole)} | {spread(first) if first else '-'} | "
                     f"{min(ratios):.2f}-{max(ratios):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", help="path of Horovod's examples/pytorch/pytorch_mnist.py "
                                       "(default: fetched from GitHub, v0.28.1)")
    p.add_argument("--np", default="1,2", help="process counts of the side-by-side runs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kit", action="append", default=[],
                   help="NAME=CHECKOUT: a copy of the kit to measure (repeatable; default: this one)")
    p.add_argument("--framework", default="ddp", help="the one-step run's --framework")
    p.add_argument("--one-step-only", action="store_true")
    p.add_argument("--side-by-side-only", action="store_true")
    args = p.parse_args(argv)
    args.np = [int(n) for n in args.np.split(",")]
    kits = {"kit": kitfacts.REPO_ROOT} if not args.kit else {
        k: Path(v).resolve() for k, v in (s.split("=", 1) for s in args.kit)}
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        work = Path(tmp)
        log = work / "log.txt"
        print(f"machine: {os.cpu_count()} CPU(s); {sys.executable}; kits: "
              + ", ".join(f"{k}={v}" for k, v in kits.items()), flush=True)
        out = []
        try:
            if not args.one_step_only:
                out.append("side by side (Horovod's pytorch_mnist.py as ref), seconds, "
                           f"{args.repeats} interleaved repeats:\n" + side_by_side(args, work, kits, log))
            if not args.side_by_side_only:
                out.append(f"one-step run, {args.repeats} interleaved repeats:\n"
                           + one_step(args, work, kits, log))
        except SystemExit:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise
        print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
