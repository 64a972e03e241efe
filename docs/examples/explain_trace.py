"""What did mpqr do? The explain trace of a QR and a least-squares solve.

``mpqr.explain()`` records every decision of the calls inside it: the QR
method and why, each matrix product with the engine that ran it and why
(with the cost model's predicted times where there was a choice), and the
refinement steps of ``lstsq``. ``trace.summary()`` groups repeated products.

The output committed in ``docs/snippets/explain_trace.txt`` (shown on the
"How it works" page) is this script's output on the NumPy backend; CI checks
it is current. Regenerate it with
``python docs/examples/explain_trace.py > docs/snippets/explain_trace.txt``.
"""

from __future__ import annotations

import numpy as np

import mpqr


# --8<-- [start:main]
def main(m: int = 2000, n: int = 200, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n))
    b = rng.standard_normal(m)
    parts = []
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp32-emulated")
    parts += [f'# mpqr.qr(a, precision="fp32-emulated"), a: {m} x {n} float64', trace.summary()]
    with mpqr.explain() as trace:
        mpqr.matmul(a.T, a, precision="fp64-emulated")
    parts += ["", '# mpqr.matmul(a.T, a, precision="fp64-emulated")', str(trace)]
    with mpqr.explain() as trace:
        mpqr.lstsq(a, b, precision="fp16")
    parts += ["", '# mpqr.lstsq(a, b, precision="fp16")', trace.summary()]
    return "\n".join(parts) + "\n"
# --8<-- [end:main]


if __name__ == "__main__":
    print(main(), end="")
