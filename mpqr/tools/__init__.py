"""Command-line tooling (demo, benchmarks). Not part of the algorithmic core:
these modules may use NumPy/CuPy directly for data generation and timing."""
