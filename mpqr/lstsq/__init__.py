"""Least squares (filled by the lstsq work)."""
