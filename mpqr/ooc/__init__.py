"""Out-of-core QR and least squares: host arrays streamed through a device-memory
budget (see the Out-of-core page of the documentation)."""

from mpqr.ooc.budget import BudgetTooSmall, parse_budget

__all__ = ["BudgetTooSmall", "parse_budget"]
