"""Probes of the host and of the lab image (`python -m envcheck`)."""
