"""The module paths of earlier releases, kept importable.

``mpqr.backends.numpy_backend``, ``mpqr.backends.bridge``, ``mpqr.tools.bench_qr``, ...
resolve to the modules that now hold the code: the same module object, so its names,
an entry point naming the old path (``mpqr.backends.numpy_backend:NumpyBackend``) and
a patch of one of its attributes all keep working. Importing this module installs the
finder; nothing else is imported until an old path is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__all__ = ["ALIASES", "install"]

_CUPY = ("chol_steps", "engine_kernels", "geqrf", "gram_dd", "int8_lt", "lane", "lu",
         "modules", "ozaki_kernels", "panel_cholqr", "qrcp", "right_solve", "staging",
         "tsqr", "warmup")
_BENCH = ("accuracy", "bridge", "dask", "gemm", "lstsq", "ooc", "qr", "tsqr")

#: old module path -> the module that holds its code now (None: a package of old paths only)
ALIASES: dict[str, str | None] = {
    "mpqr.backends.numpy_backend": "mpqr.backends.numpy.backend",
    "mpqr.backends._numpy_types": "mpqr.backends.numpy.types",
    "mpqr.backends.cupy_backend": "mpqr.backends.cupy.backend",
    **{f"mpqr.backends.cupy_{m}": f"mpqr.backends.cupy.{m}" for m in _CUPY},
    "mpqr.backends.triton_gemm": "mpqr.backends.cupy.triton_gemm",
    "mpqr.backends.triton_kernels": "mpqr.backends.cupy.triton_kernels",
    "mpqr.backends.bridge": "mpqr.backends.bridges.dispatch",
    "mpqr.backends.bridge_torch": "mpqr.backends.bridges.torch",
    "mpqr.backends.bridge_jax": "mpqr.backends.bridges.jax",
    "mpqr.backends.staging": "mpqr.backends.host.staging",
    "mpqr.backends.host_blas": "mpqr.backends.host.blas",
    "mpqr.tools": None,
    **{f"mpqr.tools.bench_{m}": f"mpqr.bench.{m}" for m in _BENCH},
    "mpqr.tools._charts": "mpqr.bench._charts",
    "mpqr.tools._timing": "mpqr.bench._timing",
    "mpqr.tools.render_results": "mpqr.bench.render_results",
    "mpqr.tools.demo": "mpqr.cli.demo",
    "mpqr.tools.warmup": "mpqr.cli.warmup",
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old path with the module of its new one."""

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in ALIASES:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=ALIASES[name] is None)

    def create_module(self, spec: Any) -> Any:
        if ALIASES[spec.name] is None:
            return None  # the import system makes the (empty) package
        module = importlib.import_module(ALIASES[spec.name])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # the import system set the old path's spec on the module: give it its own back
        if module.__spec__.name in self._specs:
            module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
