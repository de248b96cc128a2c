import math

import pytest
import torch
from _probe_models import Log, assert_untouched, batch, dead_relu_mlp, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

from nndx.collector.probes.overfit import overfit_one_batch


def test_healthy_classifier_fits_one_batch_and_stops_early():
    result = overfit_one_batch(mlp(), batch(), nn.CrossEntropyLoss(), steps=150)
    assert result.status == "passed" and result.task == "classification"
    assert result.final_accuracy == 1.0
    assert result.steps < 150 and len(result.losses) == result.steps + 1
    assert result.final_loss < result.initial_loss == result.losses[0]


def test_large_scale_regression_passes_relative_criterion():
    x, _ = batch()
    target = (x @ torch.randn(8, 1, generator=torch.Generator().manual_seed(3))) * 1000
    result = overfit_one_batch(mlp(out=1), (x, target), nn.MSELoss(), steps=300)
    assert result.task == "regression" and result.final_accuracy is None
    assert result.status == "passed"
    assert result.final_loss > 0.1  # the lesson's absolute `loss < 0.1` would have failed it
    assert result.final_loss <= 0.01 * result.initial_loss


def test_dead_relu_network_cannot_fit():
    result = overfit_one_batch(dead_relu_mlp(), batch(), nn.CrossEntropyLoss(), steps=60)
    assert result.status == "failed"
    assert result.steps == 60 and result.final_accuracy < 1.0
    assert result.final_loss > 0.01 * result.initial_loss


def test_non_finite_loss_stops_and_fails():
    model = nn.Sequential(mlp(), Log())  # log of negative logits: NaN from the start
    result = overfit_one_batch(model, batch(), nn.CrossEntropyLoss(), steps=50)
    assert result.status == "failed" and "non-finite" in result.message
    assert result.steps == 0 and math.isnan(result.final_loss)


def test_task_from_loss_and_target_dtype():
    x, y = batch()
    bce = overfit_one_batch(mlp(out=1), (x, (y > 0).float().unsqueeze(1)), nn.BCEWithLogitsLoss(), steps=3)
    assert bce.task == "classification" and bce.final_accuracy is not None
    integer_targets = overfit_one_batch(mlp(), (x, y), lambda out, t: nn.functional.cross_entropy(out, t), steps=2)
    assert integer_targets.task == "classification"


def test_no_trainable_parameters_fails_clearly_and_bad_steps_raise():
    model = mlp()
    model.requires_grad_(False)
    result = overfit_one_batch(model, batch(), nn.CrossEntropyLoss())
    assert result.status == "failed" and "no trainable" in result.message
    with pytest.raises(ValueError, match="steps"):
        overfit_one_batch(mlp(), batch(), nn.CrossEntropyLoss(), steps=0)


def test_users_model_and_rng_untouched():
    model = mlp(dropout=0.2, batchnorm=True)
    before = snapshot(model)
    overfit_one_batch(model, batch(), nn.CrossEntropyLoss(), steps=5)
    assert_untouched(before, model)
