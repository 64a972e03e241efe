"""The host BLAS's thread count on mpqr's small LAPACK calls: a panel's ``geqrf``
(``m x 128``) and a sketch's ``geqp3`` (``136 x N``), with the library's threads and
with one (``python bench/probes/host_lapack_threads.py``; the CPU run behind
:data:`mpqr.backends.host.blas.ONE_THREAD_MAX_ELEMENTS`)."""

from __future__ import annotations

import time

import numpy as np
import scipy.linalg as sla
from threadpoolctl import ThreadpoolController


def best_ms(fn, x, repeat: int = 4) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        t = min(t, time.perf_counter() - t0)
    return 1e3 * t


def main() -> None:
    ctl = ThreadpoolController()
    rng = np.random.default_rng(0)
    cases = [(f"geqrf {m} x 128", rng.standard_normal((m, 128)),
              lambda x: np.linalg.qr(x, mode="raw")) for m in (2000, 4000, 8000, 16000)]
    cases += [(f"geqp3 136 x {n}", rng.standard_normal((136, n)),
               lambda x: sla.qr(x, mode="r", pivoting=True, check_finite=False))
              for n in (2000, 4000, 8000)]
    for name, x, fn in cases:
        many = best_ms(fn, x)
        with ctl.limit(limits=1, user_api="blas"):
            one = best_ms(fn, x)
        print(f"{name:>18} ({x.size:>8} elements): library threads {many:7.1f} ms, "
              f"one thread {one:7.1f} ms")


if __name__ == "__main__":
    main()
