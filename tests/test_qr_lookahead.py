"""Look-ahead in the tiled Householder QR: the columns past the next panel are updated on
the backend's lane (a second CUDA stream on CuPy) while the next panel is factored.

On NumPy the lane is :class:`SerialLane` (everything in order), so these tests check the
split of each update into the next panel's columns and the rest; on CuPy they check the
overlapped run against the serial one: a missing wait or a freed operand would show as
an error far above the bounds below. Bounds: the TC-QR accuracy table's
(``tests/test_qr_methods.py``): backward error ``2 sqrt(n) u`` with ``u`` of the
precision's engine, orthogonality ``||I - Q^T Q||_F / n <= sqrt(n) u / 4`` with ``u`` of
the dtype (a race gives O(1)).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from mpqr.backends import get_backend
from mpqr.backends._base import ArrayAPIBackend, SerialLane

import mpqr
from tests._qr_support import backward_error, geometric, orthogonality, unit_roundoff
from tests._support import to_numpy

# 384 columns: panels of 32 (householder_recursive.leaf_width), 12 of them
SHAPE = (512, 384)
PANEL = 32


class CountingLane(SerialLane):
    def __init__(self) -> None:
        self.runs = 0
        self.waits = 0

    def run_after(self, mark):
        self.runs += 1
        return super().run_after(mark)

    def main_waits(self) -> None:
        self.waits += 1


@pytest.mark.skip_xp_backend("numpy_readonly", reason="the tiled QR of read-only inputs, "
                             "lane included: tests/test_qr_methods.py::test_householder_accuracy")
@pytest.mark.parametrize("precision", ["fp64", "fp16", "fp32-emulated", "fp64-emulated"])
def test_tiled_with_lane_is_accurate(xp, precision):
    ns = sys.modules["mpqr._array_api"].array_namespace(xp.asarray(1.0))
    if precision != "fp64" and "fp16" not in get_backend(ns).capabilities:
        pytest.skip("backend without fp16/int8 engines")
    dt = np.float32 if precision in ("fp16", "fp32-emulated") else np.float64
    a = geometric(np.random.default_rng(1), *SHAPE, 1e2).astype(dt)
    x = xp.asarray(a)
    q, r = mpqr.qr(x, method="householder-tiled", precision=precision)
    np.testing.assert_array_equal(to_numpy(x), a)
    n = SHAPE[1]
    assert backward_error(a, q, r) <= 2 * np.sqrt(n) * unit_roundoff(precision, dt)
    # Householder Q is orthogonal to the dtype's precision; at fp16 the data each product
    # rounds once leaves 4 u16 / sqrt(n) (tests/test_qr_accuracy_fp16.py)
    u_work = unit_roundoff("fp32" if dt == np.float32 else "fp64", dt)
    bound = 4 * 2.0**-11 / np.sqrt(n) if precision == "fp16" else np.sqrt(n) * u_work / 4
    assert orthogonality(q) <= bound


def test_every_panel_but_the_last_two_hands_its_rest_to_the_lane(monkeypatch):
    lane = CountingLane()
    monkeypatch.setattr(ArrayAPIBackend, "update_lane", lambda self, a: lane)
    a = geometric(np.random.default_rng(2), *SHAPE, 10.0)
    mpqr.qr(a, method="householder-tiled", precision="fp64")
    panels = SHAPE[1] // PANEL
    assert lane.runs == panels - 2  # the last panel has no rest, the one before none past it
    assert lane.waits == panels  # before each next-panel update, and once at the end


@pytest.mark.parametrize("mode", ["reduced", "r"])
@pytest.mark.parametrize("precision", ["fp64", "fp16", "fp64-emulated"])
def test_cupy_lane_matches_the_serial_run(monkeypatch, mode, precision):
    cp = pytest.importorskip("cupy")
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    from mpqr.backends.cupy.backend import CupyBackend

    dt = cp.float32 if precision == "fp16" else cp.float64
    a = cp.asarray(geometric(np.random.default_rng(3), *SHAPE, 1e3)).astype(dt)
    out = mpqr.qr(a, method="householder-tiled", precision=precision, mode=mode)
    with monkeypatch.context() as mp:
        mp.setattr(CupyBackend, "update_lane", lambda self, a: SerialLane())
        ref = mpqr.qr(a, method="householder-tiled", precision=precision, mode=mode)
    r, r_ref = (to_numpy(v[1] if mode == "reduced" else v) for v in (out, ref))
    u = unit_roundoff(precision, np.dtype(dt.__name__))
    # two runs of the same products: R agrees to the factorization's own accuracy
    err = np.linalg.norm(r - r_ref) / np.linalg.norm(r_ref)
    assert err <= 2 * np.sqrt(SHAPE[1]) * u * 1e3  # cond(A) = 1e3
    if mode == "reduced":
        assert backward_error(to_numpy(a), out[0], out[1]) <= 2 * np.sqrt(SHAPE[1]) * u


def test_cupy_lane_has_its_own_stream_and_handle_per_thread():
    cp = pytest.importorskip("cupy")
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    from mpqr.backends.cupy import lane as cupy_lane

    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(cp.zeros(1)))
    a = cp.zeros((8, 4))
    lane = be.update_lane(a)
    assert lane is be.update_lane(a)  # one per thread and device
    # complex and stacked products keep one queue (cupy.matmul's handle is shared)
    assert isinstance(be.update_lane(cp.zeros((8, 4), dtype=cp.complex128)), SerialLane)
    assert isinstance(be.update_lane(cp.zeros((2, 8, 4))), SerialLane)
    main_handle = be._cublas_handle()
    with lane.run_after(lane.mark()):
        assert cp.cuda.get_current_stream().ptr == lane.stream.ptr
        assert be._cublas_handle() == lane.handle != main_handle
    assert be._cublas_handle() == main_handle
    other = []
    t = threading.Thread(target=lambda: other.append(cupy_lane.lane_for_thread()))
    t.start()
    t.join()
    assert other[0] is not lane and other[0].handle != lane.handle
