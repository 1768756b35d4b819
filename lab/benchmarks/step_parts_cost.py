"""What measuring each step's parts costs: `python -m lab.benchmarks.step_parts_cost` runs the
same short local job with the parts measured and without (lab.worker.step_parts.ENV=off),
in interleaved pairs (this machine's speed drifts within seconds: a pair's two runs are
neighbours, their order alternates), and prints each pair's ratio of median steps and
the median ratio. A benchmark that prints numbers; nothing is asserted."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lab.worker.step_parts import ENV, StepParts, joined


def one_run(folder: Path, run_id: str, measured: bool, args) -> float:
    env = dict(os.environ, **{ENV: "on" if measured else "off"})
    cmd = [sys.executable, "-m", "invoke", "bench", "--local", "--np", str(args.np),
           "--framework", args.framework, "--model", args.model, "--data", args.data,
           "--epochs", "1", "--max-steps", str(args.steps), "--results-dir", str(folder),
           "--run-id", run_id]
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True,
                        cwd=Path(__file__).resolve().parents[2])
    if cp.returncode != 0:
        sys.exit(f"the run failed: {' '.join(cmd)}\n{cp.stdout[-1500:]}{cp.stderr[-1500:]}")
    [line] = (folder / run_id / "results.jsonl").read_text().splitlines()
    return json.loads(line)["figures"]["step_time_p50_s"]


def marks_cost_s(steps: int = 20000) -> float:
    """Seconds per step that a rank's StepParts spends on one step's marks (timed on
    this machine's CPU clock; a GPU's are CUDA events instead)."""
    import time

    sp = StepParts(None, enabled=True)
    mark = joined(lambda where: None, sp.mark)      # as the strategy calls it
    t0 = time.perf_counter()
    for _ in range(steps):
        sp.mark("data")
        sp.mark("step")
        for where in ("forward", "backward", "optimizer"):
            mark(where)
        sp._at["computed"] = sp._now()              # the last gradient's hook
        sp.mark("end")
        sp.end(True, None, 0.01)
    return (time.perf_counter() - t0) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="interleaved pairs of runs")
    ap.add_argument("--np", type=int, default=2, help="processes per run")
    ap.add_argument("--framework", default="ddp", help="ddp or horovod")
    ap.add_argument("--model", default="mnist", help="the model (a short step is the worst case)")
    ap.add_argument("--data", default="synthetic", help="the dataset")
    ap.add_argument("--steps", type=int, default=300, help="steps per run")
    args = ap.parse_args(argv)
    print(f"the marks alone: {marks_cost_s() * 1e6:.2f} us per step (the training loop's and "
          f"the step's marks, the end of the step, the waiting split and summary excluded)")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="step-parts-cost-") as tmp:
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            t = {m: one_run(Path(tmp), f"p{i}-{'on' if m else 'off'}", m, args) for m in order}
            ratios.append(t[True] / t[False])
            print(f"pair {i + 1}: measured {t[True] * 1000:.3f} ms, not measured "
                  f"{t[False] * 1000:.3f} ms per step (median): ratio {ratios[-1]:.3f}", flush=True)
    print(f"median ratio over {len(ratios)} pairs: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
