"""Sweeps and variant matrices: `lightning-perf bench` and `lightning-perf matrix`."""
