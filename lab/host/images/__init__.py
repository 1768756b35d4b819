"""The lab image: built from the version matrix (build), and the built one this host can run chosen at run time (choice)."""
