"""Turns flags into one checked, immutable plan (settings, their checks against the ranks'
stack, the counts refused, the jobs in order); writes nothing."""
