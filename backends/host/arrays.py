"""Host-side arrays of the out-of-core driver: inputs and outputs that stay in host
memory (NumPy arrays, ``numpy.memmap``, and any object with ``shape``, ``dtype`` and
NumPy-style slicing, such as h5py or zarr datasets).

The algorithms never touch a host array directly: they name row/column ranges and
the staging (:mod:`mpqr.backends.host.staging`) copies them to and from the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["HostArray", "check_out", "device_backend", "empty", "in_memory", "is_host_array",
           "result_dtype", "to_host"]


def is_host_array(x: Any) -> bool:
    """True for a 2-D host dataset: a NumPy array or anything with ``shape``, ``dtype``
    and ``__getitem__`` that is not a device array (CuPy and friends have ``__dlpack__``
    on a non-CPU device; NumPy arrays are checked first)."""
    if isinstance(x, np.ndarray):
        return True
    if not all(hasattr(x, a) for a in ("shape", "dtype", "__getitem__")):
        return False
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) == 1  # kDLCPU
        except Exception:  # an odd object is simply not a host array
            return False
    return True


def in_memory(x: Any) -> bool:
    """A NumPy array in memory (not a memmap): the in-core route can take it as is."""
    return isinstance(x, np.ndarray) and not isinstance(x, np.memmap)


def result_dtype(dtype: Any, name: str) -> Any:
    """The working dtype of a host input, by ``mpqr.qr``'s rules (integers to float64,
    float16 to float32; bool and non-numeric refused)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        raise TypeError(f"`{name}` must have a floating or integer dtype, got bool")
    if dt.kind in "iu":
        return np.dtype(np.float64)
    if dt.kind == "f":
        return np.dtype(np.float32) if dt.itemsize < 4 else dt
    if dt.kind == "c":
        return dt
    raise TypeError(f"`{name}` must have a floating or integer dtype, got {dt}")


class HostArray:
    """A 2-D host array seen through its ranges; ``dtype`` is the working dtype."""

    def __init__(self, x: Any, name: str, dtype: Any = None):
        shape = tuple(int(s) for s in x.shape)
        if len(shape) not in (1, 2):
            raise ValueError(f"`{name}` must be 2-D out of core, got ndim={len(shape)}")
        self.vector = len(shape) == 1  # a vector is seen as one column
        self.x, self.name = x, name
        self.shape = (shape[0], 1) if self.vector else shape
        self.dtype = np.dtype(dtype) if dtype is not None else result_dtype(x.dtype, name)
        self.itemsize = self.dtype.itemsize

    def read(self, r0: int, r1: int, c0: int, c1: int, into: Any = None) -> Any:
        """A fresh copy of ``x[r0:r1, c0:c1]`` in the working dtype (into ``into``)."""
        if not (0 <= r0 <= r1 <= self.shape[0] and 0 <= c0 <= c1 <= self.shape[1]):
            raise IndexError(f"rows {r0}:{r1}, columns {c0}:{c1} are outside `{self.name}` "
                             f"of shape {self.shape}")
        src = self.x[r0:r1][:, None] if self.vector else self.x[r0:r1, c0:c1]
        if into is None:
            return np.array(src, dtype=self.dtype, copy=True, order="C")
        np.copyto(into, src, casting="unsafe")
        return into

    def write(self, r0: int, r1: int, c0: int, c1: int, block: Any, add: bool = False
              ) -> None:
        """``x[r0:r1, c0:c1] = block`` (``+= block`` with ``add``)."""
        if self.vector:
            if add:
                self.x[r0:r1] += block[:, 0]
            else:
                self.x[r0:r1] = block[:, 0]
        elif add:
            self.x[r0:r1, c0:c1] += block
        else:
            self.x[r0:r1, c0:c1] = block


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """A host result array (NumPy)."""
    return np.empty(shape, dtype=dtype)


def to_host(x: Any) -> Any:
    """A device or host array as a NumPy array (small results: R, x, s)."""
    if isinstance(x, np.ndarray):
        return x
    get = getattr(x, "get", None)  # CuPy
    return get() if get is not None else np.asarray(x)


def check_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
    """``out`` if it is a writable host array of ``shape`` and ``dtype``; a clear
    ``ValueError``/``TypeError`` naming ``name`` otherwise (before any work)."""
    if not is_host_array(out):
        raise TypeError(f"`{name}` must be a host array (NumPy array, numpy.memmap or a "
                        f"dataset with NumPy-style slicing), got {type(out).__name__}")
    got = tuple(int(s) for s in out.shape)
    if got != tuple(shape):
        raise ValueError(f"`{name}` must have shape {tuple(shape)}, got {got}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise ValueError(f"`{name}` must have dtype {np.dtype(dtype)}, got {np.dtype(out.dtype)}")
    flags = getattr(out, "flags", None)
    if flags is not None and not flags.writeable:
        raise ValueError(f"`{name}` is read-only; pass a writable array (a memmap opened "
                         "with mode 'r+' or 'w+')")
    return out


def device_backend(name: str | None) -> Any:
    """The backend that computes for ``device=name``: ``None``/``"cpu"`` NumPy (the
    host), ``"cuda"``/``"cuda:<i>"`` CuPy on that GPU."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    if name is None or name == "cpu":
        return get_backend(array_namespace(np.empty(0)))
    if not (isinstance(name, str) and (name == "cuda" or name.startswith("cuda:"))):
        raise ValueError(f"`device` must be None, 'cpu', 'cuda' or 'cuda:<index>'; got {name!r}")
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f"device={name!r} needs CuPy (pip install mpqr[cuda12])") from exc
    if name.startswith("cuda:"):
        cupy.cuda.Device(int(name[5:])).use()
    return get_backend(array_namespace(cupy.empty(0)))
