"""`python -m lab.benchmarks.node_cores_bench`: runs across the simulated cluster's two nodes
with the nodes sharing the machine's cores (LAB_NODE_CORES=shared) and with a share of
their own (the default), interleaved in pairs so that a drift of the machine's speed falls
on both alike: Horovod over MPI and over Gloo, MNIST (the model benchmark's runs,
lab.benchmarks.model_bench), 2 workers on 2 nodes over a shaped link. Prints each run's mean
step and, per back end, each way's range and the median of the pairs' ratios.

Needs the cluster up on its results folder: `invoke up --nodes 2 --results-dir DIR`.
Run from the checkout (invoke needs tasks.py)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lab.benchmarks.model_bench import MNIST
from lab.host.places.compose.cores import MODES, NODE_CORES_VAR


def runs(results: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(way, back end) -> [(pair, mean step in ms)] of the ok records under `results`."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for f in sorted(results.glob("*/results.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            way, _, pair = r.get("run_id", "").rpartition("-")
            if r.get("status") != "ok" or way not in MODES or not pair.isdigit():
                continue
            out.setdefault((way, r["world"].get("controller") or r["config"]["backend"]), []).append(
                (int(pair), 1000 * r["figures"]["step_time_mean_s"]))
    return out


def lines(found: dict) -> list[str]:
    """Per back end: each way's runs, range and spread (largest over smallest), and the
    median over pairs of shared over own."""
    out = []
    for backend in sorted({b for _, b in found}):
        mine = {w: dict(found.get((w, backend), [])) for w in MODES}
        for w in MODES:
            v = list(mine[w].values())
            if v:
                out.append(f"{backend:5} {w:6} runs {' '.join(f'{x:.2f}' for x in v)} ms; "
                           f"{min(v):.2f}-{max(v):.2f}, spread {max(v) / min(v):.2f}x")
        pairs = sorted(mine["shared"].keys() & mine["own"].keys())
        if pairs:
            ratio = statistics.median(mine["shared"][p] / mine["own"][p] for p in pairs)
            out.append(f"{backend:5} shared/own, median over {len(pairs)} pair(s): {ratio:.2f}")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", required=True, help="the folder the cluster's nodes mount (invoke up --results-dir)")
    p.add_argument("--pairs", type=int, default=4, help="pairs of runs (shared, then own)")
    p.add_argument("--link", default="1gbit", help="the link between the nodes (bench --link)")
    p.add_argument("--only-table", action="store_true", help="print the table of what is there")
    a = p.parse_args(argv)
    results = Path(a.results_dir)
    for i in range(a.pairs if not a.only_table else 0):
        for way in MODES[::-1]:         # shared first, then own
            cmd = [sys.executable, "-m", "invoke", "bench", "--nodes", "2", "--np", "2", "--link", a.link,
                   "--framework", "horovod", "--backend", "mpi,gloo", *MNIST, "--results-dir", str(results),
                   "--run-id", f"{way}-{i}"]
            print(f"$ {NODE_CORES_VAR}={way} {' '.join(cmd[2:])}", flush=True)
            rc = subprocess.run(cmd, env={**os.environ, NODE_CORES_VAR: way},
                                stdout=subprocess.DEVNULL).returncode
            if rc != 0:
                print(f"that bench ended {rc}: see {results}/{way}-{i}", flush=True)
    print("\n".join(lines(runs(results))) or f"no runs under {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
