"""scikit-learn's own array-API estimator checks for LinearDiscriminantAnalysis (svd
solver), as its ``test_common`` runs them, without collecting its 13,000 other tests."""

import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.utils._array_api import yield_namespace_device_dtype_combinations
from sklearn.utils.estimator_checks import (
    check_array_api_input,
    check_array_api_input_and_values,
)


@pytest.mark.parametrize("array_namespace, device_name, dtype_name",
                         yield_namespace_device_dtype_combinations())
@pytest.mark.parametrize("check", [check_array_api_input, check_array_api_input_and_values])
def test_lda_svd_array_api(check, array_namespace, device_name, dtype_name):
    check("LinearDiscriminantAnalysis", LinearDiscriminantAnalysis(solver="svd"),
          array_namespace, device_name=device_name, dtype_name=dtype_name)


@pytest.mark.parametrize("array_namespace", ["numpy", "array_api_strict"])
def test_lda_svd_same_fit(array_namespace):
    """The array-API fit against the NumPy fit (SciPy's SVD) in what does not depend on
    the singular vectors' signs: predictions, probabilities, explained variance, and the
    transform up to each direction's sign."""
    import numpy as np
    from sklearn import config_context
    from sklearn.utils._array_api import move_to
    from sklearn.utils._testing import _array_api_for_tests

    xp, device = _array_api_for_tests(array_namespace, None, "float64")
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((200, 6)) + k for k in range(3)])
    y = np.repeat(np.arange(3), 200)
    ref = LinearDiscriminantAnalysis(solver="svd").fit(X, y)
    with config_context(array_api_dispatch=True):
        X_xp, y_xp = xp.asarray(X, device=device), xp.asarray(y, device=device)
        got = LinearDiscriminantAnalysis(solver="svd").fit(X_xp, y_xp)
        out = {name: move_to(getattr(got, name)(X_xp), xp=np, device="cpu")
               for name in ("predict", "predict_proba", "transform")}
        ratio = move_to(got.explained_variance_ratio_, xp=np, device="cpu")
    tol = 100 * X.shape[0] * np.finfo(np.float64).eps
    np.testing.assert_array_equal(out["predict"], ref.predict(X))
    np.testing.assert_allclose(out["predict_proba"], ref.predict_proba(X), atol=tol)
    np.testing.assert_allclose(ratio, ref.explained_variance_ratio_, atol=tol)
    t_ref = ref.transform(X)
    signs = np.sign(np.sum(out["transform"] * t_ref, axis=0))
    np.testing.assert_allclose(out["transform"] * signs, t_ref, atol=tol * np.abs(t_ref).max())
