"""``mpqr.qr`` on host arrays: in core when the working set fits the device-memory
budget, out of core otherwise (:mod:`mpqr.ooc.tall`, :mod:`mpqr.ooc.square`).

Host arrays are NumPy arrays, ``numpy.memmap`` or any object with ``shape``, ``dtype``
and NumPy-style slicing (h5py, zarr); results are host arrays, written into the
caller's ``out=`` arrays when given. The input is only ever read.
"""

from __future__ import annotations

from typing import Any

from mpqr.ooc.budget import (
    BudgetTooSmall,
    format_bytes,
    resolve_budget,
    staging_rows,
    tall_plan,
)
from mpqr.ooc.run import Run, progress_bar
from mpqr.policy import record_event, resolve_precision, validate_precision

__all__ = ["IN_CORE_FACTOR", "OOC_METHODS", "SQUARE_AUTO", "TALL_RATIO", "qr"]

#: methods that only exist out of core
OOC_METHODS = ("tsqr", "ooc-recursive", "ooc-blocked")
#: in-core working set of a QR in units of the input's bytes (input, Q, workspace)
IN_CORE_FACTOR = 3
#: rows per column from which the out-of-core driver streams row pieces (tall-skinny)
TALL_RATIO = 16
#: the square route ``method="auto"`` takes: with every leaf reprojected against all
#: earlier columns both variants take about the same time (65536^2 float32, fp16, 4 GB
#: budget: recursive 48.5 s, blocked 50.0 s, H200; `python -m mpqr bench ooc --rows
#: square`); the recursive one moves 23% fewer bytes
SQUARE_AUTO = "ooc-recursive"
#: host-link rate assumed by the progress bar's estimate (pinned copies, H100)
_LINK_RATE = 25e9


def check_device_args(device: Any, memory_budget: Any, progress: Any) -> None:
    """Validate the out-of-core keywords before any work (the api modules' branch); the
    call's start and its backend's resolution are timed for the trace (a first call
    imports and starts the device here)."""
    import time

    t0 = time.perf_counter()
    from mpqr.backends.host.arrays import device_backend
    from mpqr.ooc.budget import parse_budget
    from mpqr.ooc.run import call_started

    device_backend(device)
    call_started(t0, time.perf_counter() - t0)
    if memory_budget is not None:
        parse_budget(memory_budget)
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"`progress` must be None, True or False, got {progress!r}")


def _outs(out: Any, mode: str, qshape: tuple[int, int], rshape: tuple[int, int], dtype: Any
          ) -> tuple[Any, Any]:
    from mpqr.backends.host import arrays as host

    if out is None:
        return None, None
    if mode == "r":
        return None, host.check_out(out, "out", rshape, dtype)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(f"`out` must be a pair (Q, R) of host arrays (either may be None) for "
                        f"mode={mode!r}, got {type(out).__name__}")
    q, r = out
    return (None if q is None else host.check_out(q, "out[0] (Q)", qshape, dtype),
            None if r is None else host.check_out(r, "out[1] (R)", rshape, dtype))


def qr(x: Any, mode: str, precision: Any, method: str, *, device: Any, out: Any,
       memory_budget: Any, progress: Any, check_finite: bool, overwrite_a: bool) -> Any:
    """:func:`mpqr.qr` for a host array (see there); validation first, then the route."""
    from mpqr._validation import check_choice
    from mpqr.backends.host import arrays as host
    from mpqr.qr.driver import METHODS
    from mpqr.qr.in_memory import MODE_HINTS, MODES, QRResult

    backend = host.device_backend(device)
    src = host.HostArray(x, "x")
    if src.vector:
        raise ValueError("`x` must be 2-D, got ndim=1")
    check_choice(mode, "mode", MODES, MODE_HINTS)
    check_choice(method, "method", ("auto", *sorted(METHODS), *OOC_METHODS))
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    m, n = src.shape
    k = min(m, n)
    if src.dtype.kind == "c" and prec_name in ("fp16", "fp32-emulated", "fp64-emulated"):
        raise NotImplementedError(
            f"precision={prec_name!r} is not supported for complex input ({src.dtype}): the "
            "emulated engines are real-only; use precision 'auto', 'fp32' or 'fp64'")
    want_q = mode != "r"
    qshape = (m, m) if mode == "complete" else (m, k)
    rshape = (m, n) if mode == "complete" else (k, n)
    q_out, r_out = _outs(out, mode, qshape, rshape, src.dtype)
    budget, source = resolve_budget(memory_budget, backend)
    # the input staged onto the device and the in-core route's leanest plan beside it
    working = _in_core_bytes(backend, src, method, prec_name, mode)
    in_core = method not in OOC_METHODS and (budget is None or working <= budget)
    if in_core:
        record_event("out-of-core", f"qr: in core on {backend.name}: the working set "
                     f"(~{format_bytes(working)}) fits the device-memory budget "
                     f"({'none' if budget is None else format_bytes(budget)}, {source})",
                     route="in-core", budget=budget, working_set=working)
        try:
            q, r = _in_core(backend, src, mode, precision, method, check_finite,
                            overwrite_a, budget)
        except MemoryError as exc:
            # the device had less free than the budget said (other work on it): out of
            # core where that route takes the call, from the untouched host input
            free = getattr(exc, "free", None)
            if (mode == "complete" and m != n) or m < n or budget is None or \
                    backend.device_memory_free() is None:
                raise
            in_core = False
            budget = min(budget, free // 2) if free else budget // 2
            source = "half the free device memory (the in-core plan did not fit)"
            record_event("out-of-core", f"qr: the in-core plan did not fit the device "
                         f"({getattr(exc, 'needed', None) or 0:,} bytes needed, "
                         f"{free or 0:,} free): out of core with a budget of "
                         f"{format_bytes(budget)}", route="out-of-core", budget=budget)
    if not in_core:
        if mode == "complete" and m != n:
            raise NotImplementedError(
                f"mode='complete' is not supported out of core for a {m} x {n} matrix (Q "
                f"would be {m} x {m}); use mode='reduced' or raise `memory_budget`")
        if m < n:
            raise NotImplementedError(
                f"out-of-core QR needs at least as many rows as columns, got {m} x {n}; "
                "factor the transpose, or raise `memory_budget`")
        ooc = "auto" if method not in ("auto", "cholqr2", "shifted-cholqr3", *OOC_METHODS) \
            else method
        if ooc != method:
            record_event("method", f"qr: {method} runs in core only; out of core the "
                         "method is chosen automatically", method=method)
        q, r = _out_of_core(backend, src, ooc, precision, prec_name, want_q, q_out,
                            "`x` must not contain infs or NaNs (check_finite=True)"
                            if check_finite else None, budget, source, progress,
                            overwrite_a)
    if r_out is not None:
        r_out[...] = r
        r = r_out
    if not want_q:
        return r
    if q_out is not None and q is not q_out:
        q_out[...] = q
        q = q_out
    return QRResult(q, r)


def _in_core_bytes(backend: Any, src: Any, method: str, prec_name: str, mode: str) -> int:
    """Device bytes of the in-core route for a host input: the input staged onto the
    device and the estimate of its leanest plan (:mod:`mpqr.qr.memory_plan`), at least
    :data:`IN_CORE_FACTOR` times the input where no estimate applies."""
    from mpqr.qr import memory_plan
    from mpqr.qr.choice import choose_method

    m, n = src.shape
    nbytes = m * n * src.itemsize
    if method in OOC_METHODS:
        return IN_CORE_FACTOR * nbytes
    dtype = getattr(backend.xp, src.dtype.name)
    if method == "auto":
        method, _ = choose_method(backend, prec_name, dtype, m, n,
                                  complete=mode == "complete")
    return nbytes + memory_plan.least_bytes(method, prec_name, (m, n), src.itemsize,
                                            complete=mode == "complete")


def _in_core(backend: Any, src: Any, mode: str, precision: Any, method: str,
             check_finite: bool, overwrite_a: bool, budget: int | None) -> tuple[Any, Any]:
    """The whole matrix on the device (staged in pieces), the in-core QR, results back."""
    from mpqr.backends.host import arrays as host
    from mpqr.qr.in_memory import qr as qr_in_core

    m, n = src.shape
    if backend.name == "numpy":
        a = src.x if host.in_memory(src.x) else src.read(0, m, 0, n)
        res = qr_in_core(a, mode=mode, precision=precision, method=method,
                         check_finite=check_finite, overwrite_a=overwrite_a)
        return (None, res) if mode == "r" else (res.Q, res.R)
    xp = backend.xp
    rows = staging_rows(m, n, src.itemsize, budget)
    regions = [(r0, min(m, r0 + rows), 0, n) for r0 in range(0, m, rows)]
    st = backend.host_staging(src.dtype, rows * n)
    run = Run(backend, st, None, "qr")
    try:
        a = xp.empty((m, n), dtype=getattr(xp, src.dtype.name))
        for (r0, r1, _c0, _c1), blk in run.over(src, regions, "x"):
            a[r0:r1] = blk
        res = qr_in_core(a, mode=mode, precision=precision, method=method,
                         check_finite=check_finite, overwrite_a=True)
        del a
        if mode == "r":
            return None, host.to_host(res)
        return host.to_host(res.Q), host.to_host(res.R)
    finally:
        run.close()


def _out_of_core(backend: Any, src: Any, method: str, precision: Any, prec_name: str,
                 want_q: bool, q_out: Any, check: str | None, budget: int, source: str,
                 progress: Any, overwrite_a: bool) -> tuple[Any, Any]:
    """The out-of-core QR; a device out-of-memory error mid-way retries once with pieces
    of half the budget, then raises a MemoryError saying what to change."""
    from mpqr.backends.host import arrays as host

    m, n = src.shape
    q_host = q_out if q_out is not None else (host.empty((m, n), src.dtype) if want_q else None)
    q_dst = host.HostArray(q_host, "out") if q_host is not None else None
    tries = (budget, budget // 2)
    for attempt, b in enumerate(tries):
        try:
            r = _ooc_once(backend, src, method, precision, prec_name, want_q, q_dst, check,
                          b, source, progress, overwrite_a)
            return q_host, r
        except MemoryError as exc:
            if isinstance(exc, BudgetTooSmall):
                raise
            if attempt == len(tries) - 1:
                raise MemoryError(
                    f"mpqr.qr: out of device memory twice out of core (memory_budget "
                    f"{format_bytes(budget)}, then {format_bytes(b)}): other allocations on "
                    "the device leave less free than the budget; pass a smaller "
                    "`memory_budget` or free device memory") from None
            record_event("retry", f"qr: out of device memory mid-way ({exc}); retrying once "
                         f"with pieces for half the budget ({format_bytes(tries[1])})",
                         budget=tries[1])
        except BudgetTooSmall:
            raise
    raise AssertionError("unreachable")


def _ooc_once(backend: Any, src: Any, method: str, precision: Any, prec_name: str,
              want_q: bool, q_dst: Any, check: str | None, budget: int, source: str,
              progress: Any, overwrite_a: bool) -> Any:
    from mpqr.backends.host import arrays as host
    from mpqr.ooc import gram_route, square, tall

    m, n = src.shape
    tall_shape = m >= TALL_RATIO * n
    auto = method == "auto"
    if auto:
        method = ("cholqr2" if want_q else "tsqr") if tall_shape else SQUARE_AUTO
    isz = src.itemsize
    if method in tall.TALL_METHODS:
        plan = tall_plan(m, n, isz, budget)
        reads = tall.TALL_METHODS[method][0 if want_q else 1]
        total = (reads + (1 if want_q else 0)) * m * n * isz
        bar = progress_bar(progress, total, total / _LINK_RATE, "mpqr.qr")
        st = backend.host_staging(src.dtype, plan.block_elems)
        run = Run(backend, st, bar, "qr")
        try:
            def cholqr(first_gram: Any = None) -> Any:
                return tall.tall_qr(run, src, plan, method=method, auto=auto,
                                    precision=precision, prec_name=prec_name, want_q=want_q,
                                    q_out=q_dst, check=check, first_gram=first_gram)

            if auto and want_q and gram_route.applies(backend, src.dtype, prec_name):
                r, method = gram_route.two_read_qr(run, src, plan, gram_prec=precision,
                                                   prec_name=prec_name, q_out=q_dst,
                                                   check=check, fallback=cholqr)
            else:
                r = cholqr()
            r = host.to_host(r)
            run.finish(f"out of core ({method} by row pieces of {plan.rows} x {n}, "
                       f"{format_bytes(plan.piece_bytes)} each; budget "
                       f"{format_bytes(budget)} from {source})", route="out-of-core",
                       method=method, piece_rows=plan.rows, budget=budget)
        finally:
            run.close()
        return r
    return square.square_qr(backend, src, method=method, precision=precision,
                            prec_name=prec_name, want_q=want_q, q_dst=q_dst, check=check,
                            budget=budget, source=source, progress=progress,
                            overwrite_a=overwrite_a)

