"""Beside the command line (``python -m mpqr``): the demo and the GPU warm-up."""
