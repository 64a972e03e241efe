"""``torch.linalg`` front ends: ``qr``, ``lstsq``, ``svd`` and ``svdvals`` with PyTorch's
signatures, results and errors, computed by mpqr through the DLPack bridge.

:class:`patch` routes existing ``torch.linalg`` callers here (``from torch.linalg
import qr`` done before the patch included). A call is routed when every tensor
argument is a plain strided tensor of dtype float16, bfloat16, float32, float64,
complex64 or complex128 on one of the patch's ``devices`` (``("cuda",)`` by
default), holds data (not empty, not fake/meta or traced), needs no gradient and no
``out=`` is given; anything else keeps torch's own path, so torch's errors, autograd,
``out=`` semantics and tracing are torch's. ``mpqr.explain()`` records each routed
call and, while tracing, why a call kept torch's path.

float16 and bfloat16 (which torch's ``geqrf``, ``gels*`` and ``gesvd`` refuse) are
computed in float32 at the patch's precision and returned in the input's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from mpqr.compat import _patch

import mpqr
from mpqr.policy import record_event
from mpqr.policy.trace import tracing

__all__ = ["lstsq", "patch", "qr", "svd", "svdvals"]

_TORCH = _patch.Frontend("torch", (("torch.linalg", "qr"), ("torch.linalg", "lstsq"),
                                   ("torch.linalg", "svd"), ("torch.linalg", "svdvals")),
                         replacements="mpqr.compat.torch", requires="torch.linalg")
_DEFAULTS: dict[str, Any] = {"devices": ("cuda",), "svd_min_aspect": 2.0}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
           torch.complex128)
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")
#: a batch of more lstsq problems keeps torch's batched kernel on CUDA (mpqr solves a
#: batch one problem at a time)
MAX_LSTSQ_BATCH = 16


def original(name: str) -> Any:
    """torch's own ``torch.linalg`` function (never the patched one)."""
    return _TORCH.original(name)


class patch(_patch.Patch):
    """Route ``torch.linalg.qr``, ``lstsq``, ``svd`` and ``svdvals`` to mpqr inside a block.

    Usable as a context manager or a decorator; thread-safe and re-entrant (the
    innermost block of a thread sets the precision and options). Everything is
    restored when the outermost block exits, exceptions included.

    Parameters
    ----------
    precision : str, optional
        Precision of the routed calls (see :func:`mpqr.qr`); ``None`` uses the
        ``mpqr.precision`` setting (``"auto"``: the input's working accuracy).
    devices : tuple of {"cuda", "cpu"}
        Device types whose tensors are routed. CPU tensors keep torch's LAPACK path by
        default; ``devices=("cuda", "cpu")`` routes them through mpqr's NumPy backend
        (the same contract, e.g. to test a program without a GPU).
    svd_min_aspect : float
        ``svd(full_matrices=False)`` and ``svdvals`` are routed (QR-SVD) only for
        ``max(m, n) >= svd_min_aspect * min(m, n)``, where the QR does the bulk of the
        work; ``1`` routes every shape.

    Raises
    ------
    ValueError
        An unknown ``precision``, a ``devices`` entry other than ``"cuda"``/``"cpu"``,
        or ``svd_min_aspect`` below 1.

    Examples
    --------
    >>> import torch, mpqr, mpqr.compat.torch as mct
    >>> a = torch.randn(100, 4, dtype=torch.float64)
    >>> with mpqr.explain() as trace, mct.patch(devices=("cpu",)):
    ...     q, r = torch.linalg.qr(a)
    >>> any("routed to mpqr.qr" in e.message for e in trace.events)
    True
    """

    frontend = _TORCH

    def __init__(self, precision: str | None = None, *, devices: Any = ("cuda",),
                 svd_min_aspect: float = 2.0):
        if isinstance(devices, str) or not all(d in ("cuda", "cpu") for d in devices) \
                or not devices:
            raise ValueError(f"`devices` must be a non-empty tuple of 'cuda' and 'cpu'; "
                             f"got {devices!r}")
        if isinstance(svd_min_aspect, bool) or not isinstance(svd_min_aspect, (int, float)) \
                or not svd_min_aspect >= 1:
            raise ValueError(f"`svd_min_aspect` must be a number >= 1; got {svd_min_aspect!r}")
        super().__init__(precision, devices=tuple(devices),
                         svd_min_aspect=float(svd_min_aspect))


def _options() -> dict[str, Any]:
    return _TORCH.current_options() or _DEFAULTS


def _traced(t: torch.Tensor) -> bool:
    """A tensor without data or under a tracer (torch.compile, export, torch.func)."""
    from torch._subclasses.fake_tensor import is_fake
    from torch.fx.experimental import proxy_tensor

    get_proxy_mode = getattr(proxy_tensor, "get_proxy_mode", lambda: None)
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda _: False)
    return t.is_meta or is_fake(t) or wrapped(t) or get_proxy_mode() is not None


def _kept(tensors: dict[str, Any], out: Any = None, depth: int = 3) -> str | None:
    """Why a call keeps torch's path (None: route it); ``depth``: the frames up to the
    front end's caller."""
    if _patch.inside() or _patch.called_from_mpqr(depth):
        return "called from inside mpqr"
    if out is not None:
        return "`out=` given"
    devices = _options()["devices"]
    where = set()
    for n, t in tensors.items():
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            return f"`{n}` is a {type(t).__name__}"
        if t.layout != torch.strided:
            return f"`{n}` has layout {t.layout}"
        if t.dtype not in _DTYPES:
            return f"`{n}` has dtype {t.dtype}"
        if t.requires_grad and torch.is_grad_enabled():
            return f"`{n}` requires grad (torch's backward)"
        if t.device.type not in devices:
            return f"`{n}` is on {t.device.type} (routed devices: {', '.join(devices)})"
        if t.numel() == 0:
            return f"`{n}` is empty"
        if _traced(t):
            return f"`{n}` is traced or holds no data"
        where.add(t.device)
    if len(where) > 1:
        return "tensors on different devices"
    return None


def _keep(name: str, reason: str) -> None:
    if tracing():
        record_event("compat", f"torch.linalg.{name} kept on torch's path: {reason}",
                     frontend="torch", function=name, routed=False)


def _route(name: str, to: str, a: torch.Tensor, **args: Any) -> None:
    desc = ", ".join(f"{k}={v!r}" for k, v in args.items())
    record_event("compat", f"torch.linalg.{name} routed to {to}: {tuple(a.shape)} "
                           f"{str(a.dtype).removeprefix('torch.')} on {a.device}"
                           f"{', ' + desc if desc else ''}",
                 frontend="torch", function=name, routed=True,
                 precision=_patch.current_precision())


def _finite(*ts: torch.Tensor) -> bool:
    return _patch.all_finite(torch, *ts)


def _real(dtype: torch.dtype) -> torch.dtype:
    return _REAL.get(dtype, dtype)


def qr(A, mode="reduced", *, out=None):
    """:func:`torch.linalg.qr` computed by :func:`mpqr.qr`.

    Parameters
    ----------
    A : Tensor, shape (*, m, n)
    mode : {"reduced", "complete", "r"}
        As torch: ``"r"`` returns an empty ``Q`` (shape ``(0,)``).
    out : tuple of Tensor, optional
        Given: torch's own path.

    Returns
    -------
    torch.return_types.linalg_qr
        ``(Q, R)`` with ``Q`` ``(*, m, k)`` (``"complete"``: ``(*, m, m)``) and ``R``
        ``(*, k, n)`` (``(*, m, n)``), ``k = min(m, n)``, in ``A``'s dtype and on its
        device; ``diag(R) >= 0`` (mpqr's sign convention; LAPACK fixes none).

    Raises
    ------
    RuntimeError, NotImplementedError
        torch's own errors (an unknown mode, fewer than 2 dimensions, an integer
        dtype): such calls run torch's path.

    Examples
    --------
    >>> import torch
    >>> from mpqr.compat.torch import patch, qr
    >>> a = torch.randn(6, 3, dtype=torch.float64)
    >>> with patch(devices=("cpu",)):
    ...     q, r = qr(a)
    >>> bool(torch.allclose(q @ r, a))
    True
    """
    reason = _kept({"A": A}, out)
    if reason is None and (mode not in ("reduced", "complete", "r") or A.ndim < 2):
        reason = "torch's own error"
    if reason is not None:
        _keep("qr", reason)
        return original("qr")(A, mode=mode, out=out)
    _route("qr", "mpqr.qr", A, mode=mode)
    with _patch.routing():
        prec = _patch.current_precision()
        if mode == "r":
            r = mpqr.qr(A, mode="r", precision=prec)
            q = torch.empty(0, dtype=A.dtype, device=A.device)
        else:
            q, r = mpqr.qr(A, mode=mode, precision=prec)
    return torch.return_types.linalg_qr((q.to(A.dtype), r.to(A.dtype)))


def _svd_kept(A: Any, driver: Any, out: Any) -> str | None:
    reason = _kept({"A": A}, out, depth=4)
    if reason is None and driver is not None:
        reason = "`driver=` given"
    if reason is None and A.ndim < 2:
        reason = "torch's own error"
    if reason is None:
        m, n = A.shape[-2:]
        aspect = _options()["svd_min_aspect"]
        if max(m, n) < aspect * min(m, n):
            reason = f"{m} x {n} is not {aspect:g} times as tall as wide (or wide as tall)"
    if reason is None and not _finite(A):
        reason = "non-finite input (torch's error)"
    return reason


def svd(A, full_matrices=True, *, driver=None, out=None):
    """:func:`torch.linalg.svd` by the QR-SVD (:func:`mpqr.svd`) for tall or wide ``A``.

    Routed: ``full_matrices=False``, no ``driver``, finite ``A`` with
    ``max(m, n) >= svd_min_aspect * min(m, n)`` (see :class:`patch`); every other call
    runs torch's path.

    Parameters
    ----------
    A : Tensor, shape (*, m, n)
    full_matrices : bool
    driver : str, optional
        Given: torch's path (a cuSOLVER choice).
    out : tuple of Tensor, optional
        Given: torch's path.

    Returns
    -------
    torch.return_types.linalg_svd
        ``(U, S, Vh)``: ``(*, m, k)``, ``(*, k)`` real and descending, ``(*, k, n)``
        in ``A``'s dtype (``S`` in its real dtype). Singular vectors are unique up to
        a sign (a phase for complex input) per singular value, as in torch.

    Raises
    ------
    RuntimeError, torch.linalg.LinAlgError
        torch's own errors, on torch's path.

    Examples
    --------
    >>> import torch
    >>> from mpqr.compat.torch import patch, svd
    >>> a = torch.randn(40, 3, dtype=torch.float64)
    >>> with patch(devices=("cpu",)):
    ...     u, s, vh = svd(a, full_matrices=False)
    >>> bool(torch.allclose(s, torch.linalg.svdvals(a)))
    True
    """
    reason = "full_matrices is not False" if full_matrices is not False else None
    reason = reason or _svd_kept(A, driver, out)
    if reason is not None:
        _keep("svd", reason)
        return original("svd")(A, full_matrices=full_matrices, driver=driver, out=out)
    _route("svd", "mpqr.svd", A, full_matrices=False)
    with _patch.routing():
        u, s, vh = mpqr.svd(A, full_matrices=False, precision=_patch.current_precision())
    return torch.return_types.linalg_svd((u.to(A.dtype), s.to(_real(A.dtype)),
                                          vh.to(A.dtype)))


def svdvals(A, *, driver=None, out=None):
    """:func:`torch.linalg.svdvals` from the R of :func:`mpqr.qr` for tall or wide ``A``.

    ``A = Q R`` (``A^H`` when wide); the singular values of the small ``k x k`` factor
    ``R`` are ``A``'s. Routed under the same conditions as :func:`svd`.

    Parameters
    ----------
    A : Tensor, shape (*, m, n)
    driver, out
        Given: torch's path.

    Returns
    -------
    Tensor, shape (*, k)
        Descending, in ``A``'s real dtype.

    Raises
    ------
    RuntimeError, torch.linalg.LinAlgError
        torch's own errors, on torch's path.

    Examples
    --------
    >>> import torch
    >>> from mpqr.compat.torch import patch, svdvals
    >>> a = torch.randn(3, 50, dtype=torch.float64)
    >>> with patch(devices=("cpu",)):
    ...     s = svdvals(a)
    >>> bool(torch.allclose(s, torch.linalg.svd(a)[1]))
    True
    """
    reason = _svd_kept(A, driver, out)
    if reason is not None:
        _keep("svdvals", reason)
        return original("svdvals")(A, driver=driver, out=out)
    _route("svdvals", "mpqr.qr (R) + torch.linalg.svdvals of R", A)
    m, n = A.shape[-2:]
    with _patch.routing():
        r = mpqr.qr(A if m >= n else A.mH, mode="r", precision=_patch.current_precision())
        s = original("svdvals")(r)
    return s.to(_real(A.dtype))


def lstsq(A, B, rcond=None, *, driver=None, out=None):
    """:func:`torch.linalg.lstsq` computed by :func:`mpqr.lstsq`, its named tuple filled
    as torch fills it for the driver and device.

    Parameters
    ----------
    A : Tensor, shape (*, m, n)
    B : Tensor, shape (*, m, k), or (*, m) (one dimension fewer than ``A``)
        Batch dimensions broadcast with ``A``'s.
    rcond : float, optional
        Singular values ``<= rcond * s_max`` count as zero; default
        ``eps(A.dtype) * max(m, n)`` (torch's; float32's ``eps`` for float16 and
        bfloat16, which are computed in float32).
    driver : {"gels", "gelsy", "gelsd", "gelss"}, optional
        As torch (any case): default ``"gelsy"`` on CPU, ``"gels"`` on CUDA (its only
        one). The result's fields follow it: ``rank`` for gelsy/gelsd/gelss,
        ``singular_values`` for gelsd/gelss, ``residuals`` for ``m > n`` and a driver
        other than gelsy, with gelsd/gelss only when every matrix has rank ``n``.
    out : tuple of Tensor, optional
        Given: torch's path.

    Returns
    -------
    torch.return_types.linalg_lstsq
        ``(solution, residuals, rank, singular_values)``: ``(*, n, k)`` (``(*, n)``
        for a vector ``B``), ``(*, k)`` real or empty, int64 ``(*A,)`` or empty, real
        ``(*A, min(m, n))`` or empty; ``rank`` and ``singular_values`` have ``A``'s
        batch shape, as in torch. The solution is the minimum-norm one for
        rank-deficient ``A``.

    Raises
    ------
    torch.linalg.LinAlgError
        ``driver="gels"`` on the CPU with ``A`` not of full rank (numerical rank at
        ``rcond`` below ``min(m, n)``), as torch's LAPACK path; on CUDA, where torch's
        gels returns an undefined result, the minimum-norm solution is returned.
    RuntimeError
        torch's own errors (shapes, dtypes, drivers) on torch's path.

    Examples
    --------
    >>> import torch
    >>> from mpqr.compat.torch import lstsq, patch
    >>> a = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], dtype=torch.float64)
    >>> with patch(devices=("cpu",)):
    ...     res = lstsq(a, torch.tensor([[1.0], [2.0], [2.0]], dtype=torch.float64))
    >>> [round(v, 6) for v in res.solution[:, 0].tolist()], int(res.rank)
    ([0.666667, 0.5], 2)
    """
    reason = _kept({"A": A, "B": B}, out) or _lstsq_unrouted(A, B, rcond, driver)
    if reason is not None:
        _keep("lstsq", reason)
        return original("lstsq")(A, B, rcond, driver=driver, out=out)
    cuda = A.device.type == "cuda"
    drv = driver.lower() if driver is not None else ("gels" if cuda else "gelsy")
    vector = A.ndim - B.ndim == 1
    b2 = B.unsqueeze(-1) if vector else B
    (m, n), k = A.shape[-2:], b2.shape[-1]
    batch = torch.broadcast_shapes(A.shape[:-2], b2.shape[:-2])
    # float16/bfloat16 are computed in float32: the default cutoff is float32's (their
    # own eps times max(m, n) would drop most of the spectrum of a few dozen rows)
    work = torch.float32 if A.dtype in (torch.float16, torch.bfloat16) else A.dtype
    cutoff = float(rcond) if rcond is not None else \
        torch.finfo(_real(work)).eps * max(m, n)
    _route("lstsq", "mpqr.lstsq", A, driver=drv, rcond=cutoff)
    a3 = A.expand(*batch, m, n).reshape(-1, m, n)
    b3 = b2.expand(*batch, m, k).reshape(-1, m, k)
    xs, res, ranks, svs = [], [], [], []
    with _patch.routing():
        for i in range(a3.shape[0]):
            x, r, rank, s = mpqr.lstsq(a3[i], b3[i], cutoff, check_finite=False,
                                       lapack_driver="gelsy" if drv == "gelsy" else
                                       "gelss" if drv == "gelss" else "gelsd",
                                       precision=_patch.current_precision())
            if drv == "gels" and not cuda and int(rank) < min(m, n):
                where = f"(Batch element {i}): " if batch else ""
                raise torch.linalg.LinAlgError(
                    f"torch.linalg.lstsq: {where}The least squares solution could not be "
                    "computed because the input matrix does not have full rank (error "
                    f"code: {int(rank) + 1}).")
            if m > n and int(rank) < n:  # rank deficient: ||b - A x||^2 as gels gives it
                d = b3[i].to(x.dtype) - mpqr.matmul(a3[i].to(x.dtype), x, precision=(
                    "fp64" if x.dtype in (torch.float64, torch.complex128) else "fp32"))
                r = (d.abs() ** 2).sum(-2)
            xs.append(x)
            res.append(r)
            ranks.append(int(rank))
            svs.append(s)
    real = _real(A.dtype)
    solution = torch.stack(xs).reshape(*batch, n, k).to(A.dtype)
    rank_t = _a_batch(torch.tensor(ranks, dtype=torch.int64, device=A.device)
                      .reshape(tuple(batch)), A, batch, 0)
    full = bool((rank_t == n).all())
    if m > n and drv != "gelsy" and (drv == "gels" or full):
        residuals = torch.stack(res).reshape(*batch, k).to(real)
    else:
        residuals = torch.empty(0, dtype=real, device=A.device)
    if drv in ("gelsd", "gelss"):
        sv = _a_batch(torch.stack(svs).reshape(*batch, min(m, n)), A, batch, 1).to(real)
    else:
        sv = torch.empty(0, dtype=real, device=A.device)
    if drv == "gels":
        rank_t = torch.empty(0, dtype=torch.int64, device=A.device)
    return torch.return_types.linalg_lstsq(
        (solution.squeeze(-1) if vector else solution, residuals, rank_t, sv))


def _lstsq_unrouted(A: Any, B: Any, rcond: Any, driver: Any) -> str | None:
    """Why lstsq keeps torch's path once the tensors qualify (None: route it)."""
    if A.dtype != B.dtype or A.ndim < 2 or B.ndim < 1 or not 0 <= A.ndim - B.ndim <= 1:
        return "torch's own error"
    b2 = B.unsqueeze(-1) if A.ndim > B.ndim else B
    if b2.shape[-2] != A.shape[-2]:
        return "torch's own error"
    try:
        batch = torch.broadcast_shapes(A.shape[:-2], b2.shape[:-2])
    except RuntimeError:
        return "torch's own error"
    if rcond is not None and (isinstance(rcond, bool) or not isinstance(rcond, (int, float))
                              or not math.isfinite(rcond)):
        return "torch's own handling of `rcond`"
    cuda = A.device.type == "cuda"
    if driver is not None and (not isinstance(driver, str) or driver.lower() not in _DRIVERS
                               or (cuda and driver.lower() != "gels")):
        return "torch's own error"
    if cuda and A.shape[-2] < A.shape[-1]:
        return "underdetermined on CUDA (torch's own rule)"
    if cuda and math.prod(batch) > MAX_LSTSQ_BATCH:
        return f"a batch of {math.prod(batch)} problems (torch's batched gels)"
    if not _finite(A, B):
        return "non-finite input (torch's own handling)"
    return None


def _a_batch(t: torch.Tensor, A: torch.Tensor, batch: Any, core: int) -> torch.Tensor:
    """``t`` over the broadcast ``batch`` cut to ``A``'s batch shape (torch gives
    ``rank`` and ``singular_values`` per matrix of ``A``)."""
    abatch = (1,) * (len(batch) - (A.ndim - 2)) + tuple(A.shape[:-2])
    for d, (sa, sb) in enumerate(zip(abatch, batch)):
        if sa == 1 and sb != 1:
            t = t.narrow(d, 0, 1)
    return t.reshape((*A.shape[:-2], *t.shape[len(batch):len(batch) + core]))
