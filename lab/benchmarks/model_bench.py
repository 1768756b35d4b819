"""`python -m lab.benchmarks.model_bench`: the cost model (lab.report.cost_model) held against the
lab's runs on this machine, within one server and across the simulated cluster's two
nodes: MNIST (the digits) and ResNet-50 (synthetic), DDP over Gloo, Horovod over Gloo and
over MPI, links shaped to 1 Gbit/s and 100 Mbit/s. The DDP runs measure the compute
ceiling (--ceiling; it runs no framework, so Horovod's rows of the same model and place
share it) and doctor stores its collectives' size sweeps (`invoke doctor --save`), so every
multi-worker row is predicted from measurements apart from its own steps.

The parts, in order (each a list of `invoke` commands, all records under --results-dir):
  within   doctor here (Gloo and MPI sweeps), MNIST and ResNet-50 at 1 and 2 workers;
  across   `invoke up --nodes 2` (its nodes mounting --results-dir; left up), doctor
           across the nodes at 100 Mbit/s (at 1 Gbit/s the runs' own probes, MNIST's and
           ResNet-50's payloads, give the fit two sizes), MNIST on 1 and 2 nodes at
           1 Gbit/s;
  predict  np 2 on 2 nodes at 100 Mbit/s predicted from the records so far and doctor's
           sweeps alone, before it runs (model_check --leave-out; saved to predicted.txt);
  leftout  that configuration run (MNIST: DDP with its ceiling, Horovod over Gloo and over
           MPI), right after the MNIST runs it was predicted from;
  across-resnet50  ResNet-50 on 1 and 2 nodes at 1 Gbit/s (DDP, Horovod over Gloo);
  table    the predicted against the measured step of every row (median and largest
           absolute error: all of them, within one server, across servers), the
           measurement's own spread (each run's step against its configuration's other
           runs: the floor no prediction of one run beats), the machine's speed during
           the left-out runs (their ceiling against the one at 1 Gbit/s) and the left-out
           configuration's prediction against its measurement.
On 2 cores the whole of it took 13.3 minutes with one repeat and 37 to 44 with
--repeat 3 (which repeats every run; 33 on a VM 1.7 times as fast). `--only PART,...` runs some parts (table and predict
read what is there); `--dry-run` prints the commands.

Run from the checkout (invoke needs tasks.py)."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from lab.common.link import rate_gbs
from lab.report import model_check
from lab.report.model_inputs import ceilings

PARTS = ("within", "across", "predict", "leftout", "across-resnet50", "table")
LEFT_OUT = "np=2,nodes=2,link=100mbit,model=mnist"
# The digits give 23 steps an epoch at 2 workers (46 at 1; --max-steps caps an epoch): 22
# epochs, so that about 500 steps are timed at 2 workers (a step of 4-12 ms). A run's steps
# drift between slower and faster spells tens of steps long, which 133 timed steps (6
# epochs) averaged into runs of one configuration up to 54% apart; the runs' start-up,
# 10-20 s, is most of their time either way.
MNIST = ["--data", "digits", "--batch-size", "32", "--epochs", "22", "--max-steps", "150", "--warmup-steps", "5"]
RESNET = ["--model", "resnet50", "--data", "synthetic", "--batch-size", "4", "--epochs", "1",
          "--max-steps", "12", "--warmup-steps", "2"]
# The ceiling runs no framework: measured beside the DDP runs, it serves Horovod's too
# (lab.report.model_inputs.ceilings), which saves 2 x 10 s of timed steps a run.
DDP = ["--framework", "ddp", "--backend", "gloo", "--ceiling"]
HOROVOD = ["--framework", "horovod", "--backend", "gloo,mpi"]


def commands(results: str, repeat: int) -> dict[str, list[list[str]]]:
    """Each part's `invoke` commands (argv after `invoke`)."""
    common = ["--results-dir", results, "--repeat", str(repeat)]
    across = ["--nodes", "1,2", "--np", "1,2", "--link", "1gbit"]
    local = ["--local", "--np", "1,2"]

    def both(where, size, run_id, horovod=HOROVOD):
        return [["bench", *where, *DDP, *size, *common, "--run-id", f"{run_id}-ddp"],
                ["bench", *where, *horovod, *size, *common, "--run-id", f"{run_id}-horovod"]]
    return {
        "within": [["doctor", "--local", "--save", results],
                   *both(local, MNIST, "within-mnist"), *both(local, RESNET, "within-resnet50")],
        "across": [["up", "--nodes", "2", "--results-dir", results],     # the nodes mount it at /results
                   ["doctor", "--nodes", "2", "--link", "100mbit", "--save", results],
                   *both(across, MNIST, "across-mnist-1gbit")],
        # right after the runs it is predicted from: the machine's speed drifts within minutes
        "leftout": both(["--nodes", "2", "--np", "2", "--link", "100mbit"], MNIST, "across-mnist-100mbit"),
        "across-resnet50": both(across, RESNET, "across-resnet50-1gbit", ["--framework", "horovod", "--backend", "gloo"]),
    }


def _invoke(argv: list[str], dry: bool) -> int:
    line = "invoke " + " ".join(argv)
    print(f"\n$ {line}", flush=True)
    if dry:
        return 0
    t0 = time.monotonic()
    rc = subprocess.run([sys.executable, "-m", "invoke", *argv]).returncode
    print(f"({line.split()[1]}: exit {rc}, {time.monotonic() - t0:.0f} s)", flush=True)
    return rc


def table(results: str) -> list[str]:
    """Every predicted row (lab.report.model_check's table), then the errors' median and
    largest: all rows, within one server, across servers; the rows not predicted, why."""
    rows, why, _ = model_check.of_results(results)
    records = model_check._records([results])
    out = model_check.lines(rows, runs=model_check.run_steps(records)) if rows else ["no row predicted"]
    for label, pick in (("within one server", lambda n: " 1 server(s)" in n),
                        ("across servers", lambda n: " 1 server(s)" not in n)):
        errors = [p / m - 1 for n, p, m in rows if m and pick(n)]
        out.append(f"{label}: {model_check.summary_line(errors)}")
    out += [f"- not predicted: {w}" for w in why]
    spread = model_check.repeat_spread(records)
    out.append("the measurement's own spread, each run's step against its configuration's other runs "
               f"(--repeat 2 or more): {model_check.summary_line(spread, 'difference')}")
    return out + speed_by_link(records)


def speed_by_link(records: list[dict]) -> list[str]:
    """The compute ceiling (no framework, no exchange: the machine's speed) of the runs
    across servers, per model and link (the fastest first, the others against it), where
    a model has it on more than one link: a prediction made before a run cannot know that
    the machine slowed in between."""

    def link(r):
        return r.get("config", {}).get("link") or ""
    links = sorted({link(r) for r in records if r["world"]["nodes"] > 1}, key=lambda x: -(rate_gbs(x) or 0))
    # (compute_key, processes, servers) -> median images/s, per link, across servers only
    by_link = {x: {k: v for k, v in ceilings([r for r in records if link(r) == x]).items() if k[2] > 1}
               for x in links}
    out = []
    for key in dict.fromkeys(k for table in by_link.values() for k in table):
        speeds = {x: table[key] for x, table in by_link.items() if key in table}
        if len(speeds) > 1:
            first = next(iter(speeds.values()))
            out.append(f"the machine's speed around each link's runs, {key[0][0]} at {key[1]} processes on "
                       f"{key[2]} servers: compute ceiling (no exchange) " + ", ".join(
                           f"{v:,.0f} images/s around the {x} runs ({v / first:.2f})" for x, v in speeds.items()))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.benchmarks.model_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", default="results/model-bench", help="where every record and sweep goes")
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to run, a comma list of {', '.join(PARTS)}")
    p.add_argument("--repeat", type=int, default=1, help="runs of each combination (bench --repeat)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = p.parse_args(argv)
    parts = [x for x in a.only.split(",") if x]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or a.repeat < 1:
        p.error(f"--only takes {', '.join(PARTS)}, not {', '.join(unknown)}" if unknown else "--repeat is 1 or more")
    results = str(Path(a.results_dir).resolve())
    if not a.dry_run:
        Path(results).mkdir(parents=True, exist_ok=True)
    cmds, failed = commands(results, a.repeat), []
    predicted = Path(results) / "predicted.txt"
    for part in PARTS:
        if part not in parts:
            continue
        if part in cmds:
            failed += [" ".join(c[:1]) for c in cmds[part] if _invoke(c, a.dry_run) != 0]
        elif part == "predict":
            print(f"\n$ python -m lab.report.model_check --leave-out {LEFT_OUT} {results}")
            if not a.dry_run:
                out = subprocess.run([sys.executable, "-m", "lab.report.model_check", "--leave-out", LEFT_OUT,
                                      results], capture_output=True, text=True).stdout
                predicted.write_text(out)
                print(out + f"(saved to {predicted}, before the configuration runs)")
        elif part == "table" and not a.dry_run:
            print(f"\nPredicted against measured ({results}; steps in ms):")
            print("\n".join(table(results)))
            if predicted.exists():
                print(f"\nPredicted before it ran ({predicted}):\n{predicted.read_text()}")
            print(f"Predicted again from the other records alone, beside its measurement "
                  f"(python -m lab.report.model_check --leave-out {LEFT_OUT} {results}):")
            sys.stdout.flush()
            subprocess.run([sys.executable, "-m", "lab.report.model_check", "--leave-out", LEFT_OUT, results])
    if "across" in parts and not a.dry_run:
        print("\nthe simulated cluster is still up: `invoke down` stops it")
    if failed:
        print(f"\nsome commands failed ({', '.join(failed)}): their records say why; the table holds "
              f"what ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
