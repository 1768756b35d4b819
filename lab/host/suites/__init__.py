"""Commands that combine bench, doctor and build: `invoke doctor`, `invoke lab` (the
course) and `invoke acceptance`, with their plans and estimates."""
