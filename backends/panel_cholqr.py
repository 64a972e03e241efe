"""Certified Householder panels (portable): CholQR2 with float64 Gram matrices and the
reconstruction of the reflectors, in LAPACK's layout, in place.

The steps of ``kernels/panel_cholqr.cu`` (:mod:`mpqr.backends.cupy.panel_cholqr`) in the
same order, with the Array API: every backend without the kernels runs these, so the
CPU tests check the GPU route's numerics.

For a panel ``A`` (``m x n``, ``m >= n``), in float64 whatever ``A``'s storage:

1. ``R1 = chol(A^T A)``, ``X1 = R1^-1``; ``Q1 = A X1`` (on the GPU made row by row, never
   stored);
2. ``R2 = chol(Q1^T Q1)`` (where ``||Q1^T Q1 - I||_F^2 <= 2^-53``, the usual case, to
   first order: ``R2 = I + F``, ``R2^-1 = I - F`` with ``F`` the upper triangle of
   ``Q1^T Q1 - I``, its diagonal halved); the certificate is
   ``||Q1^T Q1 - I||_F <= 1/2`` and positive finite pivots in step 1 (CholQR2's condition
   for an orthonormal ``Q = Q1 R2^-1`` to working precision); ``R = R2 R1``;
3. the signed LU ``L U = Q[:n] - S`` (Ballard et al. 2014; LAPACK ``orhr_col``) gives the
   reflectors ``Y = [L; Q2 U^-1]`` and ``T = -U S L^-T`` with
   ``A = (I - Y T Y^T)[:, :n] (S R)``.

A failed certificate adds one to ``fails`` (an int32 array of one element on the panel's
device) instead of raising: the check is read once per factorization, which then runs
again by another route (one host sync instead of one per panel).
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device

__all__ = ["CERTIFIED_LEAF_COMBINED_W", "CERTIFIED_LEAF_LOOKAHEAD",
           "CERTIFIED_LEAF_RECURSIVE", "CERTIFIED_LEAF_SCHEDULE_MIN_ROWS", "CERTIFIED_LEAF_SUB",
           "CERTIFIED_PANEL_MAX_N", "NEAR_IDENTITY",
           "certificate_failed", "certified_leaf", "certified_panel", "new_certificate"]

#: widest certified panel (the kernels hold one column per lane of a warp)
CERTIFIED_PANEL_MAX_N = 32
#: A certified leaf in sub-blocks of this many columns (a multiple of 32), or None: each
#: panel updates the sub-block's later columns only, and the sub-block's combined ``W``
#: (``W_j <- W_j - W_<j (Y_<j^T W_j)``) updates the leaf's later columns in one product of
#: depth ``CERTIFIED_LEAF_SUB`` instead of one rank-32 update per panel. None: every panel
#: updates the whole leaf. (Read at each call, by the portable loop and CuPy's.)
CERTIFIED_LEAF_SUB: int | None = None
#: A certified leaf with lookahead (whole-leaf updates only, :data:`CERTIFIED_LEAF_SUB`
#: None): each panel's update goes in two parts, the next panel's columns first, then the
#: rest of the leaf, so that the next panel can be factored while the rest is updated (on
#: CuPy on a second stream: the panel's serial steps keep a few SMs busy, the update the
#: rest). The same products on column slices of the same operands. (Read at each call,
#: by the portable loop and CuPy's.) With :data:`CERTIFIED_LEAF_COMBINED_W` and CuPy's ``Z``
#: layout, H200, one process: a 16384 x 1024 leaf and its W 7.4 against 8.5 ms (float32),
#: 6.9 against 8.5 (float64); the QR at 16384² fp32-emulated 264.1 against 267.4 ms, fp16
#: 145.3 against 146.4 (each alone was no faster; `python bench/probes/square_gpu.py`).
CERTIFIED_LEAF_LOOKAHEAD: bool = True
#: A certified leaf (whole-leaf updates) that combines its panels' W as it goes,
#: ``W_j <- W_j - W_<j (Y_<j^H W_j)`` after panel ``j``'s updates (with lookahead: beside
#: the next panel), so that the leaf's ``W = Y T`` needs no ``Y^H Y``, ``T`` and ``Y T`` of
#: its own afterwards. Where the caller asks for it (the leaf's W read later, its T not).
CERTIFIED_LEAF_COMBINED_W: bool = True
#: A certified leaf whose ``W`` is combined (:data:`CERTIFIED_LEAF_COMBINED_W`) factored by
#: halves, as the recursion above it is, down to single panels: the left half, the right
#: half's update ``B - Y1 (W1^H B)``, the right half, then ``W2 <- W2 - W1 (Y1^H W2)``.
#: The same flops as panel after panel, in products of up to half the leaf's width on each
#: side instead of rank-32 updates whose ``W^H B`` has a 32-row output. (Read at each call,
#: by the portable loop and CuPy's.) H200, the QR's medians off / on, alternated in one
#: process: 16384² fp32-emulated 196.0 / 191.3 ms, 65536 x 8192 255.0 / 237.1, 32768²
#: 1045.6 / 1013.6 (``python bench/probes/flag_ab.py OUT
#: mpqr.backends.panel_cholqr.CERTIFIED_LEAF_RECURSIVE=False,True``).
CERTIFIED_LEAF_RECURSIVE: bool = True
#: :data:`CERTIFIED_LEAF_LOOKAHEAD` and :data:`CERTIFIED_LEAF_COMBINED_W` only for leaves of
#: at least this many rows: where the GPU waits on the host their extra launches cost more
#: than they overlap (H200, the QR at 8192² with both against without: fp16 69.1 / 58.7 ms,
#: fp32-emulated 120.4 / 109.4; at 16384² 140.7 / 143.0 and 384.2 / 397.7 at fp64-emulated;
#: ``python bench/probes/square_gpu.py``)
CERTIFIED_LEAF_SCHEDULE_MIN_ROWS: int = 12288
#: ``||Q1^T Q1 - I||_F^2`` at or below which ``R2`` and ``R2^-1`` are taken to first order
#: (float64's unit roundoff: the second-order terms are below its rounding)
NEAR_IDENTITY = 2.0**-53


def new_certificate(self: Any, like: Any) -> Any:
    """A fresh certificate on ``like``'s device: int32 zeros, the failure count first
    (the GPU kernels keep their block counters in the other three)."""
    return self.xp.zeros((4,), dtype=self.xp.int32, device=device(like))


def certificate_failed(self: Any, fails: Any) -> bool:
    """Whether any certified panel counted into ``fails`` failed (one host sync)."""
    return bool(fails[0] != 0)


def certified_leaf(self: Any, work: Any, w_all: Any, c0: int, c1: int, cert: Any,
                   woff: int = 0, combine: bool = False) -> Any | None:
    """A backend's own certified leaf (:func:`mpqr.qr.panel_blocked.certified_leaf`: the
    same steps, its buffers and products in the backend's hands), or None: the portable
    loop runs."""
    return None


def _chol_upper(xp: Any, g: Any) -> Any | None:
    """Upper Cholesky factor of ``g``, or None where a pivot is not positive and finite."""
    if not bool(xp.all(xp.isfinite(g))):
        return None
    try:
        r = xp.linalg.cholesky(g, upper=True)
    except Exception:  # each library has its own LinAlgError: not positive definite
        return None
    return r if bool(xp.all(xp.isfinite(r))) else None


def certified_panel(self: Any, a: Any, w: Any | None, fails: Any) -> tuple[Any, Any]:
    """Factor the 2-D real panel view ``a`` in place (``S R`` on and above its diagonal,
    ``Y`` below) and write ``W = Y T`` into ``w`` (or skip it: None); see the module
    docstring. Returns ``(L, tau)``: ``Y``'s top block (explicit unit lower) and
    ``diag(T)``, in ``a``'s dtype. A failed certificate adds one to ``fails[0]`` and
    leaves ``a`` and ``w`` as they were (the returned factors are then meaningless)."""
    # a non-finite panel fails its certificate (checked below): no warnings on the way
    with self.ignore_fp_warnings():
        return _certified_panel(self, a, w, fails)


def _certified_panel(self: Any, a: Any, w: Any | None, fails: Any) -> tuple[Any, Any]:
    xp = self.xp
    m, n = a.shape
    f64 = xp.float64
    eye = xp.eye(n, dtype=f64, device=device(a))
    a64 = xp.astype(a, f64)
    r1 = _chol_upper(xp, xp.matrix_transpose(a64) @ a64)
    if r1 is None:
        fails[0] = fails[0] + 1
        return xp.eye(n, dtype=a.dtype, device=device(a)), xp.zeros(n, dtype=a.dtype,
                                                                      device=device(a))
    x1 = self.solve_triangular(r1, eye, lower=False)
    q1 = a64 @ x1
    g2 = xp.matrix_transpose(q1) @ q1
    e2 = xp.sum((g2 - eye) ** 2)
    if bool(e2 <= NEAR_IDENTITY):
        # R2 = I + F, X2 = I - F with F = triu(G2 - I), its diagonal halved: R2^T R2 and
        # X2 R2 are I to O(||G2 - I||^2), below float64's rounding
        f = xp.triu(g2, k=1) + xp.expand_dims(xp.linalg.diagonal(g2 - eye) * 0.5, axis=1) * eye
        r2, x2 = eye + f, eye - f
    else:
        r2 = _chol_upper(xp, g2)
        if r2 is None or not bool(e2 <= 0.25):
            fails[0] = fails[0] + 1
            return xp.eye(n, dtype=a.dtype, device=device(a)), xp.zeros(n, dtype=a.dtype,
                                                                          device=device(a))
        x2 = self.solve_triangular(r2, eye, lower=False)
    r = r2 @ r1
    l, u, s = self.lu_signed(q1[:n, :] @ x2)
    p = x2 @ self.solve_triangular(u, eye, lower=False)
    linv = self.solve_triangular(l, eye, lower=True, unit_diagonal=True)
    t = -(u * xp.expand_dims(s, axis=0)) @ xp.matrix_transpose(linv)
    top = xp.triu(xp.expand_dims(s, axis=1) * r) + xp.tril(l, k=-1)
    if w is not None:
        w[:n, :] = xp.astype(l @ t, w.dtype)
        if m > n:
            w[n:, :] = xp.astype(q1[n:, :] @ (p @ t), w.dtype)
    if m > n:
        a[n:, :] = xp.astype(q1[n:, :] @ p, a.dtype)
    a[:n, :] = xp.astype(top, a.dtype)
    return xp.astype(l, a.dtype), xp.astype(xp.linalg.diagonal(t), a.dtype)
