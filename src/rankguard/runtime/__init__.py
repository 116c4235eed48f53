"""The in-rank runtime: the bootstrap that runs before the user's script, and instrumentation."""
