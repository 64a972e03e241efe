"""mpqr's own CUDA kernels (``backends/cupy/kernels/*.cu``), compiled by CuPy per template
instantiation.

Every kernel module of the CuPy backend builds its functions here: one NVRTC program per
``(file, instantiations)``, C++17, compiled on first use and kept in CuPy's on-disk cache
(``python -m mpqr warmup`` compiles the recorded ones ahead; it finds the sources by
file name in the same folder).
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy as cp

__all__ = ["KERNELS", "ctype", "functions"]

#: the folder of the ``.cu`` sources
KERNELS = Path(__file__).resolve().parent / "kernels"


def ctype(dtype_name: str) -> str:
    """The C type of a float32/float64 NumPy dtype name."""
    return {"float32": "float", "float64": "double"}[dtype_name]


@functools.cache
def functions(filename: str, names: tuple[str, ...], after: tuple[str, ...] = ()) -> tuple:
    """The kernels ``names`` (template instantiations, as C++ expressions) of
    ``KERNELS / filename``, compiled together; ``after``: more sources appended to it
    (kernels built on its helpers, which leave its text, and so its prebuilt binaries,
    as they are)."""
    code = "".join((KERNELS / f).read_text() for f in (filename, *after))
    mod = cp.RawModule(code=code, options=("--std=c++17",), name_expressions=list(names))
    return tuple(mod.get_function(n) for n in names)
