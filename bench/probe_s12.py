"""Session-12 probe: the fused CholQR2 kernels as persistent blocks with cp.async tiles.

python3 bench/probe_s12.py OUT.json [parts,tall,pool,syncs,w256]
  parts  at 2^24 x 32: copy, cuBLAS Gram, the fused Gram and two-solve kernels at each
         blocks-per-SM bound, against session 11's kernels in the same process when
         probe_s12_old_right_solve.cu is present (`git show
         4bbda61:backends/kernels/right_solve.cu`); the two-solve kernels' Q compared
         bitwise
  tall   mpqr.qr fp64 (reduced and r), fused and stored, alternately, against
         cupy.linalg.qr and the copy floor, at 2^24 x 32, 2^22 x 32, 2^24 x 16
  pool   the bench's sequence (pool released, cuSOLVER, explain call, error check) then
         single timed calls with the memory pool's size before and after each, against
         the same calls without the release: why the bench read slower than the probes
  syncs  CholQR's n x n checks read back as one transfer per step against one sync per
         scalar, alternately in one process (needs commit 8d51ecd's cholqr._host_scalars;
         no gain measured, so that change was reverted)
  w256   where 2^20 x 256 (and 2^22 x 64) fp64 QR spends its time: the whole QR, its
         GEMM-shaped passes alone, host against GPU time, and a cProfile of the host
         (each host sync charges the GPU work before it to the function that waits)
"""
from pathlib import Path

import cupy as cp
import numpy as np
from _probe import OUT, rec, section, sections, timeit, write
from mpqr.backends import cupy_right_solve as rs
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace

sections(["parts", "tall"])
be = get_backend(array_namespace(cp.zeros(1)))
CLS = type(be)
FUSED = CLS.fused_cholqr_max_n
OLD = Path(__file__).resolve().parent / "probe_s12_old_right_solve.cu"


def _attrs(k):
    k = getattr(k, "kernel", k)
    return {a: getattr(k, a, None) for a in ("num_regs", "local_size_bytes")}


def _old(n):
    names = {"gram": f"right_solve_gram_rows<{n}, 128, 1>",
             "twice": f"right_solve_twice_tiles<{n}, 128, 3>"}
    mod = cp.RawModule(code=OLD.read_text(), options=("--std=c++17",),
                       name_expressions=list(names.values()))
    return {k: mod.get_function(v) for k, v in names.items()}


def _with(gram_minb, twice_minb, f):
    saved = rs._GRAM_MINB, rs._TWICE_MINB
    rs._GRAM_MINB, rs._TWICE_MINB = gram_minb, twice_minb
    rs._module.cache_clear()
    rs._resident_blocks.cache_clear()
    try:
        return f()
    finally:
        rs._GRAM_MINB, rs._TWICE_MINB = saved
        rs._module.cache_clear()
        rs._resident_blocks.cache_clear()


@section("parts")
def _parts():
    m, n = 2**24, 32
    a = cp.random.default_rng(2).standard_normal((m, n))
    g = a.T @ a
    r = cp.linalg.cholesky(g).T
    r2 = cp.eye(n) + 1e-3 * cp.triu(cp.ones((n, n)))
    rec("parts copy (read + write)", timeit(lambda: a.copy()))
    rec("parts cublas gram a.T @ a", timeit(lambda: a.T @ a))
    q_new = rs.right_solve_twice(a, r, r2)
    g_new = rs.right_solve_gram(a, r)
    if OLD.exists():
        old = _old(n)
        (rp1, dp1), (rp2, dp2) = rs._padded(r), rs._padded(r2)
        q_old = cp.empty_like(a)
        i64 = np.int64

        def twice_old():
            old["twice"]((-(-m // 128),), (128,),
                         (a, i64(n), rp1, dp1, rp2, dp2, q_old, i64(n), i64(m)))

        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        part = cp.zeros((sms * 4, n, n))

        def gram_old():
            old["gram"]((sms,), (128,), (a, i64(n), rp1, dp1, part, i64(m)))

        for rnd in range(2):
            rec(f"parts old two solves round {rnd}", timeit(twice_old), **_attrs(old["twice"]))
            rec(f"parts old fused gram round {rnd}", timeit(gram_old), **_attrs(old["gram"]))
        rec("parts new vs old two solves", 0.0,
            bitwise=bool(cp.array_equal(q_new, q_old)))
        g_old = cp.triu(part.sum(axis=0))
        g_old = g_old + cp.triu(g_old, 1).T
        rec("parts new vs old gram", 0.0, maxdiff=float(cp.abs(g_new - g_old).max()),
            ref_max=float(cp.abs(g_old).max()))
    for rnd in range(2):
        for gm in (1, 2, 3):
            def f(gm=gm):
                kern = rs._module("float64", n, 128)["gram"]
                return (timeit(lambda: rs.right_solve_gram(a, r)),
                        rs._resident_blocks(kern, 128, rs._fused_smem(n, 1)), _attrs(kern))
            t, blocks, at = _with(gm, 2, f)
            rec(f"parts new fused gram minb={gm} round {rnd}", t, blocks=blocks, **at)
        for tm in (1, 2):
            def f(tm=tm):
                kern = rs._module("float64", n, 128)["twice_tiles"]
                return (timeit(lambda: rs.right_solve_twice(a, r, r2)),
                        rs._resident_blocks(kern, 128, rs._fused_smem(n, 2)), _attrs(kern))
            t, blocks, at = _with(1, tm, f)
            rec(f"parts new two solves minb={tm} round {rnd}", t, blocks=blocks, **at)
    q1 = rs.right_solve_upper(a, r)
    ref = q1.T @ q1
    rec("parts new gram vs cublas of stored Q1", 0.0,
        maxdiff=float(cp.abs(g_new - ref).max()), ref_max=float(cp.abs(ref).max()))


def _errs(a, q, r):
    n = a.shape[1]
    return (float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a)),
            float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n))


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
                        extra = dict(zip(("berr", "orth"),
                                         _errs(a, *mpqr.qr(a, precision="fp64"))))
                finally:
                    CLS.fused_cholqr_max_n = FUSED
                tag = "fused" if fused else "stored"
                rec(f"{m}x{n} mpqr qr fp64 {tag} round {rnd}", t, mode_r_ms=tr_,
                    vs_cusolver=t_cu / t, vs_floor=t / floor, **extra)
        a = None
        cp.get_default_memory_pool().free_all_blocks()


@section("w256")
def _w256():
    import cProfile
    import io
    import pstats

    from cupyx.profiler import benchmark

    for m, n in ((2**20, 256), (2**22, 64)):
        a = cp.random.default_rng(4).standard_normal((m, n))
        x = cp.triu(cp.random.default_rng(5).standard_normal((n, n))) + n * cp.eye(n)
        t_cu = timeit(lambda a=a: cp.linalg.qr(a), rep=3)
        rec(f"w {m}x{n} cusolver qr", t_cu)
        for mode in ("reduced", "r"):
            t = timeit(lambda a=a, mode=mode: mpqr.qr(a, precision="fp64", mode=mode))
            rec(f"w {m}x{n} mpqr qr fp64 {mode}", t, vs_cusolver=t_cu / t)
            b = benchmark(lambda a=a, mode=mode: mpqr.qr(a, precision="fp64", mode=mode),
                          n_repeat=5, n_warmup=1)
            rec(f"w {m}x{n} benchmark {mode}", float(np.median(b.gpu_times)) * 1e3,
                cpu_ms=float(np.median(b.cpu_times)) * 1e3)
        rec(f"w {m}x{n} gram a.T @ a", timeit(lambda a=a: a.T @ a))
        rec(f"w {m}x{n} gemm a @ x", timeit(lambda a=a, x=x: a @ x))
        rec(f"w {m}x{n} potrf n x n", timeit(lambda x=x: cp.linalg.cholesky(x.T @ x)))
        pr = cProfile.Profile()
        cp.cuda.Device().synchronize()
        pr.enable()
        for _ in range(5):
            mpqr.qr(a, precision="fp64")
        cp.cuda.Device().synchronize()
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(40)
        Path(OUT).with_name(f"profile_{m}x{n}.txt").write_text(buf.getvalue())
        a = None
        cp.get_default_memory_pool().free_all_blocks()


@section("pool")
def _pool():
    import mpqr.tools.bench_qr as bq
    from mpqr.tools._timing import release_pool

    pool = cp.get_default_memory_pool()
    for m, n in ((2**20, 256), (2**22, 64)):
        rng = np.random.default_rng(1)
        a = cp.asarray(rng.standard_normal((m, n)))
        a32 = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
        for rnd, release in ((0, True), (1, True), (2, False)):
            if release:
                release_pool(cp)
            timeit(lambda a=a: cp.linalg.qr(a), rep=3)
            if release:
                release_pool(cp)
            with mpqr.explain():
                out = mpqr.qr(a, precision="fp64")
            bq._errors(cp, a, out.Q, out.R)
            del out
            mpqr.qr(a, precision="fp64")  # time_it's warm-up
            cp.cuda.Device().synchronize()
            ts, grew = [], []
            for _ in range(6):
                before = pool.total_bytes()
                s_, e_ = cp.cuda.Event(), cp.cuda.Event()
                s_.record()
                mpqr.qr(a, precision="fp64")
                e_.record()
                e_.synchronize()
                ts.append(round(cp.cuda.get_elapsed_time(s_, e_), 2))
                grew.append(round((pool.total_bytes() - before) / 2**20))
            rec(f"pool {m}x{n} round {rnd} release={release}", float(np.median(ts)),
                each_ms=str(ts), pool_growth_mib=str(grew),
                pool_gib=pool.total_bytes() / 2**30, free_blocks=pool.n_free_blocks())
        del a, a32
        release_pool(cp)


@section("syncs")
def _syncs():
    from mpqr.qr import cholqr as cq

    batched = cq._host_scalars

    def one_by_one(sb, vals):  # a float() per scalar: a host sync each on a GPU
        return [float(v) for v in vals]

    for m, n in ((2**20, 256), (2**22, 64)):
        a = cp.random.default_rng(6).standard_normal((m, n))
        for rnd in range(3):
            for tag, fn in (("one transfer", batched), ("sync per scalar", one_by_one)):
                cq._host_scalars = fn
                try:
                    t = timeit(lambda a=a: mpqr.qr(a, precision="fp64"), rep=7)
                    tr_ = timeit(lambda a=a: mpqr.qr(a, precision="fp64", mode="r"), rep=7)
                finally:
                    cq._host_scalars = batched
                rec(f"syncs {m}x{n} {tag} round {rnd}", t, mode_r_ms=tr_)
        a = None
        cp.get_default_memory_pool().free_all_blocks()


write()
