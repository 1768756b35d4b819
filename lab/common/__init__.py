"""What the host, the ranks and the report all use. Standard library only at import."""
