"""Talks to the user: the run tasks' flags and help, invoke.yaml's sections, an unknown
flag named with the closest, and the live display of a run. Above every other part of
lab.host: nothing below imports it."""
