"""GPU kernels compiled ahead for one platform and shipped with mpqr.

A fresh machine spends most of a first call compiling kernels (mpqr's own and the CuPy
element-wise kernels its routes use). For the platform mpqr is built and measured on
(one CuPy version, one NVRTC version, one GPU architecture: :data:`BUNDLE`'s header
says which), the compiled kernels of the recorded list (:mod:`.warmup`) ship in
:data:`BUNDLE`. :func:`install` puts them into CuPy's kernel cache: it runs CuPy's own
cache lookup for each recorded kernel with the compiler step answered from the bundle,
so CuPy computes the cache key and writes the entry exactly as it would after compiling.

A kernel is taken from the bundle only where everything the compiler would read is the
same: CuPy's version, NVRTC's version, the device's architecture, the source text (an
edited ``.cu`` file no longer matches its bundled binary), the options and arguments.
Anything else compiles as before (:func:`~.warmup.warm`). Like :mod:`.warmup`, this
reaches into CuPy's compiler module (``_compile_using_nvrtc_no_warning``,
``_compile_module_with_cache``); a CuPy without them installs nothing.

The bundle is made on the platform itself: ``python -m mpqr warmup --pack PATH`` compiles
every recorded kernel into an empty cache and stores what NVRTC returned.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gzip
import hashlib
import json
import multiprocessing
import os
import struct
import time
from pathlib import Path
from typing import Any

__all__ = ["BUNDLE", "entry_key", "install", "pack", "platform", "read", "write"]

#: the kernels compiled ahead for the platform named in its header
BUNDLE = Path(__file__).resolve().parent / "data" / "cupy_kernels_prebuilt.bin.gz"
_MAGIC = b"MPQRKB01"


def platform() -> dict[str, Any]:
    """What a bundled kernel must have been compiled for: CuPy's and NVRTC's versions and
    the current device's architecture (as CuPy names it, e.g. ``"90"``)."""
    import cupy
    from cupy.cuda import compiler

    return {"cupy": cupy.__version__, "nvrtc": list(compiler._get_nvrtc_version()),
            "arch": str(compiler._get_arch())}


def entry_key(entry: dict[str, Any]) -> str:
    """A recorded kernel's identity: its source text as compiled now (``entry["text"]``,
    mpqr's ``.cu`` files read again by the caller), its options and its arguments."""
    text = json.dumps({"source": entry["text"], "options": list(entry["options"]),
                       "kwargs": entry["kwargs"]}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write(path: str | os.PathLike, header: dict[str, Any],
          kernels: dict[str, tuple[bytes, dict[str, str] | None]]) -> None:
    """Store ``kernels`` (key -> (binary, name mapping)) under ``header`` (gzipped)."""
    index, blobs, at = {}, [], 0
    for key in sorted(kernels):
        binary, mapping = kernels[key]
        index[key] = {"at": at, "size": len(binary), "mapping": mapping}
        blobs.append(binary)
        at += len(binary)
    head = json.dumps({**header, "kernels": index}, sort_keys=True).encode("utf-8")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(_MAGIC + struct.pack("<I", len(head)) + head)
        for b in blobs:
            f.write(b)


def read(path: str | os.PathLike = BUNDLE
         ) -> tuple[dict[str, Any], dict[str, tuple[bytes, dict[str, str] | None]]]:
    """``(header, kernels)`` of a bundle written by :func:`write`."""
    data = gzip.decompress(Path(path).read_bytes())
    if data[:8] != _MAGIC:
        raise ValueError(f"{path} is not a kernel bundle of this format")
    (n,) = struct.unpack_from("<I", data, 8)
    head = json.loads(data[12:12 + n])
    body = memoryview(data)[12 + n:]
    kernels = {k: (bytes(body[v["at"]:v["at"] + v["size"]]), v["mapping"])
               for k, v in head.pop("kernels").items()}
    return head, kernels


@contextlib.contextmanager
def _compiler_answer(answer: Any):
    """CuPy's NVRTC step replaced by ``answer(source, options, ...)`` while active."""
    from cupy.cuda import compiler

    inner = compiler._compile_using_nvrtc_no_warning
    compiler._compile_using_nvrtc_no_warning = lambda *a, **k: answer(inner, *a, **k)
    try:
        yield
    finally:
        compiler._compile_using_nvrtc_no_warning = inner


def _cupy_core() -> Any:
    from cupy._core import core

    return core


def _through_cache(entry: dict[str, Any]) -> None:
    """CuPy's compile-with-cache call for a recorded kernel, as :mod:`.warmup` makes it."""
    from cupy.cuda import compiler

    core = _cupy_core()
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in entry["kwargs"].items()}
    options = core.assemble_cupy_compiler_options(tuple(entry["options"]))
    compiler._compile_module_with_cache(entry["text"], options,
                                        extra_source=core._get_header_source(), **kw)


def _compile_kept(entry: dict[str, Any]) -> tuple[str, bytes, dict[str, str] | None]:
    """In a worker with an empty cache: compile one recorded kernel, keep NVRTC's output."""
    kept: list[Any] = []

    def answer(inner: Any, *args: Any, **kw: Any) -> Any:
        out = inner(*args, **kw)
        kept.append(out)
        return out

    with _compiler_answer(answer):
        _through_cache(entry)
    if len(kept) != 1:
        raise RuntimeError(f"expected one compilation, saw {len(kept)} (a warm cache?)")
    binary, mapping = kept[0]
    return entry_key(entry), bytes(binary), (dict(mapping) if mapping else None)


def pack(path: str | os.PathLike, entries: list[dict[str, Any]],
         processes: int | None = None) -> dict[str, Any]:
    """Compile ``entries`` (a recorded kernel list, each with its source ``"text"``) in
    worker processes, each into an
    empty kernel cache, and write the bundle to ``path``. Returns counts and bytes."""
    import tempfile

    os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="mpqr-pack-")  # the workers'
    procs = max(1, min(processes or min(os.cpu_count() or 1, 16), len(entries)))
    kernels: dict[str, tuple[bytes, dict[str, str] | None]] = {}
    failed = 0
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        for fut in cf.as_completed([pool.submit(_compile_kept, e) for e in entries]):
            try:
                key, binary, mapping = fut.result()
            except Exception:  # counted; that kernel compiles on first use
                failed += 1
                continue
            kernels[key] = (binary, mapping)
    write(path, platform(), kernels)
    return {"kernels": len(kernels), "failed": failed,
            "bytes": sum(len(b) for b, _ in kernels.values()),
            "file_bytes": Path(path).stat().st_size}


def install(entries: list[dict[str, Any]], path: str | os.PathLike = BUNDLE
            ) -> dict[str, Any]:
    """Put the bundled binaries of ``entries`` (recorded kernels, each with its source
    ``"text"`` as it reads now) into CuPy's kernel cache (in this process,
    on the current device). Returns ``installed`` (the indices into ``entries``),
    ``seconds`` and ``skipped`` (why nothing was installed, or None)."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"installed": set(), "seconds": 0.0, "skipped": None,
                           "platform": None}
    try:
        header, kernels = read(path)
    except (OSError, ValueError) as exc:
        out["skipped"] = f"no prebuilt kernels ({type(exc).__name__})"
        return out
    try:
        here = platform()
    except ImportError:
        out["skipped"] = "CuPy is not installed"
        return out
    except Exception as exc:  # a CuPy whose compiler module differs
        out["skipped"] = f"CuPy's compiler module differs ({type(exc).__name__})"
        return out
    want = {k: header.get(k) for k in here}
    if want != here:
        out["skipped"] = (f"the prebuilt kernels are for {_name(want)}, this is "
                          f"{_name(here)}")
        return out
    out["platform"] = _name(here)
    for i, entry in enumerate(entries):
        found = kernels.get(entry_key(entry))
        if found is None:
            continue
        binary, mapping = found

        def answer(inner: Any, *args: Any, _b: bytes = binary,
                   _m: dict[str, str] | None = mapping, **kw: Any) -> Any:
            return _b, (dict(_m) if _m else None)

        try:
            with _compiler_answer(answer):
                _through_cache(entry)
        except Exception:  # that kernel compiles as before
            continue
        out["installed"].add(i)
    out["seconds"] = time.perf_counter() - t0
    return out


def _name(p: dict[str, Any]) -> str:
    nv = p.get("nvrtc") or ["?"]
    return f"CuPy {p.get('cupy')}, NVRTC {'.'.join(map(str, nv))}, sm_{p.get('arch')}"
