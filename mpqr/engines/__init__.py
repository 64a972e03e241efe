"""The GEMM engines and their cost model.

Each engine is a function ``run(backend, a, b, out_dtype=..., **params)`` in the
core (namespace-agnostic) built on a backend's primitives, plus a predicted
time used by the precision policy. The registry is open: the INT8 Ozaki engine
registers itself from :mod:`mpqr.engines.ozaki`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ENGINES", "Engine", "register_engine"]


@dataclass(frozen=True)
class Engine:
    """One way of computing a matrix product.

    ``predict(backend, m, n, k, batch, in_bytes, params) -> seconds`` and
    ``params(backend, m, n, k, dtype, options) -> dict`` are used by the policy.
    ``bits`` is the significand precision the engine delivers (documentation
    and the explain trace), ``requires`` the backend capabilities it needs.
    """

    name: str
    bits: int
    requires: frozenset[str]
    run: Callable[..., Any]
    predict: Callable[..., float]
    params: Callable[..., dict[str, Any]]
    #: False for engines that only take 2-D operands (stacks are looped over)
    batched: bool = True
    #: ``gram(backend, a, b, out_dtype=, sign=, **params)``: the upper triangle of
    #: ``a^T b`` (symmetric, or antisymmetric for ``sign = -1``) mirrored, for Gram
    #: matrices (:mod:`mpqr.engines.gram`); None: the policy forms the full product
    gram: Callable[..., Any] | None = None
    #: ``complex_2m(backend, a, b, out_dtype=, **params)``: a complex product in two
    #: modular products per modulus (:mod:`mpqr.engines.ozaki_complex`); None: the
    #: policy forms complex products from real ones (4M/3M)
    complex_2m: Callable[..., Any] | None = None
    #: ``complex_gram(backend, x, out_dtype=, **params)``: a complex Gram matrix in one
    #: call, or None where it declines (the two real triangles of the Gram call run)
    complex_gram: Callable[..., Any] | None = None
    #: ``accumulate(backend, a, b, c, subtract=, out_dtype=, **params) -> bool``: ``c = a b``
    #: (``subtract=None``), ``c -= a b`` or ``c += a b`` for 2-D operands in one pass of a
    #: fused backend kernel, False where it declines (the policy then forms the product)
    accumulate: Callable[..., Any] | None = None
    #: True for engines that take a float16 operand as it is (its entries are fp16 numbers
    #: already: no conversion pass); the policy widens float16 operands for the others
    fp16_operands: bool = False

    def available(self, backend: Any) -> bool:
        return self.requires <= backend.capabilities


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    ENGINES[engine.name] = engine
    return engine


def _flops(m: int, n: int, k: int, batch: int) -> float:
    return 2.0 * m * n * k * batch


def _native_predict(rate_key: str, flop_factor: float = 1.0) -> Callable[..., float]:
    """``flop_factor``: real flops per flop of the product (4 for complex: ZGEMM/CGEMM
    cost 8 mnk real flops at the real rate)."""
    def predict(backend, m, n, k, batch, in_bytes, params):
        r = backend.rates()
        moved = (m * k + k * n + m * n) * in_bytes * batch
        return (flop_factor * _flops(m, n, k, batch) / r[rate_key] + moved / r["bandwidth"]
                + r["launch_s"])

    return predict


def _tc_fp16_predict(backend, m, n, k, batch, in_bytes, params):
    r = backend.rates()
    if params.get("kernel"):  # fused epilogue: no unscaling pass over the output
        moved = ((m * k + k * n) * (2 * in_bytes + 2) + m * n * in_bytes) * batch
        return _flops(m, n, k, batch) / r["tc-fp16"] + moved / r["bandwidth"] + 6 * r["launch_s"]
    # scale + convert both operands (read in, write fp16), GEMM, unscale output
    moved = ((m * k + k * n) * (2 * in_bytes + 2) + m * n * (4 + 2 * in_bytes)) * batch
    return _flops(m, n, k, batch) / r["tc-fp16"] + moved / r["bandwidth"] + 8 * r["launch_s"]


def _tc_sgemm_predict(backend, m, n, k, batch, in_bytes, params):
    r = backend.rates()
    slices = -(-k // params["slice_k"])
    split = (m * k + k * n) * (3 * in_bytes + 4) * batch
    accum = 3 * slices * m * n * 8 * batch  # each slice GEMM reads and writes C
    return (3 * _flops(m, n, k, batch) / r["tc-fp16"] + (split + accum) / r["bandwidth"]
            + (12 + 3 * slices) * r["launch_s"])


def _tc_fp16_splitb_predict(backend, m, n, k, batch, in_bytes, params):
    r = backend.rates()
    # split both operands (read in, write three fp16 parts), two GEMMs (the
    # second reads and writes C), unscale the output
    moved = ((m * k + k * n) * (in_bytes + 6) + m * n * (12 + in_bytes)) * batch
    return 2 * _flops(m, n, k, batch) / r["tc-fp16"] + moved / r["bandwidth"] + 10 * r["launch_s"]


def _no_params(backend, m, n, k, dtype, options):
    return {}


def _tc_sgemm_params(backend, m, n, k, dtype, options):
    params = {"slice_k": options.slice_k or backend.tc_sgemm_slice_k(m, n, k)}
    if options.workspace_limit is not None:  # the slices' partials within its share
        from mpqr.engines.tc_sgemm import partials_limit

        params["partials_bytes"] = partials_limit(options.workspace_limit)
    return params


def _register_builtin() -> None:
    from mpqr.engines.gram import gram_tc_fp16, gram_tc_sgemm
    from mpqr.engines.native import run_native
    from mpqr.engines.tc_fp16 import accumulate_tc_fp16, run_tc_fp16, tc_fp16_params
    from mpqr.engines.tc_fp16_splitb import run_tc_fp16_splitb
    from mpqr.engines.tc_sgemm import accumulate_tc_sgemm, run_tc_sgemm

    for name, bits, key, factor in [("native-fp64", 53, "native-fp64", 1.0),
                                    ("native-fp32", 24, "native-fp32", 1.0),
                                    ("native-complex128", 53, "native-fp64", 4.0),
                                    ("native-complex64", 24, "native-fp32", 4.0)]:
        register_engine(Engine(name, bits, frozenset(), run_native, _native_predict(key, factor),
                               _no_params))
    register_engine(Engine("tc-fp16", 11, frozenset({"fp16"}), run_tc_fp16, _tc_fp16_predict,
                           tc_fp16_params, gram=gram_tc_fp16, accumulate=accumulate_tc_fp16,
                           fp16_operands=True))
    # fp16 A (rounded), B split into two fp16 parts: for products whose A is
    # already fp16 numbers (the fp16 QR's rounded reflectors); never picked by
    # a precision setting, only by name (GemmOptions.engine)
    register_engine(Engine("tc-fp16-splitb", 11, frozenset({"fp16"}), run_tc_fp16_splitb,
                           _tc_fp16_splitb_predict, _no_params, fp16_operands=True))
    register_engine(Engine("tc-sgemm", 23, frozenset({"fp16"}), run_tc_sgemm, _tc_sgemm_predict,
                           _tc_sgemm_params, gram=gram_tc_sgemm, accumulate=accumulate_tc_sgemm))
    # "ozaki-int8" registers itself; its 2M complex products are added to it
    import mpqr.engines.ozaki_complex  # noqa: F401


_register_builtin()
