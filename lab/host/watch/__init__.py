"""Reads a running or failed job's signals (heartbeats, the launchers' output, exit codes)
and names the rank to blame."""
