"""Recursive and blocked out-of-core QR (placeholder until implemented)."""
