"""Training runs: K steps per arm and seed (`train`), their arms, progress files and checkpoints, the
results and their statistics, and which results are compared together (`comparisons`)."""
