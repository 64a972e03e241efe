"""TSQR panel factorization on the GPU: block Householder tile kernels + a reduction tree.

Algorithm (Demmel et al.'s TSQR; tile kernel after Leng et al., SC'23, §V.A):

1. Level 0 cuts the ``m x n`` matrix into ``ceil(m / 256)`` tiles of balanced
   height (every tile has between 128 and 256 rows, hence at least ``n``).
   One thread block Householder-factorizes each tile in registers
   (``kernels/tsqr.cu``) and writes its ``n x n`` R.
2. The R's are stacked (``ntiles * n`` rows) and factorized again, groups of
   ``max(2, 256 // n)`` consecutive R's forming one tile, until one tile is left;
   its R is the R of the whole matrix.
3. Q is formed top-down without any GEMM: a tile whose parent hands it the
   ``n x n`` block ``C`` of the parent's Q computes ``H_0 ... H_{n-1} [C; 0]``
   (``dorgqr`` applied to ``C`` instead of ``I``), which is ``Q_tile @ C``.

Memory traffic: with ``recompute=True`` (default) level 0 reads A, keeps only
the R's, and the final pass reads A again, re-factorizes each tile in
registers and writes Q: two reads of A and one write of Q, plus tree data of
about ``m * n**2 / 256`` elements. ``recompute=False`` stores the reflectors in
Q's memory instead (read A, write V, read V, write Q). Workspace beyond Q and R:
the tree, ``≈ (m / 256) * n * n * 8 / 7`` elements (1/7 of A at n = 32).

Signs: every tile follows LAPACK's convention (``beta = -sign(alpha) * norm``),
so R's diagonal has the signs that the *top* tile's Householder steps give;
they generally differ from ``numpy.linalg.qr``'s (R is unique up to the signs
of its rows, and Q's columns carry the same signs). Callers that need a
particular sign pattern normalize afterwards.

``plan_tree`` and ``tsqr_reference`` are pure NumPy (the CPU tests check the
tree and the Q assembly with them); ``tsqr`` needs CuPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "MAX_N",
    "TILE_ROWS",
    "Level",
    "apply_householder",
    "householder_tile",
    "plan_tree",
    "supports",
    "tsqr",
    "tsqr_reference",
]

#: rows of a level-0 tile (one thread block: 32 lanes x 8 rows each)
TILE_ROWS = 256
#: widest panel the tile kernels take (the tile must fit in registers)
MAX_N = 64

_FLAG_V, _FLAG_R, _FLAG_TAU, _FLAG_C = 1, 2, 4, 8


# --- the tree (host side, shared by the GPU driver and the NumPy reference) -----
@dataclass(frozen=True)
class Level:
    """One level of the tree: ``ntiles`` tiles over ``rows`` rows.

    Tile ``t`` covers rows ``unit * (t * base + min(t, rem))`` to that plus
    ``unit * (base + (t < rem))``; ``unit`` is 1 at level 0 and ``n`` above
    (a tile there is a group of whole child R's).
    """

    unit: int
    ntiles: int
    base: int
    rem: int

    @property
    def rows(self) -> int:
        return self.unit * (self.ntiles * self.base + self.rem)

    @property
    def max_tile_rows(self) -> int:
        return self.unit * (self.base + (1 if self.rem else 0))

    def bounds(self, t: int) -> tuple[int, int]:
        """``(first row, number of rows)`` of tile ``t``."""
        start = self.unit * (t * self.base + min(t, self.rem))
        return start, self.unit * (self.base + (1 if t < self.rem else 0))


def plan_tree(m: int, n: int) -> list[Level]:
    """Levels of the TSQR tree of an ``m x n`` matrix (``1 <= n <= MAX_N``, ``m >= n``)."""
    if not (1 <= n <= MAX_N and m >= n):
        raise ValueError(f"plan_tree needs 1 <= n <= {MAX_N} and m >= n, got m={m}, n={n}")
    ntiles = -(-m // TILE_ROWS)
    levels = [Level(1, ntiles, *divmod(m, ntiles))]
    group = max(2, TILE_ROWS // n)  # child R's per parent tile (<= 256 rows)
    while ntiles > 1:
        children = ntiles
        ntiles = -(-children // group)
        levels.append(Level(n, ntiles, *divmod(children, ntiles)))
    return levels


# --- NumPy emulation of the tile kernel's arithmetic --------------------------------
def householder_tile(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """geqrf-style compact form and tau of one tile, with the kernel's formulas.

    Parameters
    ----------
    a : numpy.ndarray
        ``rows x n`` tile, ``rows >= n``.

    Returns
    -------
    compact : numpy.ndarray
        R on and above the diagonal, the reflectors ``v`` (``v[j] = 1`` implied)
        below it.
    tau : numpy.ndarray
        The ``n`` scalar factors, ``H_j = I - tau_j v_j v_j^T``.
    """
    w = np.array(a, copy=True)
    n = w.shape[1]
    tau = np.zeros(n, dtype=w.dtype)
    one = w.dtype.type(1)
    lo, hi = (2.0**-100, 2.0**100) if w.dtype == np.float32 else (2.0**-900, 2.0**900)
    for j in range(n):
        alpha = w[j, j]
        x = w[j + 1 :, j]
        with np.errstate(all="ignore"):
            ss = np.sum(x * x, dtype=w.dtype)
            if np.isnan(ss):
                xnorm = ss  # NaN spreads
            elif ss < lo or ss > hi:  # may have under/overflowed: rescale as the kernel does
                amax = np.max(np.abs(x), initial=0)
                xnorm = amax * np.sqrt(np.sum((x / amax) ** 2)) if amax > 0 else ss * 0
            else:
                xnorm = np.sqrt(ss)
            if xnorm == 0:
                continue  # H = I, tau = 0
            beta = -np.copysign(np.hypot(alpha, xnorm), alpha)
            tau[j] = (beta - alpha) / beta
            w[j + 1 :, j] = x * (one / (alpha - beta))
            w[j, j] = beta
            v = w[j + 1 :, j]
            # trailing update: a_k -= tau (v^T a_k) v, v = [1; w[j+1:, j]]
            d = w[j, j + 1 :] + v @ w[j + 1 :, j + 1 :]
            w[j, j + 1 :] -= tau[j] * d
            w[j + 1 :, j + 1 :] -= np.outer(v, tau[j] * d)
    return w, tau


def apply_householder(compact: np.ndarray, tau: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    """``H_0 ... H_{n-1} [C; 0]`` (``C = I`` when ``c`` is None), as the kernel does."""
    rows, n = compact.shape
    b = np.zeros((rows, n), dtype=compact.dtype)
    b[:n] = np.eye(n, dtype=compact.dtype) if c is None else c
    for j in range(n - 1, -1, -1):
        v = np.concatenate([np.ones(1, dtype=compact.dtype), compact[j + 1 :, j]])
        d = v @ b[j:]
        b[j:] -= np.outer(v, tau[j] * d)
    return b


def _tile_qr_householder(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    compact, tau = householder_tile(block)
    return apply_householder(compact, tau, None), np.triu(compact[: block.shape[1]])


def _tile_qr_numpy(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.linalg.qr(block)


def tsqr_reference(a: np.ndarray, *, tile: str = "householder") -> tuple[np.ndarray, np.ndarray]:
    """The GPU tree on the host: same tiles, same grouping, same Q assembly.

    Parameters
    ----------
    a : numpy.ndarray
        ``(..., m, n)`` with ``m >= n`` and ``1 <= n <= MAX_N``.
    tile : {"householder", "numpy"}
        Tile factorization: the kernel's arithmetic (:func:`householder_tile`)
        or ``numpy.linalg.qr`` standing in for it.

    Returns
    -------
    q, r : numpy.ndarray
        Reduced factors, ``q`` of shape ``(..., m, n)``, ``r`` ``(..., n, n)``.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.random.default_rng(0).standard_normal((1000, 4))
    >>> q, r = tsqr_reference(a)
    >>> bool(np.allclose(q @ r, a))
    True
    """
    tile_qr = {"householder": _tile_qr_householder, "numpy": _tile_qr_numpy}[tile]
    *batch, _, n = a.shape
    if not batch:
        return _tsqr_reference_2d(a, tile_qr)
    q = np.empty(a.shape, dtype=a.dtype)
    r = np.empty((*batch, n, n), dtype=a.dtype)
    for idx in np.ndindex(*batch):
        q[idx], r[idx] = _tsqr_reference_2d(a[idx], tile_qr)
    return q, r


def _tsqr_reference_2d(a, tile_qr):
    m, n = a.shape
    levels = plan_tree(m, n)
    mats = [a]  # mats[l]: the matrix level l factorizes
    tile_qs = []  # per level: each tile's explicit Q (tile rows x n)
    for lvl in levels:
        qs, rs = [], []
        for t in range(lvl.ntiles):
            s, h = lvl.bounds(t)
            qt, rt = tile_qr(mats[-1][s : s + h])
            qs.append(qt)
            rs.append(rt)
        tile_qs.append(qs)
        mats.append(np.concatenate(rs, axis=0))
    r = mats[-1]
    parent_q = np.eye(n, dtype=a.dtype)  # the top tile's C
    for lvl, qs in zip(reversed(levels), reversed(tile_qs)):
        out = np.empty((lvl.rows, n), dtype=a.dtype)
        for t in range(lvl.ntiles):
            s, h = lvl.bounds(t)
            out[s : s + h] = qs[t] @ parent_q[t * n : (t + 1) * n]
        parent_q = out
    return parent_q, r


# --- GPU driver -----------------------------------------------------------------
def _layout(n: int) -> tuple[int, int]:
    """(columns per warp, warps): at most 8 warps up to n = 32, 16 above."""
    cpw = -(-n // 8) if n <= 32 else -(-n // 16)
    return cpw, -(-n // cpw)


def _rows_per_lane(max_rows: int) -> int:
    for rpl in (1, 2, 4, 8):
        if 32 * rpl >= max_rows:
            return rpl
    raise AssertionError(f"internal: tile of {max_rows} rows exceeds {TILE_ROWS}")


def _kernel(cp, dtype, cpw: int, rpl: int, mode: int, smem: int):
    from mpqr.backends.cupy.modules import ctype, functions

    t = ctype(np.dtype(dtype).name)
    kern = functions("tsqr.cu", tuple(f"tsqr_tile<{t},{cpw},{rpl},{md}>"
                                      for md in range(3)))[mode]
    if smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem:
        # beyond 48 KiB a kernel has to opt in to dynamic shared memory
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def _launch(cp, lvl: Level, n: int, nb: int, mode: int, flags: int, src, dst, rdst, tau, cbuf):
    cpw, nw = _layout(n)
    rpl = _rows_per_lane(lvl.max_tile_rows)
    tr = 32 * rpl
    smem = (tr * (n | 1) + 2 * tr + n) * src.itemsize
    kern = _kernel(cp, src.dtype, cpw, rpl, mode, smem)
    i32, i64 = np.int32, np.int64
    kern(
        (nb * lvl.ntiles,),
        (32 * nw,),
        (src, dst, rdst, tau, cbuf, i32(n), i32(lvl.ntiles), i32(lvl.unit), i32(lvl.base),
         i32(lvl.rem), i32(flags), i64(lvl.rows * n), i64(lvl.rows * n)),
        shared_mem=smem,
    )


def supports(a: Any) -> bool:
    """Whether :func:`tsqr` takes ``a`` (float32/float64, ``1 <= n <= MAX_N``, ``m >= n``)."""
    return (
        getattr(a, "ndim", 0) >= 2
        and np.dtype(a.dtype) in (np.dtype(np.float32), np.dtype(np.float64))
        and 1 <= a.shape[-1] <= MAX_N
        and a.shape[-2] >= a.shape[-1]
    )


def tsqr(a: Any, *, recompute: bool = True) -> tuple[Any, Any]:
    """Reduced QR of a tall-skinny CuPy matrix or stack of matrices by TSQR.

    Parameters
    ----------
    a : cupy.ndarray
        ``(..., m, n)``, float32 or float64, ``m >= n``, ``1 <= n <= MAX_N``.
        Not modified.
    recompute : bool, default True
        Re-factorize level-0 tiles in the final pass instead of storing their
        reflectors (one pass over memory less, twice the tile arithmetic).

    Returns
    -------
    q : cupy.ndarray
        ``(..., m, n)`` with orthonormal columns.
    r : cupy.ndarray
        ``(..., n, n)`` upper triangular, ``a = q @ r``. Diagonal signs follow
        the Householder convention of the tree's top tile (module docstring).

    Raises
    ------
    TypeError
        If ``a`` is not a float32/float64 CuPy array.
    ValueError
        If ``a`` has fewer than 2 dimensions, ``m < n`` or ``n > MAX_N``.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> a = cp.random.standard_normal((1 << 20, 32))  # doctest: +SKIP
    >>> q, r = tsqr(a)  # doctest: +SKIP
    """
    import cupy as cp

    if not isinstance(a, cp.ndarray):
        raise TypeError(f"tsqr: expected a CuPy array for a, got {type(a).__name__}")
    if a.dtype not in (cp.float32, cp.float64):
        raise TypeError(f"tsqr: expected a of dtype float32 or float64, got {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"tsqr: expected a with at least 2 dimensions, got shape {a.shape}")
    *batch, m, n = a.shape
    if m < n:
        raise ValueError(f"tsqr: expected a tall or square a (m >= n), got shape {a.shape}")
    if n > MAX_N:
        raise ValueError(f"tsqr: expected at most {MAX_N} columns in a, got {n}")
    nb = math.prod(batch)
    q = cp.empty(a.shape, dtype=a.dtype)
    r = cp.zeros((*batch, n, n), dtype=a.dtype)
    if nb == 0 or n == 0:
        return q, r
    a3 = cp.ascontiguousarray(a).reshape(nb, m, n)
    q3 = q.reshape(nb, m, n)
    r3 = r.reshape(nb, n, n)
    levels = plan_tree(m, n)
    top = len(levels) - 1
    # stacks[l]: the matrix of level l >= 1 (the stacked R's below it); in place
    # it then holds that level's reflectors and finally its Q.
    stacks = [a3] + [cp.empty((nb, lvl.rows, n), dtype=a.dtype) for lvl in levels[1:]]
    taus = [cp.empty((nb, lvl.ntiles, n), dtype=a.dtype) for lvl in levels[:-1]]
    if top == 0:  # one tile per matrix (the batched small QR): a single launch
        _launch(cp, levels[0], n, nb, 2, _FLAG_R, a3, q3, r3, r3, a3)
        return q, r
    flags0 = _FLAG_R if recompute else _FLAG_R | _FLAG_V | _FLAG_TAU
    _launch(cp, levels[0], n, nb, 0, flags0, a3, q3, stacks[1], taus[0], a3)
    for l in range(1, top):
        s = stacks[l]
        _launch(cp, levels[l], n, nb, 0, _FLAG_V | _FLAG_R | _FLAG_TAU, s, s, stacks[l + 1],
                taus[l], s)
    _launch(cp, levels[top], n, nb, 2, _FLAG_R, stacks[top], stacks[top], r3, r3, stacks[top])
    for l in range(top - 1, 0, -1):
        s = stacks[l]
        _launch(cp, levels[l], n, nb, 1, _FLAG_C, s, s, r3, taus[l], stacks[l + 1])
    if recompute:
        _launch(cp, levels[0], n, nb, 2, _FLAG_C, a3, q3, r3, r3, stacks[1])
    else:
        _launch(cp, levels[0], n, nb, 1, _FLAG_C, q3, q3, r3, taus[0], stacks[1])
    return q, r
