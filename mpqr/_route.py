"""Where a call goes: the one place that looks at what kind of array came in.

The public functions (:func:`mpqr.qr`, :func:`mpqr.lstsq`, :func:`mpqr.svd`,
:func:`mpqr.orth`, :func:`mpqr.matmul`) check the arguments every route shares and hand
the call here. Four routes, tried in this order:

* a ``dask.array.Array`` → :mod:`mpqr.backends.dask` (qr, lstsq);
* a PyTorch tensor or a JAX array → :mod:`mpqr.backends.bridges` (DLPack views run on
  the CuPy or NumPy backend, results handed back in the caller's library);
* a host array with ``device=``, ``out=``, ``memory_budget=`` or ``progress=``, or a
  host dataset that is no Array API array (h5py, zarr) → :mod:`mpqr.ooc` (qr, lstsq);
* any other array → the in-memory route where the array is (:mod:`mpqr.qr.in_memory`,
  :mod:`mpqr.lstsq.in_memory`, or the function's own body for svd, orth and matmul).

Only this module and the package fronts import the public API modules; the routes import
the in-memory factorizations, so no route calls back into a front end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpqr import _fast
from mpqr._validation import plain_array
from mpqr.backends.bridges.dispatch import call as bridge_call
from mpqr.backends.bridges.dispatch import is_foreign
from mpqr.backends.dask._detect import is_dask_array
from mpqr.lstsq import in_memory as lstsq_in_memory
from mpqr.qr import in_memory as qr_in_memory

__all__ = ["call", "lstsq", "qr"]


def qr(x: Any, mode: str, precision: Any, method: str, *, check_finite: bool,
       overwrite_a: bool, device: Any, out: Any, memory_budget: Any, progress: Any,
       pivoting: bool | str, max_rank: Any, rtol: Any) -> Any:
    """:func:`mpqr.qr` on its route (arguments as there, ``pivoting``'s checked)."""
    x = plain_array(x, "x")  # numpy.matrix: a plain ndarray (SciPy's rule), native order
    if not pivoting and device is None and out is None and memory_budget is None \
            and progress is None:  # small inputs: LAPACK directly (mpqr/_fast.py)
        res = _fast.qr(x, mode, precision, method, check_finite)
        if res is not _fast.MISS:
            return res
    if pivoting and (is_dask_array(x) or _host_qr(x, device, out, memory_budget, progress)):
        raise NotImplementedError(
            "qr(pivoting=True) runs on arrays in memory (NumPy, CuPy, ...); it is not "
            "available for Dask arrays, host datasets or with `device`, `out`, "
            "`memory_budget` or `progress`")
    if is_dask_array(x):  # a matrix chunked by rows: the distributed factorization
        from mpqr.backends.dask.qr import qr as dask_qr

        return dask_qr(x, mode, precision, method, check_finite=check_finite,
                       overwrite_a=overwrite_a)
    if is_foreign(x):  # PyTorch/JAX: DLPack views run on the CuPy or NumPy backend
        extra = dict(pivoting=pivoting, max_rank=max_rank, rtol=rtol) if pivoting else {}
        return bridge_call("qr", _qr_viewed, (x,), ("x",), mode=mode,
                           precision=precision, method=method, check_finite=check_finite,
                           overwrite_a=overwrite_a, **extra)
    if _host_qr(x, device, out, memory_budget, progress):
        from mpqr.ooc.driver import qr as host_qr

        return host_qr(x, mode, precision, method, device=device, out=out,
                       memory_budget=memory_budget, progress=progress,
                       check_finite=check_finite, overwrite_a=overwrite_a)
    return qr_in_memory.qr(x, mode, precision, method, check_finite=check_finite,
                           overwrite_a=overwrite_a, pivoting=pivoting, max_rank=max_rank,
                           rtol=rtol)


def _qr_viewed(x: Any, mode: str, precision: Any, method: str, **kw: Any) -> Any:
    """The in-memory QR of a framework array's view, the small-input fast path first, so
    that a tensor gets the same factors as the same data in NumPy/CuPy."""
    if not kw.get("pivoting"):
        res = _fast.qr(x, mode, precision, method, kw.get("check_finite", False))
        if res is not _fast.MISS:
            return res
    return qr_in_memory.qr(x, mode, precision, method, **kw)


def lstsq(a: Any, b: Any, cond: Any, overwrite_a: bool, overwrite_b: bool,
          check_finite: bool, lapack_driver: Any, *, precision: Any, refine: Any, tol: Any,
          maxiter: Any, device: Any, memory_budget: Any, progress: Any
          ) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.lstsq` on its route (arguments as there)."""
    a, b = plain_array(a, "a"), plain_array(b, "b")  # numpy.matrix: a plain ndarray
    if device is None and memory_budget is None and progress is None:
        res = _fast.lstsq(a, b, cond, check_finite, lapack_driver, precision=precision,
                          refine=refine, tol=tol, maxiter=maxiter)
        if res is not _fast.MISS:
            return res
    if is_dask_array(a):  # a matrix chunked by rows: the distributed solver
        from mpqr.backends.dask.lstsq import lstsq as dask_lstsq

        return dask_lstsq(a, b, cond, overwrite_a, overwrite_b, check_finite, lapack_driver,
                          precision=precision, refine=refine, tol=tol, maxiter=maxiter)
    if is_foreign(a, b):  # PyTorch/JAX: DLPack views run on the CuPy or NumPy backend
        return bridge_call("lstsq", _lstsq_viewed, (a, b), ("a", "b"), cond=cond,
                           overwrite_a=overwrite_a, overwrite_b=overwrite_b,
                           check_finite=check_finite, lapack_driver=lapack_driver,
                           precision=precision, refine=refine, tol=tol, maxiter=maxiter)
    if _host_lstsq(a, b, device, memory_budget, progress):
        from mpqr.ooc.lstsq import lstsq as host_lstsq

        prec_name = lstsq_in_memory.check_options(refine, precision, tol, maxiter, cond)
        return host_lstsq(a, b, cond, check_finite, lapack_driver, prec_name=prec_name,
                          refine=refine, tol=tol, maxiter=maxiter, device=device,
                          memory_budget=memory_budget, progress=progress)
    return lstsq_in_memory.lstsq(a, b, cond, overwrite_a, overwrite_b, check_finite,
                                 lapack_driver, precision=precision, refine=refine, tol=tol,
                                 maxiter=maxiter)


def _lstsq_viewed(a: Any, b: Any, cond: Any = None, overwrite_a: bool = False,
                  overwrite_b: bool = False, check_finite: bool = True,
                  lapack_driver: Any = None, **kw: Any) -> tuple[Any, Any, Any, Any]:
    """The in-memory least squares of framework arrays' views, the small-input fast path
    first (as :func:`_qr_viewed`)."""
    res = _fast.lstsq(a, b, cond, check_finite, lapack_driver, **kw)
    if res is not _fast.MISS:
        return res
    return lstsq_in_memory.lstsq(a, b, cond, overwrite_a, overwrite_b, check_finite,
                                 lapack_driver, **kw)


def call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...], names: tuple[str, ...],
         **kwargs: Any) -> Any:
    """``func(*arrays, **kwargs)``, the in-memory body of the public function ``name``
    (svd, orth, matmul: no Dask or host route), on the bridge for foreign arrays."""
    if is_foreign(*arrays):  # PyTorch/JAX: DLPack views run on the CuPy or NumPy backend
        return bridge_call(name, func, arrays, names, **kwargs)
    return func(*arrays, **kwargs)


def _host_qr(x: Any, device: Any, out: Any, memory_budget: Any, progress: Any) -> bool:
    """Whether ``x`` goes to the host-array driver (:mod:`mpqr.ooc.driver`): a host
    input with any of the device keywords, or a host dataset that is no Array API
    array (h5py, zarr). Device arrays with ``out=`` are refused."""
    from mpqr._array_api import is_array_api_obj
    from mpqr.backends.host.arrays import is_host_array

    given = device is not None or out is not None or memory_budget is not None or \
        progress is not None
    if not is_host_array(x) or getattr(x, "ndim", len(getattr(x, "shape", ()))) != 2:
        if out is not None and not is_array_api_obj(x):
            return False  # namespace_of names the bad argument
        if out is not None:
            raise TypeError("`out` is for host inputs (NumPy arrays, memmaps, datasets); "
                            f"got x of type {type(x).__module__}.{type(x).__qualname__}")
        return False
    if given:
        from mpqr.ooc.driver import check_device_args

        check_device_args(device, memory_budget, progress)
        return True
    return not is_array_api_obj(x)


def _host_lstsq(a: Any, b: Any, device: Any, memory_budget: Any, progress: Any) -> bool:
    """Whether the problem goes to the host-array driver (:mod:`mpqr.ooc.lstsq`): 2-D
    host ``a`` and host ``b`` with any of the device keywords, or host datasets that are
    no Array API arrays (h5py, zarr)."""
    from mpqr._array_api import is_array_api_obj
    from mpqr.backends.host.arrays import is_host_array

    if not (is_host_array(a) and is_host_array(b)) or len(a.shape) != 2:
        return False
    if device is not None or memory_budget is not None or progress is not None:
        from mpqr.ooc.driver import check_device_args

        check_device_args(device, memory_budget, progress)
        return True
    return not (is_array_api_obj(a) and is_array_api_obj(b))
