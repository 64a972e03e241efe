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
