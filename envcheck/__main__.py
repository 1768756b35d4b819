"""`python -m envcheck`: the environment facts the results manifest records, as JSON."""
import json
import sys

from envcheck import probes


def main() -> int:
    results = [p() for p in (probes.probe_os, probes.probe_cpu_model, probes.probe_mpi_version,
                             probes.probe_nvml_gpus, probes.probe_package_versions,
                             probes.probe_torch_cuda)]
    json.dump([r.as_dict() for r in results], sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
