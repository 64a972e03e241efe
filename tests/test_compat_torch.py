"""mpqr.compat.torch: torch.linalg's contract, checked against torch itself on the same
inputs (PyTorch's own OpInfo samples), with CPU tensors routed through mpqr
(``patch(devices=("cpu",))``) so that mpqr's emulation is what is tested."""

from __future__ import annotations

import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing's OpInfo database needs it

import mpqr.compat.scipy as mcs  # noqa: E402
import mpqr.compat.torch as mct  # noqa: E402
from torch.linalg import lstsq as imported_lstsq  # noqa: E402
from torch.linalg import qr as imported_qr  # noqa: E402

import mpqr  # noqa: E402

ORIG = {n: mct.original(n) for n in ("qr", "lstsq", "svd", "svdvals")}
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
CPU = {"devices": ("cpu",), "svd_min_aspect": 1}  # route every CPU call


@pytest.fixture(scope="module")
def ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.name: op for op in op_db if op.name in
            ("linalg.qr", "linalg.lstsq", "linalg.svd", "linalg.svdvals")
            and not op.variant_test_name}


def _eps(dtype):
    return torch.finfo({torch.complex64: torch.float32,
                        torch.complex128: torch.float64}.get(dtype, dtype)).eps


def _tol(a):
    """u x size x kappa (kappa of the matrices, from float64 singular values)."""
    s = torch.linalg.svdvals(a.detach().to(torch.complex128 if a.is_complex()
                                           else torch.float64))
    kappa = float((s[..., 0] / s[..., -1]).max()) if s.numel() else 1.0
    return 20 * max(a.shape[-2:]) * _eps(a.dtype) * kappa


def _close(x, y, tol):
    x, y = x.to(torch.complex128 if x.is_complex() else torch.float64), \
        y.to(torch.complex128 if y.is_complex() else torch.float64)
    scale = max(1.0, float(y.abs().max())) if y.numel() else 1.0
    err = float((x - y).abs().max()) if x.numel() else 0.0
    assert err <= tol * scale, (err, tol * scale)


def _routed(trace, name):
    return sum(1 for e in trace.events if e.kind == "compat" and e.data.get("routed")
               and e.data.get("function") == name)


def _same_layout(got, want):
    assert type(got) is type(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == w.device


def _phases(d):
    """The unit scalars that make ``d`` real and >= 0."""
    ph = torch.sgn(d)
    return torch.where(ph == 0, torch.ones_like(ph), ph)


@mct.patch(**CPU)
def test_qr_opinfo_samples_every_mode(ops):
    for dtype in DTYPES:
        for sample in ops["linalg.qr"].sample_inputs("cpu", dtype):
            a = sample.input
            for mode in ("reduced", "complete", "r"):
                want = ORIG["qr"](a, mode=mode)
                with mpqr.explain() as trace:
                    got = torch.linalg.qr(a, mode=mode)
                _same_layout(got, want)
                if a.numel() == 0:  # nothing to compute: torch's own path
                    assert _routed(trace, "qr") == 0
                    assert all(torch.equal(g, w) for g, w in zip(got, want))
                    continue
                assert _routed(trace, "qr") == 1
                m, n = a.shape[-2:]
                k, tol = min(m, n), _tol(a)
                q, r = got
                assert torch.equal(r, r.triu())
                d = torch.diagonal(r[..., :k, :k], dim1=-2, dim2=-1)
                assert bool((d.imag.abs() == 0).all() if d.is_complex() else True)
                assert bool((d.real >= 0).all())
                # torch's R with its rows' signs made mpqr's (diag(R) >= 0): the same R
                dt = torch.diagonal(want.R[..., :k, :k], dim1=-2, dim2=-1)
                ph = _phases(dt)
                _close(r[..., :k, :], ph.conj().unsqueeze(-1) * want.R[..., :k, :], tol)
                if mode == "r":
                    continue
                _close(q @ r, a, tol)
                eye = torch.eye(q.shape[-1], dtype=q.dtype)
                _close(q.mH @ q, eye.expand_as(q.mH @ q), tol)
                _close(q[..., :, :k], want.Q[..., :, :k] * ph.unsqueeze(-2), tol)


@mct.patch(**CPU)
def test_lstsq_opinfo_samples_every_driver(ops):
    for dtype in DTYPES:
        for sample in ops["linalg.lstsq"].sample_inputs("cpu", dtype):
            a, b, driver = sample.input, sample.args[0], sample.kwargs.get("driver")
            _check_lstsq(a, b, driver=driver)


def _check_lstsq(a, b, ref_driver=None, **kw):
    """mpqr's routed lstsq against torch's own; ``ref_driver``: the solution and rank
    taken from torch with that driver instead (the layout still from ``kw``'s)."""
    want = ORIG["lstsq"](a, b, **kw)
    with mpqr.explain() as trace:
        got = torch.linalg.lstsq(a, b, **kw)
    assert _routed(trace, "lstsq") == 1
    _same_layout(got, want)
    if ref_driver is not None:
        ref = ORIG["lstsq"](a, b, **{**kw, "driver": ref_driver})
        want = type(want)((ref.solution, want.residuals, ref.rank, want.singular_values))
    tol = _tol(a) * max(1.0, _tol(a) / (20 * max(a.shape[-2:]) * _eps(a.dtype)))
    _close(got.solution, want.solution, tol)
    _close(got.residuals, want.residuals, tol)
    _close(got.singular_values, want.singular_values, tol)
    assert torch.equal(got.rank, want.rank)
    return got


@mct.patch(**CPU)
def test_lstsq_defaults_vectors_broadcasting_rcond_and_rank():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 3, dtype=torch.float64, generator=g)
    b = torch.randn(6, 2, dtype=torch.float64, generator=g)
    _check_lstsq(a, b)  # default driver on CPU: gelsy
    for driver in ("gels", "gelsd", "GELSS"):
        _check_lstsq(a, b[:, 0], driver=driver)  # a vector B: (n,) and (1,) residuals
    _check_lstsq(torch.randn(1, 5, 3, generator=g), torch.randn(4, 5, 2, generator=g),
                 driver="gelsd")  # rank and singular values keep A's batch shape
    _check_lstsq(torch.randn(2, 1, 6, 3, generator=g), torch.randn(1, 3, 6, 1, generator=g),
                 driver="gelss")
    # rank deficient: the rank at rcond, no residuals for gelsd, the minimum-norm solution
    ad = torch.cat([a, a[:, :1] * 2], dim=1)
    for driver in ("gelsy", "gelsd", "gelss"):
        # torch's own gelsy put this rank-3 matrix's rank at 2 in one run of the suite on
        # a loaded two-core host: its minimum-norm solution and rank are checked against
        # the SVD's (the same solution), its layout against gelsy's
        got = _check_lstsq(ad, b, driver=driver, rcond=1e-10,
                           ref_driver="gelsd" if driver == "gelsy" else None)
        assert int(got.rank) == 3
    x = _check_lstsq(a, b, rcond=0.7, driver="gelsd")  # a cutoff that drops directions
    assert int(x.rank) < 3
    # gels assumes full rank: torch's CPU path raises, so does the routed call
    dup = torch.stack([a, a * torch.tensor([1.0, 1.0, 0.0], dtype=a.dtype)])  # a zero column
    with pytest.raises(torch.linalg.LinAlgError) as theirs:
        ORIG["lstsq"](dup, torch.stack([b, b]), driver="gels")
    with pytest.raises(torch.linalg.LinAlgError) as ours:
        torch.linalg.lstsq(dup, torch.stack([b, b]), driver="gels")
    assert str(ours.value) == str(theirs.value)


@mct.patch(**CPU)
def test_svd_and_svdvals_opinfo_samples(ops):
    for dtype in DTYPES:
        seen = set()  # the samples repeat each shape for gradient variants: once each
        for sample in ops["linalg.svd"].sample_inputs("cpu", dtype):
            a, full = sample.input, sample.kwargs.get("full_matrices", True)
            if (a.shape, full) in seen:
                continue
            seen.add((a.shape, full))
            want = ORIG["svd"](a, full_matrices=full)
            with mpqr.explain() as trace:
                got = torch.linalg.svd(a, full_matrices=full)
            _same_layout(got, want)
            if full or a.numel() == 0:  # the QR-SVD serves the thin factorization only
                assert _routed(trace, "svd") == 0
                assert all(torch.equal(g, w) for g, w in zip(got, want))
                continue
            assert _routed(trace, "svd") == 1
            u, s, vh = got
            tol = _tol(a)
            _close(s, want.S, tol)
            _close(u @ torch.diag_embed(s.to(u.dtype)) @ vh, a, tol)
            # each singular vector is torch's up to a unit factor (distinct values)
            _close((u.mH @ want.U).abs(), torch.eye(s.shape[-1]).expand(
                *s.shape, s.shape[-1]), tol * 10)
        for sample in ops["linalg.svdvals"].sample_inputs("cpu", dtype):
            a = sample.input
            want = ORIG["svdvals"](a)
            with mpqr.explain() as trace:
                got = torch.linalg.svdvals(a)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert _routed(trace, "svdvals") == (a.numel() > 0)
            _close(got, want, _tol(a) if a.numel() else 0.0)


def test_svd_routes_only_tall_or_wide_by_default():
    a = torch.randn(8, 6, dtype=torch.float64)
    with mpqr.explain() as trace, mct.patch(devices=("cpu",)):
        torch.linalg.svd(a, full_matrices=False)
        torch.linalg.svdvals(a)
        torch.linalg.svd(a[:, :3], full_matrices=False)
    kept = [e.message for e in trace.events if e.kind == "compat" and not e.data["routed"]]
    assert len(kept) == 2 and all("not 2 times as tall" in m for m in kept)
    assert _routed(trace, "svd") == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_computed_in_float32(dtype):
    """torch's CPU kernels refuse float16/bfloat16; routed, they are computed in float32
    and returned in the input's dtype, as accurate as the input's unit roundoff allows."""
    g = torch.Generator().manual_seed(1)
    a64 = torch.randn(4, 64, 8, dtype=torch.float64, generator=g)
    b64 = torch.randn(4, 64, 2, dtype=torch.float64, generator=g)
    a, b = a64.to(dtype), b64.to(dtype)
    with pytest.raises(NotImplementedError):
        ORIG["qr"](a)
    with pytest.raises(RuntimeError):
        ORIG["lstsq"](a, b)
    u = _eps(dtype) / 2
    ref_a = a.to(torch.float64)  # the input as rounded: the problem actually posed
    with mct.patch(**CPU):
        q, r = torch.linalg.qr(a)
        x = torch.linalg.lstsq(a, b, driver="gelsd")
        s = torch.linalg.svdvals(a)
        u_, s_, vh = torch.linalg.svd(a, full_matrices=False)
    assert q.dtype == r.dtype == x.solution.dtype == s.dtype == u_.dtype == vh.dtype == dtype
    assert torch.equal(s_, s) or float((s_ - s).abs().max()) <= 4 * u * float(s.max())
    assert x.residuals.dtype == x.singular_values.dtype == dtype
    # results rounded to the input's dtype: errors of a few u (u of float16/bfloat16)
    qd, rd = q.to(torch.float64), r.to(torch.float64)
    assert float((qd @ rd - ref_a).norm() / ref_a.norm()) <= 8 * 8 * u
    s_ref = torch.linalg.svdvals(ref_a)
    assert float(((s.to(torch.float64) - s_ref).abs() / s_ref[..., :1]).max()) <= 4 * u
    x_ref = torch.linalg.lstsq(ref_a, b.to(torch.float64), driver="gelsd").solution
    kappa = float((s_ref[..., 0] / s_ref[..., -1]).max())
    assert float((x.solution.to(torch.float64) - x_ref).abs().max()
                 / x_ref.abs().max()) <= 8 * u * kappa


def test_errors_are_torchs():
    a = torch.randn(5, 3)
    bad = [
        ("qr", (a,), {"mode": "economic"}), ("qr", (a[0],), {}),
        ("qr", (a.long(),), {}),
        ("lstsq", (a, torch.randn(4, 2)), {}), ("lstsq", (a, a.double()), {}),
        ("lstsq", (a, a), {"driver": "gelsx"}), ("lstsq", (a[0], a[0]), {}),
        ("lstsq", (a, torch.randn(2, 5, 2)), {}),
        ("lstsq", (a.long(), a.long()), {}),
        ("svd", (a[0],), {"full_matrices": False}), ("svdvals", (a.long(),), {}),
        ("svd", (a,), {"full_matrices": False, "driver": "gesvd"}),
    ]
    for name, args, kw in bad:
        with pytest.raises(Exception) as theirs:
            ORIG[name](*args, **kw)
        with mct.patch(**CPU), pytest.raises(type(theirs.value)) as ours:
            getattr(torch.linalg, name)(*args, **kw)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="`devices` must be"):
        mct.patch(devices=("tpu",))
    with pytest.raises(ValueError, match="`devices` must be"):
        mct.patch(devices="cpu")
    with pytest.raises(ValueError, match="`svd_min_aspect` must be"):
        mct.patch(svd_min_aspect=0.5)
    with pytest.raises(ValueError, match="`precision` must be one of"):
        mct.patch(precision="fp7")


def test_requires_grad_keeps_torchs_path_and_backward():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    with mpqr.explain() as trace, mct.patch(**CPU):
        q, r = torch.linalg.qr(a)
        (q.sum() + r.sum()).backward()
        with torch.no_grad():
            q2, _ = torch.linalg.qr(a)  # no gradient wanted: routed
    ga = a.grad.clone()
    a.grad = None
    qt, rt = ORIG["qr"](a)
    (qt.sum() + rt.sum()).backward()
    assert torch.equal(ga, a.grad) and torch.equal(q, qt)
    assert any("requires grad" in e.message for e in trace.events if e.kind == "compat")
    assert _routed(trace, "qr") == 1 and not q2.requires_grad


def test_device_rule_out_and_tracers_keep_torchs_path():
    a = torch.randn(6, 3, dtype=torch.float64)
    with mpqr.explain() as trace, mct.patch():  # default: CUDA tensors only
        q, r = torch.linalg.qr(a)
    assert torch.equal(q, ORIG["qr"](a).Q) and torch.equal(r, ORIG["qr"](a).R)
    assert _routed(trace, "qr") == 0
    assert any("is on cpu (routed devices: cuda)" in e.message for e in trace.events)
    with mpqr.explain() as trace, mct.patch(**CPU):
        out = (torch.empty(0, dtype=a.dtype), torch.empty(0, dtype=a.dtype))
        torch.linalg.qr(a, out=out)
        meta = torch.linalg.qr(a.to("meta"))
    assert _routed(trace, "qr") == 0 and meta.Q.is_meta
    assert torch.equal(out[0], ORIG["qr"](a).Q)


def test_program_that_imported_before_the_patch():
    prog = types.ModuleType("user_program")
    exec("from torch.linalg import qr, lstsq\n"
         "def fit(a, b):\n    return lstsq(a, b).solution, qr(a).R\n", prog.__dict__)
    sys.modules["user_program"] = prog
    try:
        a, b = torch.randn(9, 4, dtype=torch.float64), torch.randn(9, 1, dtype=torch.float64)
        with mpqr.explain() as trace, mct.patch(**CPU):
            assert imported_qr is mct.qr and imported_lstsq is mct.lstsq
            assert prog.qr is mct.qr and torch.linalg.svd is mct.svd
            x, r = prog.fit(a, b)
            assert bool((torch.diagonal(r) >= 0).all())  # mpqr's sign convention
        assert _routed(trace, "lstsq") == 1 and _routed(trace, "qr") == 1
        assert prog.qr is ORIG["qr"] and imported_qr is ORIG["qr"]
        assert torch.linalg.lstsq is ORIG["lstsq"] and torch.linalg.svdvals is ORIG["svdvals"]
        _close(x, ORIG["lstsq"](a, b).solution, _tol(a) * 10)
    finally:
        del sys.modules["user_program"]


def test_decorator_nesting_threads_and_scipy_side_by_side():
    a = torch.randn(40, 4, dtype=torch.float64)

    @mct.patch(precision="fp32-emulated", devices=("cpu",))
    def fit():
        return torch.linalg.qr(a)

    with mpqr.explain() as trace:
        fit()
    assert any(e.data.get("precision") == "fp32-emulated" for e in trace.events)
    assert torch.linalg.qr is ORIG["qr"]
    with mct.patch(devices=("cpu",)), mcs.patch():
        with mct.patch():  # inner block: CUDA only, this thread
            with mpqr.explain() as trace:
                torch.linalg.qr(a)
            assert _routed(trace, "qr") == 0
        assert torch.linalg.qr is mct.qr
        import scipy.linalg
        assert scipy.linalg.qr is mcs.qr
    assert torch.linalg.qr is ORIG["qr"] and scipy.linalg.qr is mcs.original("qr")
    with pytest.raises(RuntimeError, match="boom"), mct.patch():
        raise RuntimeError("boom")
    assert torch.linalg.qr is ORIG["qr"]

    errors = []
    with mct.patch(**CPU):
        want = torch.linalg.qr(a).R

    def worker():
        try:
            for _ in range(4):
                with mct.patch(**CPU):
                    _close(torch.linalg.qr(a).R, want, _tol(a))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and torch.linalg.qr is ORIG["qr"]


def test_torch_internals_reach_the_patch():
    """torch's own Python code looks ``torch.linalg.qr`` up at call time (here
    ``nn.init.orthogonal_``): it is routed too."""
    w = torch.empty(64, 8, dtype=torch.float64)
    with mpqr.explain() as trace, mct.patch(**CPU):
        torch.nn.init.orthogonal_(w)
    assert _routed(trace, "qr") == 1
    _close(w.T @ w, torch.eye(8, dtype=torch.float64), 1e-13)


def test_calls_from_mpqrs_own_modules_reach_torch(tmp_path, monkeypatch):
    """mpqr's backends call the libraries' linalg by attribute: under the patch those
    calls reach the library, never mpqr again (judged by the calling code's file)."""
    import importlib.util

    from mpqr.compat import _patch

    src = tmp_path / "probe.py"
    src.write_text("import torch\ndef f(a):\n    return torch.linalg.qr(a), "
                   "torch.linalg.svdvals(a)\n")
    spec = importlib.util.spec_from_file_location("mpqr_probe", src)
    inner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inner)
    monkeypatch.setattr(_patch, "_mpqr_dirs", lambda: ((str(tmp_path),), "/nowhere/"))
    a = torch.randn(20, 3, dtype=torch.float64)
    with mpqr.explain() as trace, mct.patch(**CPU):
        (q, r), s = inner.f(a)
        assert _routed(trace, "qr") == 0 and _routed(trace, "svdvals") == 0
        monkeypatch.undo()  # the same code as a program's: routed
        inner.f(a)
    assert _routed(trace, "qr") == 1 and _routed(trace, "svdvals") == 1
    assert torch.equal(r, ORIG["qr"](a).R)
    assert torch.equal(q, ORIG["qr"](a).Q) and torch.equal(s, ORIG["svdvals"](a))


def test_finiteness_test_by_sum_is_exact():
    # huge finite entries overflow the one-pass sum: the exact test still routes them
    a = torch.tensor([[1e308, 0.0], [1e308, 1.0], [0.0, 1.0]], dtype=torch.float64)
    b = torch.ones(3, 1, dtype=torch.float64)
    with mpqr.explain() as trace, mct.patch(**CPU):
        got = torch.linalg.lstsq(a, b)
    assert _routed(trace, "lstsq") == 1
    # rank 1 (the second column is 1e-308 of the first): the truncated problem's
    # minimum-norm solution is [1e-308, 5e-617], i.e. [1e-308, 0], a subnormal; torch's own
    # gelsy (MKL) gives 2e-308 in some runs (its scaling loses the subnormal's bits), so
    # the reference is the exact value, not torch's answer
    assert torch.allclose(got.solution, torch.tensor([[1e-308], [0.0]], dtype=torch.float64),
                          rtol=1e-12, atol=0)
    for bad in (float("nan"), float("inf")):
        a2 = a.clone()
        a2[2, 0] = bad
        with mpqr.explain() as trace, mct.patch(**CPU):
            try:  # torch's own handling: MKL's gelsy refuses NaN with an error
                torch.linalg.lstsq(a2, b)
            except RuntimeError:
                pass
        assert _routed(trace, "lstsq") == 0
        assert any("non-finite input" in e.message for e in trace.events)
