"""Runs a plan's jobs in order and writes their records: the sweep, a combination's jobs,
restarts from a checkpoint, repeats until rows are told apart, the compute ceiling and
the start-up phases around a run."""
