"""The error a place to run raises, below both the places (lab.host.places) and the
image choice (lab.host.images), so neither imports the other for it."""


class RunnerError(Exception):
    """No engine, no image, no cluster, or a job that could not start: one sentence."""
