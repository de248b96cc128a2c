"""The label probes' reference MLPs, trained stacked: each as if it trained alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nndx.collector.probes._small_model import train_mlps


def _final(inputs, targets, outputs, seeds, test):
    kept = {}
    train_mlps(inputs, targets, outputs, seeds=seeds, steps=30, checkpoints={30},
               at_checkpoint=lambda predict, step: kept.update(logits=predict(test)))  # fmt: skip
    return kept["logits"]


@pytest.mark.parametrize("kind", ["classes", "real values"])
def test_stacked_models_of_different_sizes_train_as_if_alone(kind):
    """Three models with 50, 37 and 50 rows (the second padded) and their own seeds and
    targets: each one's predictions match the same model trained by itself."""
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(n, 5)) for n in (50, 37, 50)]
    if kind == "classes":
        targets, outputs = [rng.integers(0, 3, size=x.shape[0]) for x in inputs], 3
    else:
        targets, outputs = [rng.normal(size=(x.shape[0], 2)) for x in inputs], 2
    test = [torch.as_tensor(rng.normal(size=(8, 5)), dtype=torch.float32) for _ in inputs]
    together = _final(inputs, targets, outputs, [4, 5, 6], test)
    for k, seed in enumerate([4, 5, 6]):
        alone = _final([inputs[k]], [targets[k]], outputs, [seed], [test[k]])[0]
        torch.testing.assert_close(together[k], alone, rtol=1e-4, atol=1e-5)
    # and the three did not train alike: the stacking kept their data apart
    assert not torch.allclose(together[0], _final([inputs[1]], [targets[1]], outputs, [4], [test[0]])[0], atol=1e-3)


def test_mismatched_arguments_are_refused():
    x = np.zeros((10, 3))
    with pytest.raises(ValueError, match="as many"):
        train_mlps([x, x], [np.zeros(10, dtype=np.int64)], 2, seeds=[0, 1], steps=1)
