"""Drop-in front ends that follow SciPy's and NumPy's conventions.

``mpqr.compat.scipy`` (``lstsq``, ``qr``, ``patch``) and ``mpqr.compat.numpy``
(``lstsq``, ``qr``); import the submodules explicitly.
"""

__all__ = ["numpy", "scipy"]
