"""Distributed QR and least squares of dask arrays chunked by rows.

``mpqr.qr`` and ``mpqr.lstsq`` come here for a ``dask.array.Array`` (recognised by
:func:`is_dask_array` without importing dask); each row block's work runs through
mpqr's policy and engines on the worker that holds it (NumPy blocks on CPU workers,
CuPy blocks on GPU workers, e.g. a ``dask_cuda.LocalCUDACluster``).
"""

from mpqr.dask._detect import is_dask_array

__all__ = ["is_dask_array", "lstsq", "qr"]


def __getattr__(name: str):
    # dask itself is imported only when a distributed function is used
    if name == "qr":
        from mpqr.dask.qr import qr

        return qr
    if name == "lstsq":
        from mpqr.dask.lstsq import lstsq

        return lstsq
    raise AttributeError(name)
