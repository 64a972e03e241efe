"""Benchmarks (``python -m mpqr bench TOPIC``) and the rendering of their results.

Not part of the numerical core: these modules may use NumPy/CuPy directly for data
generation and timing."""
