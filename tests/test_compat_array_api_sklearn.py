"""scikit-learn's own array-API tests for PCA (full; randomized with the QR normalizer),
Ridge(solver="svd"), randomized_svd and LinearDiscriminantAnalysis(solver="svd"), run on
NumPy and array-api-strict in a pytest subprocess under ``mpqr.compat.array_api.patch()``
(plugin ``tests/external/route_array_api.py``): they must pass, and their QR and SVD calls
must have reached mpqr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sklearn = pytest.importorskip("sklearn")
pytest.importorskip("array_api_strict")

HERE = Path(__file__).parent
SK = Path(sklearn.__file__).parent
FILES = (SK / "utils" / "tests" / "test_extmath.py", SK / "decomposition" / "tests" / "test_pca.py",
         SK / "linear_model" / "tests" / "test_ridge.py",
         HERE / "external" / "sklearn_lda_array_api.py")
# LDA's check_array_api_input_and_values compares scalings_, singular vectors whose signs
# are LAPACK's choice (SciPy's gesdd on the NumPy side): any other SVD, cuSOLVER's
# included, may flip them; test_lda_svd_same_fit compares what is sign-free instead
SELECT = ("(numpy or strict) and (randomized_svd_array_api_compliance"
          " or (test_pca_array_api_compliance and (full or randomized))"
          " or (test_ridge_array_api_compliance and not Classifier and not CV)"
          " or (test_lda_svd_array_api and not values) or test_lda_svd_same_fit)")


def test_sklearn_array_api_suites_under_the_patch(tmp_path):
    present = [f for f in FILES if f.exists()]
    if len(present) < len(FILES):
        pytest.skip("scikit-learn ships without its tests here")
    calls = tmp_path / "calls.json"
    env = {**os.environ, "SCIPY_ARRAY_API": "1", "MPQR_ROUTED_CALLS": str(calls),
           "PYTHONPATH": os.pathsep.join([str(HERE / "external"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "--rootdir", str(tmp_path),
           "-o", "addopts=", "-p", "route_array_api", "-p", "no:cacheprovider",
           "-p", "no:xdist", "-p", "no:randomly", "-k", SELECT, *map(str, present)]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
    counts = json.loads(calls.read_text())
    assert "test_lda_svd_same_fit" not in tail  # ran and passed (-q names only failures)
    for ns in ("numpy", "array_api_strict"):
        for f in ("linalg.qr", "linalg.svd"):
            assert counts.get(f"{ns}.{f}", 0) > 0, (ns, f, counts, tail)

