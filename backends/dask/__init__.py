"""Distributed QR and least squares of dask arrays chunked by rows.

``mpqr.qr`` and ``mpqr.lstsq`` come here for a ``dask.array.Array`` (recognised by
:func:`is_dask_array` without importing dask): :mod:`mpqr.backends.dask.qr` factors
it across its row blocks, :mod:`mpqr.backends.dask.lstsq` solves with it (its
refinement in :mod:`mpqr.backends.dask.refine`), :mod:`mpqr.backends.dask._graph` makes
each pass over the blocks one graph and one gather, and :mod:`mpqr.backends.dask.tree`
is the TSQR tree with ``Q``. Each row block's work runs through
mpqr's policy and engines on the worker that holds it (NumPy blocks on CPU workers,
CuPy blocks on GPU workers, e.g. a ``dask_cuda.LocalCUDACluster``). Only these modules
import dask, which is why they live with the backends.
"""

from mpqr.backends.dask._detect import is_dask_array

__all__ = ["is_dask_array"]
