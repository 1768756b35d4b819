"""The Open MPI transport settings (MCA parameters) of every MPI launch of the kit, in
one place: horovodrun --mpi's, the Kubernetes MPIJob's mpirun and doctor's own mpirun
probes (envcheck.stack) take them from here, so that doctor checks the path the runs take.

Horovod 0.28.1's horovodrun adds `-mca pml ob1 -mca btl ^openib` to every Open MPI
launch (horovod/runner/mpi_run.py: _OMPI_FLAGS, returned by
_get_mpi_implementation_flags for Open MPI and put on mpi_run's mpirun line): the ob1
point-to-point layer over the BTLs other than openib (TCP between hosts, shared memory
within one). A parameter on the command line wins over the same OMPI_MCA_* variable
(Open MPI 4.1 mpirun(1), "Setting MCA parameters"). Standard library only."""
from __future__ import annotations

TRANSPORTS = (("pml", "ob1"), ("btl", "^openib"))


def mca_args(params=TRANSPORTS) -> list[str]:
    """["-mca", "pml", "ob1", "-mca", "btl", "^openib"]: mpirun's spelling."""
    return [w for name, value in params for w in ("-mca", name, value)]


def mca_pairs(argv: list[str]) -> list[tuple[str, str]]:
    """The (name, value) of each -mca/--mca option of an mpirun command line, in order."""
    return [(argv[i + 1], argv[i + 2]) for i, w in enumerate(argv[:-2]) if w in ("-mca", "--mca")]
