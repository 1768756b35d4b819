"""`python -m lab.host.launchers.horovod --built=gloo,mpi HOROVODRUN-ARGS...`: horovodrun,
with its checks of what Horovod was built with (horovod.common.util.gloo_built and
mpi_built: each forks a child that imports horovod.torch, and with it torch, a whole
import's worth of every Horovod run's start-up) answered from what bench's stack probe
already found (`--built`: the controllers this Horovod has, from the probe's
hvd.gloo_built() and hvd.mpi_built(), cached with it: lab.host.places.stack_cache). Everything
else is horovodrun's own code (horovod.runner.launch.run_commandline), its output and
its exit status unchanged. Without --built it is plain horovodrun. Imports no torch."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    built = None
    if argv and argv[0].startswith("--built="):
        built = {c for c in argv.pop(0).split("=", 1)[1].split(",") if c}
    from horovod.common import util
    from horovod.runner import launch
    if built is not None:
        for controller in ("gloo", "mpi"):
            answer = controller in built

            def check(verbose=False, answer=answer):
                return answer
            setattr(util, f"{controller}_built", check)
            setattr(launch, f"{controller}_built", check)      # imported there by name
    sys.argv = ["horovodrun", *argv]
    return launch.run_commandline() or 0


if __name__ == "__main__":
    sys.exit(main())
