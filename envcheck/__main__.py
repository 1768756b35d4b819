"""`python -m envcheck`: the doctor's probes without Docker. --part host: this
machine; --part stack: torch, Horovod, MPI, NCCL and the all-reduce measurements where
this Python runs (what `invoke doctor` runs inside the lab image); --part all: both and
the findings between them. A table and a summary line, or --json. Exit code 1 when a
check FAILs."""
import argparse
import sys
import time

from envcheck import findings, host, report, stack
from envcheck.probes import FAIL
from lab.common import display


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m envcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("host", "stack", "all"), default="all")
    p.add_argument("--np", type=int, default=stack.DEFAULT_NP, help="ranks of the MPI and all-reduce probes")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--wide", action="store_true",
                   help="every value and fix in full on its row (default: the terminal's width, "
                        "else $COLUMNS, else 120 columns; long ones as notes)")
    a = p.parse_args(argv)
    if a.np < 1:
        p.error("--np must be at least 1")
    t0 = time.monotonic()
    checks = []
    host_r = stack_r = []
    if a.part in ("host", "all"):
        host_r = host.collect()
        checks += [dict(r.as_dict(), where="host") for r in host_r]
    if a.part in ("stack", "all"):
        stack_r = stack.collect(a.np)
        checks += [dict(r.as_dict(), where="local") for r in stack_r]
    if a.part == "all":
        found = findings.find({r.name: r for r in host_r}, {r.name: r for r in stack_r}, a.np, False)
        checks += [dict(r.as_dict(), where="both") for r in found]
    seconds = time.monotonic() - t0
    if a.json:
        print(report.as_json(checks, seconds, []))
    else:
        print(report.table(checks, None if a.wide else display.width()))
        print(report.summary(checks, seconds))
    return 1 if any(c["status"] == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
