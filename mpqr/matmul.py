"""Public matrix product through the precision policy."""

from __future__ import annotations

from typing import Any

from mpqr import _route
from mpqr._gpu_errors import device_errors
from mpqr._validation import check_dtype, check_ndim, namespace_of, plain_array
from mpqr.backends import get_backend
from mpqr.policy.policy import gemm

__all__ = ["matmul"]


def matmul(a: Any, b: Any, precision: str | None = None, *, options: Any = None) -> Any:
    """Matrix product ``a @ b`` computed by the engine the precision policy picks.

    Parameters
    ----------
    a : array, shape (M, K)
        Left operand (NumPy, CuPy or another Array API array).
    b : array, shape (K, N)
        Right operand, same library and device as ``a``.
    precision : {"auto", "fp16", "fp32", "fp32-emulated", "fp64", "fp64-emulated"}, optional
        Arithmetic to use. ``None`` resolves the context/global/environment setting
        (default ``"auto"``: never less accurate than the inputs' native GEMM).
    options : dict or mpqr.GemmOptions, optional
        Engine knobs (``slice_k``, ``ozaki_terms``, ``workspace_limit``, ``engine``).

    Returns
    -------
    c : array, shape (M, N)
        Same namespace and device as the inputs. Dtype: NumPy promotion of the
        inputs, with integers computed as float64 and float16 as float32.

    Raises
    ------
    ValueError
        Operands are not 2-D, inner dimensions differ, arrays on different
        devices, or an unknown precision name.
    TypeError
        bool/object dtypes, or arrays from different libraries.
    NotImplementedError
        An engine the backend lacks.

    Notes
    -----
    The engines are 2-D; stacks of matrices are not accepted here. Inputs are
    never modified. NaN and Inf propagate to the outputs they touch.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.arange(6.0).reshape(2, 3); b = np.ones((3, 2))
    >>> mpqr.matmul(a, b, precision="fp32-emulated")
    array([[ 3.,  3.],
           [12., 12.]])
    """
    return _route.call("matmul", _matmul, (a, b), ("a", "b"), precision=precision,
                       options=options)


def _matmul(a: Any, b: Any, precision: str | None, options: Any) -> Any:
    """:func:`matmul` of arrays in memory."""
    a, b = plain_array(a, "a"), plain_array(b, "b")  # numpy.matrix: a plain ndarray
    xp = namespace_of(a, b, names=("a", "b"))
    check_ndim(a, "a", exact=2, what="2-D (the GEMM engines are 2-D)")
    check_ndim(b, "b", exact=2, what="2-D (the GEMM engines are 2-D)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions must match: `a` has shape {tuple(a.shape)} and `b` has shape "
            f"{tuple(b.shape)} ({a.shape[1]} != {b.shape[0]})"
        )
    a = check_dtype(xp, a, "a")
    b = check_dtype(xp, b, "b")
    backend = get_backend(xp)
    with device_errors(backend, "mpqr.matmul"):
        return gemm(a, b, precision=precision, label="matmul", options=options, backend=backend)
