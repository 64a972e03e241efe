"""The precision policy: the one seam every matrix product of mpqr goes through.

:func:`gemm` resolves the precision setting, asks :func:`decide` for an engine,
records the decision in the explain trace, and runs the engine. ``decide``
looks only at the requested precision, the dtype, the shape and the backend's
capabilities and measured rates. :func:`gemm_sub` makes the same decision for an
in-place update ``c -= a @ b``.

What each precision computes:

=================  ==========================================================
``fp64``           native float64 (complex128) GEMM
``fp32``           native float32 (complex64) GEMM
``fp16``           ``tc-fp16``: fp16 inputs, fp32 accumulation (opt-in only)
``fp32-emulated``  ``tc-sgemm``: split-fp16 products, round-to-nearest
                   accumulation across k-slices, fp32-level accuracy
``fp64-emulated``  fp64 accuracy the fastest way: the INT8 Ozaki engine where
                   the cost model predicts it beats native DGEMM, else DGEMM
``auto``           never less than the input dtype's native accuracy; may use
                   an emulated engine only where the backend lists it in
                   ``auto_engines`` (measured to meet the native error bound)
                   and the cost model predicts it is faster
=================  ==========================================================
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from mpqr._array_api import array_namespace, device
from mpqr.backends import get_backend
from mpqr.engines import ENGINES
from mpqr.engines.complex_product import default_scheme, real_dims, real_dtype, run_complex
from mpqr.engines.prepared import Prepared, operand, prepare
from mpqr.policy.options import GemmOptions, as_gemm_options
from mpqr.policy.precision import resolve_precision
from mpqr.policy.trace import GemmDecision, record_gemm, tracing

__all__ = ["Decision", "active_gemm_options", "decide", "double_double_gram", "fused_gemm",
           "gemm", "gemm_add", "gemm_into", "gemm_options", "gemm_sub", "gram", "prepare_operand",
           "result_dtype"]

_ctx_options: contextvars.ContextVar[GemmOptions | None] = contextvars.ContextVar(
    "mpqr_gemm_options", default=None
)

_EMULATED = {"fp16": "tc-fp16", "fp32-emulated": "tc-sgemm"}


class gemm_options:
    """Context manager setting default :class:`GemmOptions` for the GEMMs inside.

    Per-call ``options=`` fields override it field by field. Forcing an engine
    (``engine="ozaki-int8"``) here applies to every GEMM of the block and is
    shown in the explain trace.
    """

    def __init__(self, options: Any = None, **fields: Any):
        base = as_gemm_options(options)
        self.options = dataclasses.replace(base, **fields) if fields else base
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> GemmOptions:
        self._tokens.append(_ctx_options.set(self.options))
        return self.options

    def __exit__(self, *exc: object) -> None:
        _ctx_options.reset(self._tokens.pop())


def active_gemm_options() -> GemmOptions | None:
    """The options of the innermost :class:`gemm_options` block, or None outside one."""
    return _ctx_options.get()


def _merged_options(options: Any) -> GemmOptions:
    call = as_gemm_options(options)
    ctx = _ctx_options.get()
    if ctx is None:
        return call
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(GemmOptions)}
    return dataclasses.replace(ctx, **{k: v for k, v in fields.items() if v is not None})


@dataclass(frozen=True)
class Decision:
    engine: str
    params: dict[str, Any]
    reason: str
    predicted_s: dict[str, float]


def result_dtype(xp: Any, *dtypes: Any) -> Any:
    """Output dtype: NumPy-style promotion, integers to float64, float16 to float32."""
    floats = []
    for dt in dtypes:
        if xp.isdtype(dt, "real floating") or xp.isdtype(dt, "complex floating"):
            floats.append(dt)
        else:
            floats.append(xp.float64)
    out = xp.result_type(*floats)
    if hasattr(xp, "float16") and out == getattr(xp, "float16", None):
        out = xp.float32
    return out


def _kind(xp: Any, dtype: Any) -> str:
    if xp.isdtype(dtype, "complex floating"):
        return "complex128" if dtype == xp.complex128 else "complex64"
    return "fp64" if dtype == xp.float64 else "fp32"


def decide(backend: Any, dtype: Any, m: int, n: int, k: int, batch: int, precision: str,
           source: str, options: GemmOptions) -> Decision:
    """Pick the engine for one product. Raises for combinations that cannot run.

    A complex product on an emulated engine runs as real products of the
    parts (:mod:`mpqr.engines.complex_product`); its params then carry
    ``"complex": scheme`` and its prediction is that of the real products.
    """
    xp = backend.xp
    kind = _kind(xp, dtype)
    is_complex = kind.startswith("complex")
    in_bytes = 8 if kind in ("fp64", "complex64") else (16 if kind == "complex128" else 4)

    def scheme_of(name: str) -> str:
        if options.complex_product == "2m" and ENGINES[name].complex_2m is None:
            raise ValueError(
                f"GemmOptions.complex_product='2m' needs modular arithmetic (ozaki-int8); "
                f"the {name} engine takes '4m' or '3m'"
            )
        if options.complex_product:
            return options.complex_product
        return default_scheme(name)

    def native(bits: str) -> str:
        if is_complex:
            return "native-complex128" if bits == "64" else "native-complex64"
        return f"native-fp{bits}"

    def via_parts(name: str) -> bool:
        return is_complex and not name.startswith("native")

    def dims(name: str) -> tuple[tuple[int, int, int], int]:
        return real_dims(m, n, k, scheme_of(name)) if via_parts(name) else ((m, n, k), 1)

    def params_for(name: str) -> dict[str, Any]:
        (mr, nr, kr), _ = dims(name)
        p = ENGINES[name].params(backend, mr, nr, kr, dtype, options)
        if batch > 1 or via_parts(name):  # fused kernels take one real 2-D product
            p.pop("kernel", None)
        if name.startswith("native"):
            p = {**p, "compute_dtype": {"native-fp64": xp.float64, "native-fp32": xp.float32,
                                        "native-complex128": xp.complex128,
                                        "native-complex64": xp.complex64}[name]}
        if via_parts(name):
            p = {**p, "complex": scheme_of(name)}
            if p["complex"] == "2m":
                from mpqr.engines.ozaki_complex import terms_2m

                if p.get("auto_terms"):
                    p["terms"] = terms_2m(k)
        return p

    def predict(name: str, p: dict[str, Any]) -> float:
        if not via_parts(name):
            return ENGINES[name].predict(backend, m, n, k, batch, in_bytes, p)
        (mr, nr, kr), count = dims(name)
        rp = {kk: v for kk, v in p.items() if kk != "complex"}  # (2M: terms per product)
        # the parts are split (and the 4M operand written twice) and the result assembled
        r = backend.rates()
        moved = 3.0 * (m * k + k * n + m * n) * in_bytes * batch
        return (count * ENGINES[name].predict(backend, mr, nr, kr, batch, in_bytes // 2, rp)
                + moved / r["bandwidth"] + 4 * r["launch_s"])

    def pick(cands: list[str], why: str) -> Decision:
        if batch > 1 and any(not ENGINES[c].batched for c in cands):
            why += "; " + ", ".join(c for c in cands if not ENGINES[c].batched) + \
                " skipped: 2-D only and this product is a stack"
            cands = [c for c in cands if ENGINES[c].batched]
        ps = {c: params_for(c) for c in cands}
        times = {c: predict(c, ps[c]) for c in cands}
        best = min(cands, key=lambda c: times[c])
        if len(cands) > 1:
            ranked = ", ".join(f"{c} {times[c] * 1e3:.3g} ms" for c in sorted(cands,
                                                                              key=times.get))
            why = f"{why}; predicted {ranked}"
        if via_parts(best):
            why += "; " + _complex_why(scheme_of(best), options)
        return Decision(best, ps[best], why, times)

    if options.engine is not None:
        name = options.engine
        if name not in ENGINES:
            raise ValueError(
                f"options.engine must be one of {sorted(ENGINES)}; got {name!r}"
            )
        if not ENGINES[name].available(backend):
            raise NotImplementedError(
                f"engine {name!r} is not available on the {backend.name} backend"
            )
        if is_complex and name in ("native-fp64", "native-fp32"):
            raise ValueError(
                f"options.engine={name!r} is a real engine; a {kind} product needs "
                "'native-complex128', 'native-complex64' or an emulated engine"
            )
        p = params_for(name)
        why = "forced by options.engine"
        if via_parts(name):
            why += "; " + _complex_why(scheme_of(name), options)
        return Decision(name, p, why, {name: predict(name, p)})

    if precision == "fp64":
        return pick([native("64")], "precision='fp64': native float64 arithmetic")
    if precision == "fp32":
        return pick([native("32")], "precision='fp32': native float32 arithmetic")
    if precision in _EMULATED:
        name = _EMULATED[precision]
        if not ENGINES[name].available(backend):
            raise NotImplementedError(
                f"precision={precision!r} needs the {name} engine, which the {backend.name} "
                f"backend does not provide (it has no float16 GEMM); use 'fp32' or 'fp64'"
            )
        return pick([name], f"precision={precision!r} selects {name}")
    if precision == "fp64-emulated":
        oz = ENGINES.get("ozaki-int8")
        cands = [native("64")]
        why = "fp64 accuracy the fastest way"
        if oz is not None and oz.available(backend):
            cands.append("ozaki-int8")
        else:
            why += "; no INT8 Ozaki engine on this backend"
        return pick(cands, why)
    # auto: never below the input dtype's native accuracy
    if is_complex:
        return pick([native("64" if kind == "complex128" else "32")],
                    f"auto for {kind}: no emulated complex engine validated for auto")
    auto_ok = getattr(backend, "auto_engines", frozenset())
    if kind == "fp64":
        cands = ["native-fp64"] + [e for e in ("ozaki-int8",) if e in ENGINES and e in auto_ok
                                   and ENGINES[e].available(backend)]
    else:
        cands = ["native-fp32"] + [e for e in ("tc-sgemm",)
                                   if e in auto_ok and ENGINES[e].available(backend)]
    why = f"auto for float{'64' if kind == 'fp64' else '32'}"
    if len(cands) == 1:
        why += f": no emulated engine validated for auto on the {backend.name} backend"
    return pick(cands, why)


def _complex_why(scheme: str, options: GemmOptions) -> str:
    src = "options.complex_product" if options.complex_product else "default"
    if scheme == "3m":
        return (f"complex as 3 real products (3M/Karatsuba, {src}: 25% fewer flops than "
                "4M; its imaginary part bounded by (|Ar|+|Ai|)(|Br|+|Bi|), measured "
                "0.05-0.22x the native complex GEMM's error on H100)")
    if scheme == "2m":
        return (f"complex as 2 modular products per modulus (2M, {src}: Gaussian moduli, "
                "exact like 4M with about half its int8 products)")
    return (f"complex as one real product of twice the size (4M, {src}: as accurate as the "
            "real engine; 3M saves 25% of the flops, its imaginary part measured up to 2x "
            "less accurate)")


def fused_gemm(backend: Any, dtype: Any, shape: tuple[int, int, int], *, engine: str,
               precision: str | None = None, label: str = "", options: Any = None) -> bool:
    """Whether the policy runs the product of ``shape = (m, n, k)`` on ``engine``.

    For a backend kernel that computes a product fused into another pass (the
    product never reaches :func:`gemm`): the policy decides as it would for
    :func:`gemm`; when it picks ``engine`` the decision is recorded in the explain
    trace and True returned (the caller runs the fused kernel), else nothing is
    recorded and the caller takes :func:`gemm`, which records its own decision.
    """
    prec, source = resolve_precision(precision)
    m, n, k = shape
    d = decide(backend, dtype, m, n, k, 1, prec, source, _merged_options(options))
    if d.engine != engine or "complex" in d.params:
        return False
    if tracing():
        record_gemm(GemmDecision(label, (m, n, k), 1, str(dtype), prec, source, d.engine,
                                 {kk: v for kk, v in d.params.items() if kk not in _UNSHOWN},
                                 d.reason, d.predicted_s))
    return True


def double_double_gram(dtype: Any, shape: tuple[int, int], *, label: str, why: str) -> None:
    """Record the product ``W^T W`` of an ``h x N`` float64 ``W`` (``shape``) that a
    backend kernel computes in double-double arithmetic: no engine of the policy is
    accurate enough for it (a caller that reads exact-to-float64 results from ``n x n``
    quantities, ``why``), so the policy does not choose; it states the engine."""
    h, n = shape
    if tracing():
        record_gemm(GemmDecision(label, (n, n, h), 1, str(dtype), "double-double", "route",
                                 "double-double", {"products": "exact (fma or Dekker)",
                                                   "sums": "compensated (TwoSum)"},
                                 f"relative error ~h 2^-104 per entry: {why}", {}))


def gram(x: Any, *, precision: str | None = None, label: str = "", options: Any = None,
         backend: Any = None) -> Any | None:
    """``x^H x`` as a SYRK/HERK-shaped engine call (one triangle computed, mirrored:
    bitwise Hermitian), or None where the policy's engine for this product has no
    Gram call (native engines, stacks): the caller forms it from products then.

    The decision is the one :func:`gemm` makes for ``ct(x) @ x``; it is recorded in
    the explain trace (``gram=upper-triangle``) only when this call runs it.
    """
    if x.ndim != 2:
        return None
    if backend is None:
        backend = get_backend(array_namespace(x))
    opts = _merged_options(options)
    prec, source = resolve_precision(precision)
    out_dtype = result_dtype(backend.xp, x.dtype)
    m, n = x.shape
    d = decide(backend, out_dtype, n, n, m, 1, prec, source, opts)
    engine = ENGINES[d.engine]
    if engine.gram is None or m == 0 or n == 0:
        return None
    from mpqr.engines.gram import product_fraction, run_gram

    params = {kk: v for kk, v in d.params.items() if kk != "complex"}
    if "complex" in d.params:  # Re and Im: two real triangles of length 2m
        params = ENGINES[d.engine].params(backend, n, n, 2 * m, out_dtype, opts)
    params.pop("kernel", None)  # a fused product kernel: the triangle runs the engine's passes
    if tracing():
        frac = product_fraction(n)
        one_call = "complex" in d.params and engine.complex_gram is not None
        shown = {**{kk: v for kk, v in params.items() if kk not in _UNSHOWN},
                 "gram": "2m" if one_call else "upper-triangle"}
        scheme = d.params.get("complex")
        base = d.reason.replace("; " + _complex_why(scheme, opts), "") if scheme else d.reason
        if one_call:
            why = (f"{base}; Gram matrix, complex: one 2M product per Gaussian modulus "
                   "(X+ = V^T U, X- its transpose; exactly Hermitian), where its workspace "
                   f"fits, else Re and Im as two real upper triangles ({frac:.0%} of a "
                   "GEMM's products each)")
        else:
            why = (f"{base}; Gram matrix: upper triangle only ({frac:.0%} of the GEMM's "
                   "products), mirrored")
            if "complex" in d.params:
                why += "; complex: Re and Im as two real triangles of length 2m"
        record_gemm(GemmDecision(label, (n, n, m), 1, str(out_dtype), prec, source, d.engine,
                                 shown, why, d.predicted_s))
    xp = backend.xp
    if x.dtype != out_dtype:
        x = xp.astype(x, out_dtype)
    return run_gram(backend, engine.gram, x, out_dtype=out_dtype,
                    complex_gram=engine.complex_gram, **params)


def gemm(a: Any, b: Any, *, precision: str | None = None, label: str = "",
         options: Any = None, backend: Any = None) -> Any:
    """``a @ b`` through the precision policy (2-D or equally stacked operands).

    Internal seam: operands are assumed validated (same namespace and device,
    matching inner dimensions, floating or integer dtype).
    """
    backend, d, out_dtype = _plan(a, b, precision, label, options, backend)
    tiles = _tiles(backend, d, options, a, b)
    a, b = _operands(d, a, b, tiles)
    if tiles is not None:
        c = backend.xp.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=device(a))
        _tiled(backend, d, out_dtype, c, a, b, tiles, subtract=None)
        return c
    return _run(backend, d, out_dtype, a, b)


def gemm_sub(c: Any, a: Any, b: Any, *, precision: str | None = None, label: str = "",
             options: Any = None, backend: Any = None) -> None:
    """``c -= a @ b`` in place (2-D operands; ``c`` a writable array or view of the
    product's dtype), with the decision and trace entry of :func:`gemm`.

    Where the policy picks a native engine and the backend accumulates in place
    (``backend.gemm_sub_into``: cuBLAS with ``beta = 1`` on CuPy), the product needs
    no temporary and ``c`` no second pass; otherwise the product is formed, then
    subtracted.
    """
    backend, d, out_dtype = _plan(a, b, precision, label, options, backend)
    tiles = _tiles(backend, d, options, a, b)
    a, b = _operands(d, a, b, tiles)
    if (d.engine.startswith("native") and a.ndim == 2 and b.ndim == 2
            and a.dtype == b.dtype == c.dtype == d.params["compute_dtype"]
            and backend.gemm_sub_into(c, a, b)):
        return
    if tiles is None:
        _into(backend, d, out_dtype, c, a, b, subtract=True)
        return
    _tiled(backend, d, out_dtype, c, a, b, tiles, subtract=True)


def gemm_add(c: Any, a: Any, b: Any, *, precision: str | None = None, label: str = "",
             options: Any = None, backend: Any = None) -> None:
    """``c += a @ b`` in place (2-D operands; ``c`` a writable array or view of the
    product's dtype), with the decision and trace entry of :func:`gemm`: the engine's
    one pass over ``c`` where it has one (the emulated engines unscale their product into
    it), else the product formed, then added."""
    backend, d, out_dtype = _plan(a, b, precision, label, options, backend)
    tiles = _tiles(backend, d, options, a, b)
    a, b = _operands(d, a, b, tiles)
    if tiles is None:
        _into(backend, d, out_dtype, c, a, b, subtract=False)
        return
    _tiled(backend, d, out_dtype, c, a, b, tiles, subtract=False)


def gemm_into(out: Any, a: Any, b: Any, *, precision: str | None = None, label: str = "",
              options: Any = None, backend: Any = None) -> None:
    """``out[...] = a @ b`` (2-D operands; ``out`` a writable array or view of the
    product's dtype), with the decision and trace entry of :func:`gemm`.

    Where the policy picks a native engine and the backend writes into a view
    (``backend.gemm_into``: cuBLAS with ``beta = 0`` on CuPy), the product needs no
    temporary and no copy; otherwise the product is formed, then copied in.
    """
    backend, d, out_dtype = _plan(a, b, precision, label, options, backend)
    tiles = _tiles(backend, d, options, a, b)
    a, b = _operands(d, a, b, tiles)
    if (d.engine.startswith("native") and a.ndim == 2 and b.ndim == 2
            and a.dtype == b.dtype == out.dtype == d.params["compute_dtype"]
            and backend.gemm_into(out, a, b)):
        return
    if tiles is None:
        _into(backend, d, out_dtype, out, a, b, subtract=None)
        return
    _tiled(backend, d, out_dtype, out, a, b, tiles, subtract=None)


#: engine parameters the trace leaves out (the native dtype; tc-sgemm's share of a
#: workspace limit for its partial products, a memory detail of the call's plan)
_UNSHOWN = frozenset({"compute_dtype", "partials_bytes"})


def _takes_prepared(d: Decision, x: Any, side: str) -> bool:
    """Whether the decided engine reads the prepared ``side`` operand ``x``'s parts (the
    engine it was prepared for, a real product; ``tc-fp16`` only with shifts along its
    own axis)."""
    return (isinstance(x, Prepared) and x.engine == d.engine and "complex" not in d.params
            and not (x.engine == "tc-fp16" and x.inner(side)))


def _operands(d: Decision, a: Any, b: Any, tiles: Any) -> tuple[Any, Any]:
    """The operands as the decided engine takes them: a prepared operand's parts where it
    reads them (untiled), else its array."""
    def un(x: Any, side: str) -> Any:
        return x if tiles is None and _takes_prepared(d, x, side) else operand(x)

    return un(a, "left"), un(b, "right")


def prepare_operand(x: Any, *, side: str, m: int, n: int, k: int,
                    precision: str | None = None, label: str = "", options: Any = None,
                    backend: Any = None) -> Any:
    """``x`` with its fp16 parts (:class:`~mpqr.engines.prepared.Prepared`) as the
    ``side`` operand (``"left"``/``"right"``) of later ``m x n x k`` products, where the
    policy decides that product's engine to be one that reads them (``tc-sgemm``,
    ``tc-fp16``); else ``x`` as it is. Each product that receives it is decided again
    (:func:`gemm`): one given to another engine reads the array, and the explain trace
    says ``prepared=`` where the parts were read. Under a ``workspace_limit`` (products in
    tiles within a memory cap) nothing is prepared: parts kept between products would
    add to the capped scratch."""
    if backend is None:
        backend = get_backend(array_namespace(x))
    prec, source = resolve_precision(precision)
    xp = backend.xp
    opts = _merged_options(options)
    if x.ndim != 2 or not xp.isdtype(x.dtype, "real floating") \
            or opts.workspace_limit is not None:
        return x
    d = decide(backend, x.dtype, m, n, k, 1, prec, source, opts)
    if d.engine not in ("tc-sgemm", "tc-fp16"):
        return x
    return prepare(backend, x, side=side, engine=d.engine)


#: bytes of engine scratch per element of an operand (its fp16 copies: tc-sgemm's hi and
#: [hi | lo], tc-fp16-splitb's three of B) and per element of the product (the float32
#: product and its unscaled copy) of the engines that split their operands whole
_SPLIT_OPERAND_BYTES = {"tc-sgemm": 6, "tc-fp16": 2, "tc-fp16-splitb": 6}
_SPLIT_PRODUCT_BYTES = 8
#: the narrowest tile of a blocked product (its rows, columns or stretch of k): below it
#: the repeated splits of the other operand (or the passes over the product) cost more
#: than the memory saved is worth
MIN_TILE = 256
#: products may be cut along their inner dimension too (``K_TILES``): each operand is then
#: split once, a stretch of k at a time, and the partial products are added into the
#: output with round-to-nearest in its dtype (another order of the same sums: not the
#: untiled product's bits). Output tiles alone split A once per column tile and B once
#: per row tile.
K_TILES = True
#: tiles sized for the backend's one-kernel ``tc-sgemm`` where it takes them (no product
#: or partials in memory)
FUSED_TILES = True
#: bytes an element of the output costs per extra stretch of k (the partial product
#: written and read, the output read and written), against the splits saved
_K_TILE_PRODUCT_BYTES = 16

Tile = tuple[slice, slice, slice]


def _tiles(backend: Any, d: Decision, options: Any, a: Any, b: Any) -> list[Tile] | None:
    """Tiles ``(rows, cols, ks)`` of a 2-D product on an engine that splits its operands
    whole, each tile's scratch within ``workspace_limit``; None where one piece fits (or no
    limit is set). Rows of A and columns of B are scaled and split independently, so a
    tile's entries are the whole product's; stretches of k (:data:`K_TILES`) are partial
    products added into the output. Of the tilings that fit, the one that moves the fewest
    bytes (splits repeated, partial products added) is taken. A backend that emulates the
    fp16 GEMM adds its own temporaries per element (``split_operand_overhead``,
    ``split_product_overhead``); a tile that the backend's one-kernel ``tc-sgemm`` takes
    has no product or partials in memory."""
    per = _SPLIT_OPERAND_BYTES.get(d.engine)
    if per is None or a.ndim != 2 or b.ndim != 2 or "complex" in d.params:
        return None
    per += getattr(backend, "split_operand_overhead", 0)
    per_out = _SPLIT_PRODUCT_BYTES + getattr(backend, "split_product_overhead", 0)
    limit = _merged_options(options).workspace_limit
    if limit is None:
        return None
    m, k = a.shape
    n = b.shape[1]
    slice_k = d.params.get("slice_k", 1)
    fused = (d.engine == "tc-sgemm" and FUSED_TILES and a.dtype == b.dtype
             and a.dtype == backend.xp.float32)

    def scratch(mb: int, nb: int, kb: int) -> int:
        if fused and backend.fused_sgemm_kernel(mb, nb, kb, slice_k):
            return per * kb * (mb + nb)
        # tc-sgemm's batched partial products take their share of the limit (its params)
        return per * kb * (mb + nb) + per_out * mb * nb + d.params.get("partials_bytes", 0)

    # stretches of k: whole slices of the engine's k-slicing, at least MIN_TILE
    step = max(MIN_TILE, slice_k)
    best = None
    kb = k
    while True:
        mb, nb = _output_tile(scratch, limit, m, n, kb)
        tm, tn, tk = -(-m // mb), -(-n // nb), -(-k // kb)
        moved = per * k * (m * tn + n * tm) + _K_TILE_PRODUCT_BYTES * m * n * (tk - 1)
        need = scratch(mb, nb, kb)
        # the fewest bytes moved of the tilings that fit; else the least scratch
        key = (need > limit, moved if need <= limit else need, tm * tn * tk)
        if best is None or key < best[0]:
            best = (key, mb, nb, kb)
        if not K_TILES or kb <= step:
            break
        kb = max(step, step * -(-kb // (2 * step)))
    _, mb, nb, kb = best
    if (mb, nb, kb) == (m, n, k):
        return None
    return [(slice(i, min(i + mb, m)), slice(j, min(j + nb, n)), slice(p, min(p + kb, k)))
            for i in range(0, m, mb) for j in range(0, n, nb) for p in range(0, k, kb)]


def _output_tile(scratch: Any, limit: int, m: int, n: int, kb: int) -> tuple[int, int]:
    """Rows and columns of an output tile whose ``scratch(rows, cols, kb)`` fits
    ``limit``, halving the longer side (ties: rows) down to :data:`MIN_TILE`."""
    mb, nb = m, n
    while scratch(mb, nb, kb) > limit:
        if mb >= nb and mb > MIN_TILE:
            mb = -(-mb // 2)
        elif nb > MIN_TILE:
            nb = -(-nb // 2)
        elif mb > MIN_TILE:
            mb = -(-mb // 2)
        else:
            break
    return mb, nb


def _tiled(backend: Any, d: Decision, out_dtype: Any, c: Any, a: Any, b: Any,
           tiles: list[Tile], *, subtract: bool | None) -> None:
    """``c = a b`` (``subtract=None``) or ``c -= a b`` tile by tile: a tile's first
    stretch of k writes (or subtracts), the later ones add (or subtract) theirs."""
    for rows, cols, ks in tiles:
        first = ks.start == 0
        _into(backend, d, out_dtype, c[..., rows, cols], a[..., rows, ks], b[..., ks, cols],
              subtract=subtract if subtract or first else False)


def _into(backend: Any, d: Decision, out_dtype: Any, c: Any, a: Any, b: Any, *,
          subtract: bool | None) -> None:
    """``c = a b`` (``subtract=None``), ``c -= a b`` (True) or ``c += a b`` (False) on the
    decided engine: its fused kernel where it has one, else the product formed, then
    written."""
    if _accumulate(backend, d, out_dtype, c, a, b, subtract=subtract):
        return
    if subtract:
        c -= _run(backend, d, out_dtype, a, b)
    elif subtract is None:
        c[...] = _run(backend, d, out_dtype, a, b)
    else:
        c += _run(backend, d, out_dtype, a, b)


def _accumulate(backend: Any, d: Decision, out_dtype: Any, c: Any, a: Any, b: Any, *,
                subtract: bool | None) -> bool:
    """The engine's fused ``c = a b`` / ``c -= a b`` where it has one and takes these
    operands (:attr:`~mpqr.engines.Engine.accumulate`)."""
    engine = ENGINES[d.engine]
    if (engine.accumulate is None or a.ndim != 2 or b.ndim != 2 or "complex" in d.params
            or not (_takes(backend, engine, a, out_dtype) and _takes(backend, engine, b, out_dtype))
            or 0 in a.shape or 0 in b.shape):
        return False
    return engine.accumulate(backend, a, b, c, subtract=subtract, out_dtype=out_dtype,
                             **d.params)


def _takes(backend: Any, engine: Any, x: Any, out_dtype: Any) -> bool:
    """Whether ``engine`` takes ``x`` without a cast: of the result's dtype, or float16 for
    an engine that reads fp16 operands as they are."""
    return x.dtype == out_dtype or (engine.fp16_operands and x.dtype == backend.xp.float16)


def _plan(a: Any, b: Any, precision: str | None, label: str, options: Any, backend: Any
          ) -> tuple[Any, Decision, Any]:
    """The backend, the engine decision (recorded in the trace) and the result dtype."""
    if backend is None:
        backend = get_backend(array_namespace(operand(a), operand(b)))
    opts = _merged_options(options)
    prec, source = resolve_precision(precision)
    out_dtype = result_dtype(backend.xp, a.dtype, b.dtype)
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = math.prod(a.shape[:-2]) if a.ndim > 2 else 1
    d = decide(backend, out_dtype, m, n, k, batch, prec, source, opts)
    if tracing():
        params = {kk: v for kk, v in d.params.items() if kk not in _UNSHOWN}
        prepared = "".join(name for name, x, side in (("A", a, "left"), ("B", b, "right"))
                           if _takes_prepared(d, x, side))
        if prepared:
            params["prepared"] = prepared
        record_gemm(GemmDecision(label, (m, n, k), batch, str(out_dtype), prec, source, d.engine,
                                 params, d.reason, d.predicted_s))
    return backend, d, out_dtype


def _run(backend: Any, d: Decision, out_dtype: Any, a: Any, b: Any) -> Any:
    xp = backend.xp
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    if m == 0 or n == 0 or k == 0:
        return xp.zeros((*a.shape[:-1], n), dtype=out_dtype, device=device(a))
    engine = ENGINES[d.engine]
    params = dict(d.params)
    scheme = params.pop("complex", None)
    def widened(x: Any) -> Any:
        # the emulated engines get out_dtype operands, or float16 ones where they take them
        # as they are (not the complex parts, which are split in out_dtype)
        if (d.engine.startswith("native") or x.dtype == out_dtype
                or (scheme is None and _takes(backend, engine, x, out_dtype))):
            return x
        return xp.astype(x, out_dtype)

    a, b = widened(a), widened(b)
    if scheme == "2m":
        return _run_engine(backend, dataclasses.replace(engine, run=engine.complex_2m),
                           params, out_dtype, a, b)
    if scheme is not None:
        rdt = real_dtype(xp, out_dtype)
        return run_complex(backend, lambda x, y: _run_engine(backend, engine, params, rdt, x, y),
                           a, b, scheme=scheme)
    return _run_engine(backend, engine, params, out_dtype, a, b)


def _run_engine(backend: Any, engine: Any, params: dict[str, Any], out_dtype: Any, a: Any,
                b: Any) -> Any:
    xp = backend.xp
    m = a.shape[-2]
    k, n = b.shape[-2], b.shape[-1]
    if a.ndim > 2 and not engine.batched:  # only when forced: one product per matrix
        batch = math.prod(a.shape[:-2])
        a3 = xp.reshape(a, (batch, m, k))
        b3 = xp.reshape(xp.broadcast_to(b, (*a.shape[:-2], k, n)), (batch, k, n))
        out = xp.stack([engine.run(backend, a3[i], b3[i], out_dtype=out_dtype, **params)
                        for i in range(batch)])
        return xp.reshape(out, (*a.shape[:-1], n))
    return engine.run(backend, a, b, out_dtype=out_dtype, **params)
