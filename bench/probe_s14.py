"""Session-14 probe: what a CholQR2 leaf sub-panel would cost on the GPU, eager and as a
CUDA graph, against the two panel routes mpqr has (cuSOLVER geqrf, TSQR +
reconstruction); and the eigenvalue solver that bounds lstsq's default driver.

python3 bench/probe_s14.py OUT.json [sub,eig]
  sub  one m x k sub-panel (k = 32; float32 and float64; m = 4096 ... 65536):
       geqrf (cupy.linalg.qr raw), backend.reconstruct_panel (TSQR kernels + the
       reconstruction kernel), and CholQR2 + the same reconstruction kernel built from
       two Gram GEMMs, two GEMMs with R^-1 and one single-block Cholesky-and-inverse
       kernel per pass (below) -- eager (GPU time by events, host time to issue) and
       captured once as a CUDA graph (GPU time per replay); with each route's
       ||A - (I - W Y^T)[:, :k] R'||_F / ||A||_F and ||Q^T Q - I||_F of the CholQR2 Q
  fused64  CholQR2's fused kernels (Q1 never stored) instantiated at n = 64 (shipped:
       n <= 32), against the stored route, whole mpqr.qr at 2^22 x 64 and 2^21 x 64
       float64, alternately in one process, with the Gram kernel at 3 and at 1 blocks
       per SM asked of the register allocator; errors of each
  sqcut  the recursion at fp64-emulated (method forced) against cupy.linalg.qr (float64,
       mode reduced) at 16384^2, 24576^2, 32768^2 and 65536 x 8192, alternately in one
       process: where, if anywhere, auto's recursion beats the library's QR at that
       precision (it took 509-535 ms against 490-513 at 16384^2 in sessions 6-13)
  tall64  2^22 x 64 float64 (the row at 4.03x the memory floor): host against GPU time
       (cupyx.profiler.benchmark), a cProfile of three calls (top lines by own time),
       and the call's phases synchronised one by one (Gram products, n x n steps on the
       host, the applies of R^-1, sign check)
  signs  the Cholesky methods without the sign test against with it (api._POSITIVE_DIAGONAL
       emptied), whole mpqr.qr fp64 reduced at 2^22 x 64, 2^20 x 256, 2^24 x 32,
       alternately in one process, three rounds
  graph2  the `sub` panel captured as a CUDA graph through a cuBLAS handle of our own
       (cublas.create, setStream to the capturing stream), since CuPy refuses its own
       handle under capture: GPU time per replay, host time per launch, and a 16-panel
       chain (one 16384 x 512 leaf's worth) as one graph
  eig  cupy.linalg.eigvalsh (cuSOLVER syevd, no vectors) at n = 256, 1024, 2048, 4096:
       the step that bounds lstsq's default driver at 65536 x 2048
"""
import time

import cupy as cp
import numpy as np
from _probe import rec, section, sections, timeit, write
from mpqr.backends import cupy_lu, get_backend

from mpqr._array_api import array_namespace

sections(["sub", "eig"])
be = get_backend(array_namespace(cp.zeros(1)))

# One block: R = chol(G) (upper, float64 arithmetic), X = R^-1, flag = 1 when a pivot is
# not positive and finite. Right-looking column loop in shared memory; X by one thread per
# column (back substitution). n <= 64.
_SRC = r"""
template <typename T>
__global__ void chol_inv(const T* __restrict__ g, int n, T* __restrict__ r,
                         T* __restrict__ x, int* __restrict__ flag) {
  // R in the upper triangle; X = R^-1 goes transposed into the strict lower one
  __shared__ double t[64][65];
  __shared__ double dx[64];
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx % n;
    t[i][j] = (double)g[idx];
  }
  __syncthreads();
  for (int k = 0; k < n; ++k) {
    const double d = t[k][k];
    __syncthreads();
    const double s = sqrt(d);
    if (threadIdx.x == 0) {
      if (!(d > 0.0) || !isfinite(d)) *flag = 1;
      t[k][k] = s;
    }
    for (int j = k + 1 + threadIdx.x; j < n; j += blockDim.x) t[k][j] /= s;
    __syncthreads();
    const int w = n - k - 1;
    for (int idx = threadIdx.x; idx < w * w; idx += blockDim.x) {
      const int i = k + 1 + idx / w, j = k + 1 + idx % w;
      if (j >= i) t[i][j] -= t[k][i] * t[k][j];
    }
    __syncthreads();
  }
  const int j = threadIdx.x;
  if (j < n) {  // X[l][j] (l < j) lives at t[j][l]
    dx[j] = 1.0 / t[j][j];
    for (int i = j - 1; i >= 0; --i) {
      double acc = t[i][j] * dx[j];
      for (int l = i + 1; l < j; ++l) acc += t[i][l] * t[j][l];
      t[j][i] = -acc / t[i][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, jj = idx % n;
    r[idx] = jj >= i ? (T)t[i][jj] : T(0);
    x[idx] = jj > i ? (T)t[jj][i] : (jj == i ? (T)dx[i] : T(0));
  }
}
"""
_MOD = cp.RawModule(code=_SRC, options=("--std=c++17",),
                    name_expressions=["chol_inv<float>", "chol_inv<double>"])


def _ci(dt):
    return _MOD.get_function("chol_inv<double>" if dt == cp.float64 else "chol_inv<float>")


class CholQR2Panel:
    """Every buffer preallocated, so the same launches can be captured as a graph."""

    def __init__(self, a):
        m, k = a.shape
        dt = a.dtype
        self.a = a
        e = lambda *s: cp.empty(s, dtype=dt)  # noqa: E731
        self.g1, self.r1, self.x1, self.q1 = e(k, k), e(k, k), e(k, k), e(m, k)
        self.g2, self.r2, self.x2, self.q = e(k, k), e(k, k), e(k, k), e(m, k)
        self.rr = e(k, k)
        self.y, self.w, self.tau, self.rout = e(m, k), e(m, k), e(k), e(k, k)
        self.flag = cp.zeros(1, dtype=cp.int32)
        self.ci = _ci(dt)
        self.rec = cupy_lu._kernel(cp.dtype(dt).name, 1)
        self.m, self.k = m, k

    def mm(self, a, b, out):
        # the backend's direct cublasGemmEx (cupy.matmul refuses to run under capture)
        from cupy.cuda import cublas, runtime

        f64 = a.dtype == cp.float64
        t = runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F
        be._gemm_ex(a, b, out, 1.0, 0.0, t, t,
                    cublas.CUBLAS_COMPUTE_64F if f64 else cublas.CUBLAS_COMPUTE_32F,
                    np.float64 if f64 else np.float32)

    def run(self):
        a, k = self.a, self.k
        self.mm(a.T, a, self.g1)
        self.ci((1,), (256,), (self.g1, np.int32(k), self.r1, self.x1, self.flag))
        self.mm(a, self.x1, self.q1)
        self.mm(self.q1.T, self.q1, self.g2)
        self.ci((1,), (256,), (self.g2, np.int32(k), self.r2, self.x2, self.flag))
        self.mm(self.q1, self.x2, self.q)
        self.mm(self.r2, self.r1, self.rr)
        self.rec((-(-self.m // 256),), (256,), (self.q, self.rr, cp.int64(self.m),
                                                 cp.int32(k), self.y, self.w, self.tau,
                                                 self.rout))


def _panel_residual(a, y, w, rout):
    """||A - (I - W Y^T)[:, :k] R'||_F / ||A||_F in float64."""
    a64, y64, w64, r64 = (cp.asarray(v, dtype=cp.float64) for v in (a, y, w, rout))
    k = a.shape[1]
    h = -w64 @ y64[:k].T
    h[:k] += cp.eye(k)
    return float(cp.linalg.norm(a64 - h @ r64) / cp.linalg.norm(a64))


def _host_ms(f, rep=20):
    """Host milliseconds to issue f (no sync inside the loop), then a sync."""
    f()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(rep):
        f()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return (t1 - t0) * 1e3 / rep


def _time_graph(graph, s):
    """(median GPU ms of 10 replays on stream s by events, host ms per launch of 20)."""
    ts = []
    for _ in range(10):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        graph.launch(stream=s)
        e1.record(s)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    t0 = time.perf_counter()
    for _ in range(20):
        graph.launch(stream=s)
    t1 = time.perf_counter()
    s.synchronize()
    return float(np.median(ts)), (t1 - t0) * 1e3 / 20


@section("sub")
def _sub():
    rng = cp.random.default_rng(14)
    for dt in (cp.float32, cp.float64):
        for m in (4096, 16384, 65536):
            k = 32
            a = rng.standard_normal((m, k), dtype=cp.float64).astype(dt)
            tag = f"sub {cp.dtype(dt).name} {m}x{k}"
            rec(f"{tag} geqrf", timeit(lambda a=a: cp.linalg.qr(a, mode="raw"), rep=10))
            rec(f"{tag} tsqr+reconstruct", timeit(lambda a=a: be.reconstruct_panel(a), rep=10),
                host_ms=_host_ms(lambda a=a: be.reconstruct_panel(a)))
            y, w, _tau, rout = be.reconstruct_panel(a)
            rec(f"{tag} tsqr+reconstruct residual", 0.0, res=_panel_residual(a, y, w, rout))
            p = CholQR2Panel(a)
            rec(f"{tag} cholqr2+reconstruct eager", timeit(p.run, rep=10),
                host_ms=_host_ms(p.run))
            g = p.g1.copy()
            rec(f"{tag} chol_inv kernel alone", timeit(
                lambda p=p, g=g: p.ci((1,), (256,), (g, np.int32(p.k), p.r1, p.x1, p.flag))))
            rec(f"{tag} reconstruct kernel alone", timeit(
                lambda p=p: p.rec((-(-p.m // 256),), (256,),
                                  (p.q, p.rr, cp.int64(p.m), cp.int32(p.k),
                                   p.y, p.w, p.tau, p.rout))))
            rec(f"{tag} Gram gemm alone", timeit(lambda p=p, a=a: p.mm(a.T, a, p.g1)))
            rec(f"{tag} A X gemm alone", timeit(lambda p=p, a=a: p.mm(a, p.x1, p.q1)))
            p.run()
            orth = float(cp.linalg.norm(p.q.astype(cp.float64).T @ p.q.astype(cp.float64)
                                        - cp.eye(k)))
            rec(f"{tag} cholqr2+reconstruct errors", 0.0,
                res=_panel_residual(a, p.y, p.w, p.rout), orth=orth, flag=int(p.flag[0]))
            try:
                s = cp.cuda.Stream(non_blocking=True)
                with s:
                    p.run()  # warm: kernels loaded, cuBLAS's workspace set up
                    s.synchronize()
                    s.begin_capture()
                    try:
                        p.run()
                    finally:
                        graph = s.end_capture()
                    graph.launch(stream=s)
                    s.synchronize()
                    gpu_ms, host_ms = _time_graph(graph, s)
                rec(f"{tag} cholqr2+reconstruct graph", gpu_ms, host_ms=host_ms,
                    res=_panel_residual(a, p.y, p.w, p.rout))
            except Exception as exc:  # report and go on: this is what the probe asks
                rec(f"{tag} cholqr2+reconstruct graph FAILED", 0.0,
                    error=f"{type(exc).__name__}: {exc}"[:200])


def _qr_errors(a, q, r):
    n = a.shape[1]
    return (float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a)),
            float(cp.linalg.norm(q.T @ q - cp.eye(n))))


@section("fused64")
def _fused64():
    from mpqr.backends import cupy_right_solve as crs

    import mpqr

    cls = type(be)
    rng = cp.random.default_rng(64)
    shipped = (crs.GRAM_MAX_N, crs._GRAM_MINB, cls.fused_cholqr_max_n)

    def setup(fused, minb):
        crs.GRAM_MAX_N = 64 if fused else shipped[0]
        crs._GRAM_MINB = minb
        cls.fused_cholqr_max_n = 64 if fused else shipped[2]
        crs._module.cache_clear()
        crs._resident_blocks.cache_clear()

    try:
        for m in (2**21, 2**22):
            a = rng.standard_normal((m, 64))
            for rnd in range(2):
                for name, fused, minb in (("stored", False, shipped[1]),
                                          ("fused minb=3", True, 3),
                                          ("fused minb=1", True, 1)):
                    setup(fused, minb)
                    t = timeit(lambda a=a: mpqr.qr(a, precision="fp64"), rep=5)
                    with mpqr.explain() as tr:
                        q, r = mpqr.qr(a, precision="fp64")
                    ev = [e.kind for e in tr.events if e.kind == "fused-solve"]
                    bwd, orth = _qr_errors(a, q, r)
                    rec(f"fused64 {m}x64 {name} round {rnd}", t, fused_events=len(ev),
                        backward=bwd, orth=orth)
                    del q, r
    finally:
        crs.GRAM_MAX_N, crs._GRAM_MINB, cls.fused_cholqr_max_n = shipped
        crs._module.cache_clear()
        crs._resident_blocks.cache_clear()


@section("sqcut")
def _sqcut():
    import mpqr

    rng = cp.random.default_rng(7)
    for m, n in ((16384, 16384), (24576, 24576), (32768, 32768), (65536, 8192)):
        a = rng.standard_normal((m, n))
        for rnd in range(2):
            t_lib = timeit(lambda a=a: cp.linalg.qr(a), rep=2)
            t_rec = timeit(lambda a=a: mpqr.qr(a, precision="fp64-emulated",
                                               method="householder-recursive"), rep=2)
            rec(f"sqcut {m}x{n} round {rnd} cupy.linalg.qr", t_lib)
            rec(f"sqcut {m}x{n} round {rnd} recursion fp64-emulated", t_rec,
                speedup=t_lib / t_rec)
        q, r = mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
        bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
        rec(f"sqcut {m}x{n} recursion errors", 0.0, backward=bwd)
        del a, q, r
        cp.get_default_memory_pool().free_all_blocks()


@section("tall64")
def _tall64():
    import cProfile
    import io
    import pstats

    from cupyx.profiler import benchmark

    import mpqr
    from mpqr.qr import api, cholqr

    a = cp.random.default_rng(3).standard_normal((2**22, 64))
    t = timeit(lambda: mpqr.qr(a, precision="fp64"), rep=10)
    b = benchmark(lambda: mpqr.qr(a, precision="fp64"), n_repeat=10, n_warmup=2)
    rec("tall64 qr fp64 reduced", t, cpu_ms=float(np.mean(b.cpu_times)) * 1e3,
        gpu_ms=float(np.mean(b.gpu_times)) * 1e3)
    t = timeit(lambda: mpqr.qr(a, mode="r", precision="fp64"), rep=10)
    rec("tall64 qr fp64 mode r", t)
    t = timeit(lambda: a @ cp.eye(64), rep=10)
    rec("tall64 A @ X alone (cupy)", t)
    t = timeit(lambda: a.T @ a, rep=10)
    rec("tall64 A^T A alone (cupy)", t)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        mpqr.qr(a, precision="fp64")
    cp.cuda.Device().synchronize()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue()[-3500:], flush=True)
    # phases, synchronised: wrap the pieces of one call
    times: dict[str, list[float]] = {}

    def wrap(mod, name):
        f = getattr(mod, name)

        def g(*args, **kw):
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            out = f(*args, **kw)
            cp.cuda.Device().synchronize()
            times.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
            return out
        return f, g

    saved = []
    for mod, name in ((cholqr, "gram"), (cholqr, "_chol_or_breakdown"),
                      (cholqr, "_apply_inverse"), (api, "normalize_signs")):
        f, g = wrap(mod, name)
        saved.append((mod, name, f))
        setattr(mod, name, g)
    try:
        for _ in range(3):
            times.clear()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            mpqr.qr(a, precision="fp64")
            cp.cuda.Device().synchronize()
            total = (time.perf_counter() - t0) * 1e3
        rec("tall64 phases (synced, last of 3)", total,
            **{k: ",".join(f"{x:.2f}" for x in v) for k, v in times.items()})
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)


@section("signs")
def _signs():
    import mpqr
    from mpqr.qr import api

    shipped = api._POSITIVE_DIAGONAL
    rng = cp.random.default_rng(9)
    try:
        for m, n in ((2**22, 64), (2**20, 256), (2**24, 32)):
            a = rng.standard_normal((m, n))
            for rnd in range(3):
                for name, skip in (("no sign test", shipped), ("sign test", frozenset())):
                    api._POSITIVE_DIAGONAL = skip
                    rec(f"signs {m}x{n} round {rnd} {name}",
                        timeit(lambda a=a: mpqr.qr(a, precision="fp64"), rep=7))
            del a
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        api._POSITIVE_DIAGONAL = shipped


@section("graph2")
def _graph2():
    from cupy.cuda import cublas, runtime

    handle = cublas.create()

    class OwnHandle(CholQR2Panel):
        def mm(self, a, b, out):
            from mpqr.backends.cupy_backend import _blas_operand

            f64 = a.dtype == cp.float64
            t = runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F
            m_, k_ = a.shape
            n_ = b.shape[1]
            tb, ldb, b = _blas_operand(cp, b)
            ta, lda, a = _blas_operand(cp, a)
            sd = np.float64 if f64 else np.float32
            self._al = np.array(1.0, dtype=sd)  # kept alive: read at capture
            self._be = np.array(0.0, dtype=sd)
            cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            cublas.gemmEx(handle, tb, ta, n_, m_, k_, self._al.ctypes.data, b.data.ptr, t,
                          ldb, a.data.ptr, t, lda, self._be.ctypes.data, out.data.ptr, t,
                          out.strides[0] // out.itemsize,
                          cublas.CUBLAS_COMPUTE_64F if f64 else cublas.CUBLAS_COMPUTE_32F,
                          cublas.CUBLAS_GEMM_DEFAULT)

    rng = cp.random.default_rng(15)
    for dt in (cp.float32, cp.float64):
        for m in (4096, 16384, 65536):
            a = rng.standard_normal((m, 32), dtype=cp.float64).astype(dt)
            tag = f"graph2 {cp.dtype(dt).name} {m}x32"
            p = OwnHandle(a)
            s = cp.cuda.Stream(non_blocking=True)
            try:
                with s:
                    p.run()
                    s.synchronize()
                    rec(f"{tag} eager (own handle)", timeit(p.run, rep=10),
                        host_ms=_host_ms(p.run))
                    s.begin_capture()
                    try:
                        p.run()
                    finally:
                        graph = s.end_capture()
                    p.flag[...] = 0
                    gpu_ms, host_ms = _time_graph(graph, s)
                rec(f"{tag} graph replay", gpu_ms, host_ms=host_ms,
                    res=_panel_residual(a, p.y, p.w, p.rout),
                    flag=int(p.flag[0]))
                # 16 sub-panels of one leaf in one graph (independent data: launch cost only)
                ps = [OwnHandle(rng.standard_normal((m, 32), dtype=cp.float64).astype(dt))
                      for _ in range(16)]
                with s:
                    for q in ps:
                        q.run()
                    s.synchronize()
                    s.begin_capture()
                    try:
                        for q in ps:
                            q.run()
                    finally:
                        g16 = s.end_capture()
                    g16.launch(stream=s)
                    s.synchronize()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(s)
                    g16.launch(stream=s)
                    e1.record(s)
                    e1.synchronize()
                rec(f"{tag} 16 sub-panels, one graph", cp.cuda.get_elapsed_time(e0, e1))
            except Exception as exc:  # the probe's question: report and go on
                rec(f"{tag} FAILED", 0.0, error=f"{type(exc).__name__}: {exc}"[:200])
    cublas.destroy(handle)


@section("eig")
def _eig():
    rng = cp.random.default_rng(5)
    for n in (256, 1024, 2048, 4096):
        a = rng.standard_normal((4 * n, n))
        g = a.T @ a
        rec(f"eigvalsh float64 n={n}", timeit(lambda g=g: cp.linalg.eigvalsh(g), rep=3))


write()
