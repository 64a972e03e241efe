"""mpqr: mixed-precision QR factorization and least squares on tensor-core GPUs.

The algorithms are written once against the Python Array API standard and run
on CuPy (GPU) and NumPy (reference, emulating every tensor-core engine).
Every matrix product goes through the precision policy, which can explain
what it chose: ``with mpqr.explain() as trace: ...``.
"""

from mpqr import _aliases  # noqa: F401  (first: the module paths of earlier releases)
from mpqr._errors import BreakdownError, DeviceMemoryError, LinAlgError, RefinementWarning
from mpqr.lstsq import lstsq
from mpqr.matmul import matmul
from mpqr.policy import (
    PRECISIONS,
    GemmOptions,
    Trace,
    explain,
    gemm_options,
    get_precision,
    precision,
    set_precision,
)
from mpqr.qr import QRResult, orth, qr, svd  # the function shadows the subpackage name
from mpqr.tune import tune  # likewise: mpqr.tune is the function

__version__ = "0.1.0"

__all__ = [
    "PRECISIONS",
    "BreakdownError",
    "DeviceMemoryError",
    "GemmOptions",
    "LinAlgError",
    "QRResult",
    "RefinementWarning",
    "Trace",
    "__version__",
    "explain",
    "gemm_options",
    "get_precision",
    "lstsq",
    "matmul",
    "orth",
    "precision",
    "qr",
    "set_precision",
    "svd",
    "tune",
]
