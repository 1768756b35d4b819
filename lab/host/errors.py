"""The two errors every part of lab.host may raise, at its bottom so that no part imports
another for them: RunnerError (a place to run, or the image choice, cannot do what it was
asked) and BenchError (bad input, or a missing piece). Each carries one sentence."""


class RunnerError(Exception):
    """No engine, no image, no cluster, or a job that could not start: one sentence."""


class BenchError(Exception):
    """Bad input or a missing piece: one sentence that says what to do."""
