"""dl-lab-kit: distributed deep-learning training labs, reproducible.

The packages say where their code runs:

- `lab.common`: what every side uses (the run's configuration, the results schema,
  metrics, the version matrix, fetching data, the process helper); the standard
  library only at import.
- `lab.worker`: inside a rank (training, framework adapters, data, models,
  compression, the compute ceiling, the environment manifest); imports torch.
- `lab.host`: on the user's machine (checking a request, the runners for local
  processes, the lab image and the cluster, launch commands, image builds, Docker);
  never imports torch.
- `lab.report`: the tables, curves and analysis made from the records.

`envcheck` holds the probes (`invoke doctor`), which run on the host and where the
ranks run; it imports `lab.common` (its Docker probes import `lab.common.docker_api`
inside them), and `lab.host.suites.doctor` composes it.
"""
