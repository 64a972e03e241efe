"""Session-11 probe: CholQR2 without storing Q1 (fused Gram and two-solve kernels).

python3 bench/probe_s11.py OUT.json [tall,parts,lsq]
  tall   mpqr.qr fp64 (reduced and r) with the fused passes on and off, alternately,
         against cupy.linalg.qr, and the copy floor, at 2^24 x 32, 2^22 x 32 and
         2^24 x 16; accuracy of both routes
  parts  the passes alone at 2^24 x 32: cuBLAS Gram, plain solve, two solves, the fused
         Gram kernel at 1-3 blocks per SM
  lsq    lstsq at 2^20 x 256: fp16 against fp32-emulated, alternately (the bench's 2x gap)
"""
import cupy as cp
from _probe import rec, section, sections, timeit, write
from mpqr.backends import cupy_right_solve as rs
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace

sections(["tall", "parts", "lsq"])
be = get_backend(array_namespace(cp.zeros(1)))
CLS = type(be)
FUSED = CLS.fused_cholqr_max_n


def _errs(a, q, r):
    n = a.shape[1]
    be_ = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    return be_, orth


@section("tall")
def _tall():
    for m, n in ((2**24, 32), (2**22, 32), (2**24, 16)):
        a = cp.random.default_rng(1).standard_normal((m, n))
        floor = timeit(lambda a=a: a.copy(), rep=5)
        t_cu = timeit(lambda a=a: cp.linalg.qr(a), rep=3)
        rec(f"{m}x{n} copy (read + write)", floor)
        rec(f"{m}x{n} cusolver qr", t_cu)
        for rnd in range(2):
            for fused in (rs.GRAM_MAX_N, None):
                CLS.fused_cholqr_max_n = fused
                try:
                    t = timeit(lambda a=a: mpqr.qr(a, precision="fp64"), rep=5)
                    tr_ = timeit(lambda a=a: mpqr.qr(a, precision="fp64", mode="r"), rep=5)
                    extra = {}
                    if rnd == 0:
                        extra = dict(zip(("berr", "orth"), _errs(a, *mpqr.qr(a, precision="fp64"))))
                finally:
                    CLS.fused_cholqr_max_n = FUSED
                tag = "fused" if fused else "stored"
                rec(f"{m}x{n} mpqr qr fp64 {tag} round {rnd}", t, mode_r_ms=tr_,
                    vs_cusolver=t_cu / t, vs_floor=t / floor, **extra)
        a = None
        cp.get_default_memory_pool().free_all_blocks()


def _attrs(k):
    k = getattr(k, "kernel", k)
    return {a: getattr(k, a, None) for a in ("num_regs", "local_size_bytes",
                                             "shared_size_bytes")}


@section("parts")
def _parts():
    m, n = 2**24, 32
    a = cp.random.default_rng(2).standard_normal((m, n))
    g = a.T @ a
    r = cp.linalg.cholesky(g).T
    r2 = cp.eye(n) + 1e-3 * cp.triu(cp.ones((n, n)))
    rec("parts cublas gram a.T @ a", timeit(lambda: a.T @ a))
    rec("parts plain solve", timeit(lambda: rs.right_solve_upper(a, r)))
    rec("parts two solves", timeit(lambda: rs.right_solve_twice(a, r, r2)))
    saved = rs._GRAM_MINB
    for minb in (1, 2, 3):
        rs._GRAM_MINB = minb
        rs._module.cache_clear()
        rs._resident_blocks.cache_clear()
        try:
            kern = rs._module("float64", n, rs._rows(n, a.dtype))["gram"]
            rec(f"parts fused gram minb={minb}", timeit(lambda: rs.right_solve_gram(a, r)),
                blocks=rs._resident_blocks(kern, rs._GRAM_ROWS, rs._fused_smem(n, 1)),
                **_attrs(kern))
        finally:
            rs._GRAM_MINB = saved
            rs._module.cache_clear()
            rs._resident_blocks.cache_clear()
    for name, k in rs._module("float64", n, rs._rows(n, a.dtype)).items():
        rec(f"parts kernel {name}", 0.0, **_attrs(k))
    q1 = rs.right_solve_upper(a, r)
    ref = q1.T @ q1
    got = rs.right_solve_gram(a, r)
    rec("parts fused gram vs cublas of stored Q1", 0.0,
        maxdiff=float(cp.abs(got - ref).max()), ref_max=float(cp.abs(ref).max()))


@section("lsq")
def _lsq():
    rng = cp.random.default_rng(3)
    a = rng.standard_normal((2**20, 256))
    b = rng.standard_normal(2**20)
    for rnd in range(2):
        for p in ("fp16", "fp32-emulated", "auto"):
            t = timeit(lambda p=p: mpqr.lstsq(a, b, check_finite=False, precision=p,
                                              refine="cgls", lapack_driver="gelsy"), rep=5)
            rec(f"lstsq 2^20x256 gelsy {p} round {rnd}", t)


write()
