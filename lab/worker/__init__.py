"""Code that runs inside a rank (or beside it, like the compute ceiling)."""
