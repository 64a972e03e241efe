"""Exceptions raised by mpqr."""

from __future__ import annotations

import functools

from mpqr.backends.numpy.types import LINALG_ERROR

__all__ = ["BreakdownError", "DeviceMemoryError", "LinAlgError", "RefinementWarning"]


class LinAlgError(LINALG_ERROR):
    """A numerical linear-algebra failure.

    A subclass of ``numpy.linalg.LinAlgError`` (which ``scipy.linalg.LinAlgError``
    is) and so of ``ValueError``: ``except scipy.linalg.LinAlgError:`` written for
    SciPy, and ``except ValueError:``, catch it.
    """


#: attributes of a BreakdownError that stay in the process that raised it
_IN_PROCESS = frozenset({"first_gram", "certify_gram", "chain"})


class BreakdownError(LinAlgError):
    """A factorization method cannot handle this matrix.

    Attributes
    ----------
    method : str
        The method that broke down (e.g. ``"cholqr"``).
    cond_estimate : float or None
        The estimated 2-norm condition number that caused it, when known.
    """

    def __init__(self, message: str, *, method: str, cond_estimate: float | None = None):
        super().__init__(message)
        self.method = method
        self.cond_estimate = cond_estimate

    def __reduce__(self) -> tuple:
        # keyword-only arguments: pickled so that errors cross process boundaries
        # (not the arrays a failed CholQR pass hands to qr's next route: the input, its
        # Gram matrices and factors, meaningful only in this process)
        state = {k: v for k, v in vars(self).items() if k not in _IN_PROCESS}
        return (functools.partial(type(self), method=self.method,
                                  cond_estimate=self.cond_estimate), self.args, state)


class RefinementWarning(UserWarning):
    """An iterative refinement stopped before meeting its tolerance.

    The result returned alongside is the best iterate found (smallest
    normal-equation residual), never a silently wrong "converged" answer.
    """


class DeviceMemoryError(MemoryError):
    """A call needs more device memory than the device has free.

    Raised before the work starts, when the call's workspace estimate
    (:mod:`mpqr.qr.memory_plan`) exceeds the free device memory, and in place of the
    array library's own out-of-memory error when one comes from inside a call. A
    ``MemoryError``: ``except MemoryError:`` catches it.

    Attributes
    ----------
    needed : int or None
        Bytes the call's plan needs (``None`` where the library did not say).
    free : int or None
        Bytes free on the device when the call was checked (``None`` where unknown).
    """

    def __init__(self, message: str, *, needed: int | None = None,
                 free: int | None = None):
        super().__init__(message)
        self.needed = needed
        self.free = free

    def __reduce__(self) -> tuple:
        return (functools.partial(type(self), needed=self.needed, free=self.free),
                self.args)
