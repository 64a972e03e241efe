"""QR factorizations (filled by the QR work)."""
