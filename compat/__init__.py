"""Drop-in front ends that follow SciPy's, NumPy's and the Array API's conventions.

``mpqr.compat.scipy`` (``lstsq``, ``qr``, ``patch``), ``mpqr.compat.numpy``
(``lstsq``, ``qr``) and ``mpqr.compat.array_api`` (``namespace``, ``patch``: mpqr in
Array-API code such as scikit-learn's); import the submodules explicitly.
"""

__all__ = ["array_api", "numpy", "scipy"]
