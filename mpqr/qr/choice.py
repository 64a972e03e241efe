"""How ``qr(method="auto")`` chooses a method, and at which precision it factors."""

from __future__ import annotations

from typing import Any

__all__ = [
    "CHOLQR_PRECISIONS",
    "NATIVE_PRECISIONS",
    "OWN_PRECISION_CHOLQR",
    "TALL_RATIO",
    "choose_method",
    "factor_precision",
    "library_meets_emulated",
    "own_precision_meets",
    "precision_of",
    "small_library_route",
    "stack_table_route",
    "tall_products_precision",
]

#: ``method="auto"`` takes CholQR2 for single matrices with ``m >= TALL_RATIO * n``
TALL_RATIO = 16
#: precisions whose Gram matrix is formed in the working precision (the certificate's
#: threshold assumes it); fp16 and fp32-emulated run CholQR2 in the input's own instead
CHOLQR_PRECISIONS = ("auto", "fp32", "fp64", "fp64-emulated")
#: precisions whose tall-skinny QR runs CholQR2 in the input's own precision instead (its
#: fp16-based Gram matrices would square the condition number at 11 bits)
OWN_PRECISION_CHOLQR = ("fp16", "fp32-emulated")
#: precisions whose engines keep the input's exponent range (native GEMMs, or the INT8
#: Ozaki engine's exact per-line scaling): no fp16 range to respect, so columns are
#: scaled only where a Gram matrix or a norm could over- or underflow
NATIVE_PRECISIONS = ("auto", "fp32", "fp64", "fp64-emulated")


def _in_working_precision(backend: Any, prec_name: str, dtype: Any) -> bool:
    """Whether ``prec_name`` asks for nothing but the input dtype's own arithmetic
    (fp64-emulated included: it runs native DGEMM wherever emulation does not pay)."""
    xp = backend.xp
    double = dtype in (xp.float64, xp.complex128)
    single = dtype in (xp.float32, xp.complex64)
    return (prec_name == "auto" or (prec_name in ("fp64", "fp64-emulated") and double)
            or (prec_name == "fp32" and single))


def _own_precision(backend: Any, dtype: Any) -> str:
    """The precision name of the input dtype's own arithmetic (``fp32`` or ``fp64``)."""
    xp = backend.xp
    return "fp32" if dtype in (xp.float32, xp.complex64) else "fp64"


def factor_precision(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                     batch: int = 1) -> str:
    """The precision ``qr(method="auto")`` factors an ``m x n`` input at: the input's own
    (``fp32``/``fp64``) where :func:`choose_method` gives an ``fp16``/``fp32-emulated``
    request to CholQR2 or the library's QR in it, else ``prec_name``. ``mpqr.lstsq``
    sizes its rank decisions and Gram route by it."""
    if prec_name not in OWN_PRECISION_CHOLQR or 0 in (m, n):
        return prec_name
    return precision_of(backend, prec_name, dtype,
                         choose_method(backend, prec_name, dtype, m, n, batch=batch)[0])


def precision_of(backend: Any, prec_name: str, dtype: Any, method: str) -> str:
    """The precision an auto-chosen ``method`` factors a ``prec_name`` request at."""
    if prec_name in OWN_PRECISION_CHOLQR and method in ("cholqr2", "geqrf",
                                                         "householder-batched",
                                                         "householder-batched-blocked"):
        return _own_precision(backend, dtype)
    return prec_name


def tall_products_precision(backend: Any, prec_name: str, dtype: Any, m: int, n: int
                            ) -> tuple[str, str] | None:
    """``(precision, why)`` for the products over ``x`` of a CholQR2 that an
    ``fp32-emulated`` or ``fp16`` request runs in float32 (:func:`precision_of`):
    ``fp32-emulated`` (tc-sgemm: split-FP16 products, FP32-accurate, so at least as
    accurate as either request) where the policy predicts its
    ``n x n`` Gram product (inner dimension ``m``) faster than native float32's, else
    None (the products native; also under a ``workspace_limit``, which a memory plan
    short of room sets: the engine splits ``x`` whole for its Gram call). Real 2-D float32
    only; the ``n x n`` steps stay float32."""
    from mpqr.engines import ENGINES
    from mpqr.policy import active_gemm_options, as_gemm_options, decide

    xp = backend.xp
    if prec_name not in ("fp32-emulated", "fp16") or dtype != xp.float32 or not m or not n:
        return None
    req = "fp32-emulated"
    active = active_gemm_options()
    if active is not None and active.workspace_limit is not None:
        return None  # a capped plan (the memory plan's tiles): the split copies would not fit
    if not ENGINES["tc-sgemm"].available(backend):
        return None
    opts = as_gemm_options(None)
    emu = decide(backend, dtype, n, n, m, 1, req, "qr", opts)
    own = decide(backend, dtype, n, n, m, 1, "fp32", "qr", opts)
    t_emu, t_own = emu.predicted_s[emu.engine], own.predicted_s[own.engine]
    if not t_emu < t_own:
        return None
    asked = "" if req == prec_name else f", for precision={prec_name!r}"
    return req, (
        f"cholqr2: its Gram products and the products of its R^-1 applications over x at "
        f"precision={req!r}{asked} ({emu.engine}: split-FP16 products, FP32-accurate; "
        f"predicted {t_emu * 1e3:.3g} ms for the {n} x {n} Gram against {t_own * 1e3:.3g} ms "
        f"native float32), its n x n steps in float32")


def _covers_precision(backend: Any, prec_name: str, dtype: Any) -> bool:
    """Whether the input dtype's own arithmetic is at least as accurate as ``prec_name``."""
    xp = backend.xp
    if dtype in (xp.float64, xp.complex128):
        return True
    return dtype in (xp.float32, xp.complex64) and prec_name in ("fp16", "fp32-emulated",
                                                                 "fp32", "auto")


def own_precision_meets(backend: Any, prec_name: str, dtype: Any) -> bool:
    """Whether the input dtype's own arithmetic is at least as accurate as ``prec_name``
    (float64/complex128: every request; float32/complex64: ``"fp16"``,
    ``"fp32-emulated"``, ``"fp32"`` and ``"auto"``)."""
    return _covers_precision(backend, prec_name, dtype)


def small_library_route(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                        batch: int = 1) -> str:
    """Why a single small matrix takes the library's QR in its own precision, or ``""``.

    At most ``backend.small_max`` elements (0 < ``m n``), a request the input dtype's own
    arithmetic meets (a precision request is a request for accuracy: float64 meets
    ``"fp32"``, ``"fp64"`` and ``"fp64-emulated"``, float32 ``"fp32"``; ``"auto"``
    either): the library's QR is the fastest route that meets it, as mpqr's methods
    would add passes and launches to the same small work. The tensor-core requests
    (``"fp16"``, ``"fp32-emulated"``) keep the rules below (tall-skinny ones take the
    library's QR there too). The small-input fast path (``mpqr/_fast.py``) takes the
    calls :func:`choose_method` gives to ``geqrf`` at this size.
    """
    # tall-skinny inputs keep their own cut (``backend.library_qr_tall_max``, below)
    if batch != 1 or not 0 < m * n <= backend.small_max or m >= TALL_RATIO * n \
            or prec_name in OWN_PRECISION_CHOLQR \
            or not _covers_precision(backend, prec_name, dtype):
        return ""
    return (f"small input ({m}x{n} <= {backend.small_max} elements) at "
            f"precision={prec_name!r}, which the input's own precision meets: the backend "
            f"library's QR ({_library(backend)}) directly, the fastest route at this size "
            + _figure(backend, "on the GPU: `python -m mpqr bench small --gpu`",
                      "on the host: `python -m mpqr bench small`"))


#: the emulated requests the library's QR meets in the input's own precision where it is
#: faster for wide and complex inputs (H100, 2026-11-28, `python -m mpqr bench small
#: --gpu`): 4096 x 65536 float32 fp32-emulated 172 ms against cuSOLVER's 115 ms; 8192^2
#: complex128 fp64-emulated 280 against 245 ms
_EMULATED_REQUESTS = ("fp32-emulated", "fp64-emulated")
#: ``n >= WIDE_RATIO * m``: a wide input for :func:`library_meets_emulated`
WIDE_RATIO = 8


def library_meets_emulated(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                           batch: int = 1) -> str:
    """Why a single wide (``m < n``) or complex matrix at ``"fp32-emulated"`` /
    ``"fp64-emulated"`` (``"fp16"``: a wide one whose ``m x m`` block is within the
    square cut) takes the library's QR in its own precision, or ``""``.

    The request is for accuracy, and the dtype's own arithmetic meets it (float32 and
    complex64 meet fp32-emulated; float64 and complex128 both). mpqr's tensor-core
    recursion gains nothing there: a wide input's factored block is only ``m x m``
    (its ``Q^H A2`` product follows either way), and a complex input's products run as
    three or four real ones; the library's blocked QR was measured faster on both
    (:data:`_EMULATED_REQUESTS`' note). Backends without tensor cores never run the
    emulation faster than native, so the rule is for those with them.
    """
    if (batch != 1 or prec_name not in (*_EMULATED_REQUESTS, "fp16")
            or "tensor-cores" not in backend.capabilities
            or not _covers_precision(backend, prec_name, dtype)):
        return ""
    xp = backend.xp
    cplx = dtype in (xp.complex64, xp.complex128)
    # wide: at least 8 columns a row (the measured 1/16 shape); near-square wide inputs
    # keep the square rules (the recursion beats cuSOLVER from 6144^2 at fp64-emulated)
    wide = n >= WIDE_RATIO * m
    # a wide input's recursion factors only its m x m block: where the square rules give
    # that block to the library's QR (``library_qr_square_max``), no win is predicted
    # (H200: 4096 x 16384 fp64-emulated 0.85x cuSOLVER's time through the recursion)
    cut = getattr(backend, "library_qr_square_max_by_precision", {}).get(
        prec_name, getattr(backend, "library_qr_square_max", 0))
    block = not wide and m < n and m * m <= cut
    if not (wide or block or cplx):
        return ""
    # fp16 only by the block rule: wider inputs and complex ones keep the recursion, whose
    # half-precision products win there (H200, `python -m mpqr bench small --gpu`:
    # 4096 x 16384 float32 0.79x cuSOLVER's time through it, 4096 x 65536 1.37x)
    if prec_name == "fp16" and not block:
        return ""
    what = "wide" if wide or block else "complex"
    extra = (f" (its {m}x{m} block is within the square cut of {cut} elements, where the "
             "library's QR beats the recursion)") if block else ""
    return (f"{what} {m}x{n} at precision={prec_name!r}, which the input's own precision "
            f"meets{extra}: the backend library's QR (cuSOLVER geqrf) in it is faster than "
            "the tensor-core recursion here (H100: 4096 x 65536 float32 fp32-emulated 115 "
            "against 172 ms, 8192^2 complex128 fp64-emulated 245 against 280 ms)")


def _library(backend: Any) -> str:
    """The library QR the backend calls, by name."""
    return {"numpy": "LAPACK geqrf", "cupy": "cuSOLVER geqrf"}.get(
        backend.name, f"the {backend.name} backend's library QR")


def _figure(backend: Any, gpu: str, host: str) -> str:
    """The evidence for a rule that holds where the call ran: the GPU measurement on a
    backend with tensor cores, else what holds on the host."""
    return f"({gpu})" if "tensor-cores" in backend.capabilities else f"({host})"


#: what each route of a backend's measured stack table (``backend.stack_routes``) does
_STACK_ROUTES = {
    "cholqr2-batched": "CholQR2 of every member at once (batched Gram products, Cholesky "
                       "factors, n x n inverses and products Q = A R^-1), certified per "
                       "member (geqrf-wy where a member is beyond its reach)",
    "geqrf-wy": "the backend library's geqrf per matrix, Q of every matrix at once from its "
                "reflectors (compact WY: batched products and a batched triangular solve)",
    "geqrf": "the backend library's QR per matrix (geqrf and orgqr, members dealt to side "
             "streams), nothing added",
}


def _bucket(grid: Any, v: float) -> Any:
    """The largest key of ``grid`` at most ``v`` (its smallest where none is)."""
    keys = sorted(grid)
    return max((g for g in keys if g <= v), default=keys[0])


def stack_table_route(backend: Any, dtype: Any, m: int, n: int, *, batch: int = 2,
                      complete: bool = False) -> tuple[str, str] | None:
    """``(route, why)`` from the backend's measured table of stack routes
    (``backend.stack_routes``: ``{dtype name: {n: {m/n: route}}}``, each cell the
    fastest route of the sweep at that grid point), or None where the backend has none
    for ``dtype``. Between grid points the cell of the largest grid ``n`` and ``m / n``
    at most the member's is read. ``cholqr2-batched`` gives thin factors only: for
    ``complete`` Q it reads ``geqrf-wy``. Stacks of at most
    ``backend.stack_library_max_batch`` members take ``geqrf`` whatever the cell."""
    table = getattr(backend, "stack_routes", None)
    xp = backend.xp
    name = "float32" if dtype == xp.float32 else "float64" if dtype == xp.float64 else None
    if not table or name not in table or m < n:
        return None
    source = getattr(backend, "stack_routes_source", "")
    few = getattr(backend, "stack_library_max_batch", None)
    if few is not None and batch <= few:
        return "geqrf", (f"{_STACK_ROUTES['geqrf']}; at most {few} members, where the "
                         f"library's orgqr per member beats Q's batched products "
                         f"(the backend's measurement: {source})")
    rows = table[name]
    nb = _bucket(rows, n)
    cells = rows[nb]
    rb = _bucket(cells, m / n)
    route = cells[rb]
    if route == "cholqr2-batched" and complete:
        route = "geqrf-wy"
    where = (f"the backend's measured table ({source}) "
             f"gives {route} at {name}, n >= {nb}, m/n >= {rb}")
    return route, f"{_STACK_ROUTES.get(route, route)}; {where}"


def choose_method(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                  batch: int = 1, complete: bool = False) -> tuple[str, str]:
    """``(method, reason)`` for ``method="auto"``.

    A single tall-skinny matrix (``m >= 16 n``) at a working-precision setting
    takes CholQR2 when the policy runs its Gram product natively or on the
    fp64-accurate INT8 Ozaki engine: four passes
    over ``x`` that are all memory-bound GEMM-like sweeps, versus Householder's
    ``n`` dependent column steps. CholQR2's reach depends on ``cond(x)``, so its
    second Gram matrix certifies the result (``||Q1^H Q1 - I||_F <= 1/2``) and
    ``qr`` continues with ``preconditioned-cholqr`` from CholQR2's first Gram matrix
    when it does not, falling back to ``householder-tiled`` only for numerically
    rank-deficient input (explain shows it).

    A single tall-skinny matrix at ``fp16`` or ``fp32-emulated`` takes CholQR2 in the
    input's own precision (float32: fp32, float64: fp64), which is at least as
    accurate and an order of magnitude faster than the tensor-core recursion there
    (its leaf panels factor all ``m`` rows); if the certificate fails,
    ``qr`` runs what the requested precision would have run otherwise (the recursion
    where the backend has tensor cores).

    On a backend with the fused kernel (``backend.batched_qr_fused``: CuPy), a stack
    (``batch > 1``) of matrices that fit one GPU thread block
    (``backend.batched_qr_fits``: up to 128 x 128 float32 and float64, 256 rows)
    takes ``householder-batched`` where the input's own precision covers the one
    asked for: one launch for the whole stack instead of per-panel launches or a
    library call per matrix. Elsewhere such stacks take the library's QR per matrix.
    Stacks too wide for one block whose ``BLOCK``-column panels fit it (at most 256
    rows: :func:`mpqr.qr.batched_blocked.fits`) take ``householder-batched-blocked``
    under the same conditions: the fused kernel on every member's panel at once, the
    trailing update and Q by batched products.
    Larger stacks in their own working precision with at least
    ``backend.stack_q_products_min_n`` columns (CuPy: 65) take ``geqrf-wy``: the library's
    ``geqrf`` per matrix (on CuPy with the members spread over several streams), Q of the
    whole stack from the reflectors by batched products instead of ``orgqr`` per matrix,
    unless the backend's measured table of stack routes (:func:`stack_table_route`)
    gives ``cholqr2-batched`` (certified CholQR2 of every member at once; reduced and
    r modes) or ``geqrf`` (the library's QR per matrix) for the member's width and
    ratio, or the stack has at most ``backend.stack_library_max_batch`` members
    (``geqrf``).
    Narrower ones take ``geqrf`` (the library's QR per matrix; CuPy's TSQR tile kernels
    for reduced tall-skinny members up to 64 columns), others the routes below.

    Small tall-skinny matrices in their own working precision, or at ``fp16`` /
    ``fp32-emulated`` (at most ``backend.library_qr_tall_max`` elements), take
    ``geqrf`` first: CholQR2's n x n steps cost more than their data.

    Otherwise a single matrix in its own working precision whose top-level update the
    policy runs natively takes ``geqrf``, the array library's QR (LAPACK, cuSOLVER):
    mpqr's Householder methods would run the same native GEMMs with more passes. Real
    near-square matrices (``n <= m <= 2 n``) within the backend's
    ``native_recursion_square`` range of sizes (CuPy: above 2^25, at most 2^27 elements)
    take ``householder-recursive`` instead: its certified 32-column panels cost a few
    launches each where ``geqrf``'s panels step column by column.

    Otherwise Leng et al., Algorithm 1:

    A single matrix that is not tall-skinny, of at most ``backend.library_qr_square_max``
    elements, takes ``geqrf`` in the input's own precision where the recursion below
    would run, if that precision is at least the one asked for: at that size the
    recursion's leaf panels and launches cost more than its tensor cores save.

    Recursive Householder when the backend has tensor-core engines and the
    policy would run this factorization's largest product — the top-level
    update, ``(n/2) x (n/2)`` with inner dimension ``m`` — on one of them
    (``fp16``, ``fp32-emulated``, and ``fp64-emulated`` or ``auto`` where the
    cost model picks the INT8 Ozaki / tc-sgemm engine): their speed depends on
    shape and the recursion makes the big GEMMs square. Tiled otherwise
    (native GEMMs are not shape-sensitive). Both are unconditionally stable;
    SVQR is never chosen automatically.
    """
    from mpqr.policy import as_gemm_options, decide

    why = small_library_route(backend, prec_name, dtype, m, n, batch=batch)
    if why:
        return "geqrf", why
    k = min(m, n)
    if (batch > 1 and backend.batched_qr_fused and backend.batched_qr_fits(dtype, m, k)
            and _covers_precision(backend, prec_name, dtype)):
        return ("householder-batched",
                f"a stack of {batch} small matrices ({m}x{n}, each within one GPU thread "
                "block's registers): unblocked Householder QR of every matrix at once in the "
                "input's own, at least as accurate precision (one fused launch on CuPy; "
                "H100, 8192 x (64x64) float32: 3.1 ms against 627 ms for torch.linalg.qr)")
    from mpqr.qr.batched_blocked import BLOCK
    from mpqr.qr.batched_blocked import fits as _blocked_fits

    if (batch > 1 and backend.batched_qr_fused and _blocked_fits(backend, dtype, m, k)
            and _covers_precision(backend, prec_name, dtype)):
        return ("householder-batched-blocked",
                f"a stack of {batch} matrices of {m}x{n}, too wide for one GPU thread block "
                f"but of at most {m} rows: {BLOCK}-column panels of every matrix at once "
                "(one fused launch per panel on CuPy, each with its complete Q), the "
                "trailing columns and Q updated by one batched product each, in the "
                "input's own precision")
    wy_min = backend.stack_q_products_min_n
    if (batch > 1 and wy_min is not None and k >= wy_min
            and _in_working_precision(backend, prec_name, dtype)):
        picked = stack_table_route(backend, dtype, m, n, batch=batch, complete=complete)
        if picked is not None and picked[0] != "geqrf-wy":
            return picked[0], f"a stack of {batch} matrices of {m}x{n}: {picked[1]}"
        return ("geqrf-wy",
                f"a stack of {batch} matrices of {m}x{n}, beyond one GPU thread block: the "
                "backend library's geqrf per matrix (on CuPy members dealt to several "
                "streams), Q of every matrix at once from its reflectors (compact WY: one "
                "batched product Y^T Y, one batched triangular solve, one batched product), "
                "where the library's orgqr per matrix waits on the host")
    if batch > 1 and _in_working_precision(backend, prec_name, dtype):
        return ("geqrf",
                f"a stack of {batch} matrices of {m}x{n}, beyond one GPU thread block: the "
                "backend library's QR per matrix (on CuPy cuSOLVER's geqrf/orgqr with the "
                "members dealt to several streams, one buffer and workspace a stream, or "
                "the TSQR tile kernels for reduced n <= 64), which the tiled route's "
                "per-panel launches over the stack do not beat (H100, 32 x (512x128) "
                "float32: 115 ms against 14.5 ms)")
    if (batch == 1 and m >= TALL_RATIO * n and m * n <= backend.library_qr_tall_max
            and (_in_working_precision(backend, prec_name, dtype)
                 or prec_name in OWN_PRECISION_CHOLQR)):
        return ("geqrf",
                f"small tall-skinny ({m}x{n} <= {backend.library_qr_tall_max} elements) at "
                f"precision={prec_name!r}: the backend library's QR ({_library(backend)}) "
                "beats CholQR2, whose n x n steps cost more than the data here "
                + _figure(backend, "H100, 2048x128: 1.9 ms against 3.5 ms",
                          "on the host CholQR2's products run on the same BLAS as LAPACK's "
                          "QR: nothing to gain from its extra passes"))
    if batch == 1 and m >= TALL_RATIO * n and prec_name in CHOLQR_PRECISIONS:
        engine = decide(backend, dtype, n, n, m, 1, prec_name, "qr",
                        as_gemm_options(None)).engine
        # the INT8 Ozaki engine is fp64-accurate (error <= 2x DGEMM's): its Gram matrix
        # is as good as a native one (65536 x 4096 fp64-emulated fell to Householder:
        # 1076 ms against 142 ms for CholQR2 at fp64, H100)
        if engine.startswith("native") or engine == "ozaki-int8":
            return ("cholqr2",
                    f"tall-skinny (m >= {TALL_RATIO} n) at precision={prec_name!r}: CholQR2, "
                    "four memory-bound passes over x, certified orthonormal by its second "
                    "Gram matrix; if the certificate fails, preconditioned-cholqr continues "
                    "from its Gram matrix")
    if batch == 1 and m >= TALL_RATIO * n and prec_name in OWN_PRECISION_CHOLQR:
        own = _own_precision(backend, dtype)
        return ("cholqr2",
                f"tall-skinny (m >= {TALL_RATIO} n) at precision={prec_name!r}: CholQR2 in the "
                f"input's own, at least as accurate precision ({own}), four memory-bound "
                "passes over x, beats the tensor-core recursion, whose leaf panels "
                "factor all m rows "
                + _figure(backend, "H100, 2^20x256 float32: 14 ms against 199 ms at fp16, "
                          "65536x4096: 149 against 253 ms",
                          "on the host the tensor-core engines are emulated, slower than "
                          "the native products")
                + "; if its certificate fails, "
                "preconditioned-cholqr in the same precision, then what "
                f"precision={prec_name!r} runs otherwise (the fallback events name them)")
    why = library_meets_emulated(backend, prec_name, dtype, m, n, batch=batch)
    if why:
        return "geqrf", why
    # the engine of the largest product, the top-level update (n/2 x n/2, inner dim. m)
    h = n // 2
    try:
        engine = decide(backend, dtype, h, n - h, m, 1, prec_name, "qr",
                        as_gemm_options(None)).engine
    except NotImplementedError:  # e.g. an engine the backend lacks: qr() reports it
        engine = "native"
    if (batch == 1 and engine.startswith("native")
            and _in_working_precision(backend, prec_name, dtype)):
        lo, hi = getattr(backend, "native_recursion_square", (0, 0))
        if (lo < m * n <= hi and n <= m <= 2 * n
                and dtype in (backend.xp.float32, backend.xp.float64)
                and getattr(backend, "certified_panels", False)):
            return ("householder-recursive",
                    f"precision={prec_name!r} runs every product natively ({engine}); a "
                    f"near-square {m}x{n} of more than {lo} and at most {hi} elements: the "
                    "recursion in certified 32-column panels beats the backend library's "
                    f"QR ({_library(backend)}), whose panels factor column by column "
                    + _figure(backend, "H200, 8192^2 float64: 70.7 ms against 99.1 ms",
                              "the backend's measured range"))
        return ("geqrf",
                f"precision={prec_name!r} runs every product natively ({engine}) and the "
                "matrix is not tall-skinny: the backend library's blocked Householder QR "
                f"({_library(backend)}) does the same work in fewer passes "
                + _figure(backend, "H100, 16384^2 fp64: 505 ms against 731 ms for "
                          "householder-tiled", "on the host the same BLAS runs both"))
    if n <= 32:
        return "householder-tiled", f"n={n} fits one panel: Householder panel QR directly"
    if "tensor-cores" not in backend.capabilities:
        return "householder-tiled", "the backend has no tensor-core engines: fixed-width panels"
    if not engine.startswith("native"):
        cut = backend.library_qr_square_max_by_precision.get(
            prec_name, backend.library_qr_square_max)
        if (batch == 1 and m < TALL_RATIO * n and m * n <= cut
                and _covers_precision(backend, prec_name, dtype)):
            return ("geqrf",
                    f"{m}x{n} <= {cut} elements at "
                    f"precision={prec_name!r}: the backend library's QR in the input's own, "
                    f"at least as accurate precision beats the {prec_name} tensor-core "
                    "recursion, whose leaf panels and launches do not amortise at this size "
                    "(the backend's measured cut for this precision)")
        # past the cut the recursion was measured faster than the library's QR in the
        # input's own precision: say so, since that QR would meet the request too
        beyond = (f"; above the backend's measured cut of {cut} elements it is faster than "
                  "the library's QR in the input's own precision, which would meet the "
                  "request too " + _figure(backend, "H200, 8192^2 float32 at fp16: 62.5 "
                                           "against cuSOLVER's 96.1 ms", "measured")
                  if batch == 1 and m * n > cut and _covers_precision(backend, prec_name,
                                                                     dtype) else "")
        return ("householder-recursive",
                f"precision={prec_name!r} runs the {h}x{n - h}x{m} update on {engine}, a "
                "tensor-core engine, which is shape-sensitive: recursion gives square GEMMs"
                + beyond)
    return ("householder-tiled",
            f"precision={prec_name!r} runs native GEMMs ({engine}), which are not "
            "shape-sensitive: fixed-width panels")
