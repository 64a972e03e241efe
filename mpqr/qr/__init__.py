"""QR factorizations written once against the Array API.

Public entry point: :func:`mpqr.qr` (:func:`mpqr.qr.api.qr`). The methods live
in one module each: ``householder_recursive``, ``householder_tiled``,
``gram_schmidt_recursive``, ``cholqr`` (CholQR, CholQR2, shifted CholQR3) and
``svqr``; shared kernels (TSQR panel, WY reconstruction, recursive TRMM) in
``_kernels``.
"""

from mpqr.qr.api import METHODS, QRResult, qr
from mpqr.qr.applications import orth, svd

__all__ = ["METHODS", "QRResult", "orth", "qr", "svd"]
