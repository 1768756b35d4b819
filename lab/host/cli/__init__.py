"""Talks to the user: the run tasks' flags and help, invoke.yaml's sections, an unknown
flag named with the closest. Above every other part of lab.host: nothing below imports
it. What is shown while a run works, and how wide, is lab.common.display's."""
