from _probe_models import assert_untouched, batch, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

from nndx.collector.probes.eval_mode import eval_mode_consistency


class AlwaysDropout(nn.Module):
    def forward(self, x):
        return nn.functional.dropout(x, 0.5, training=True)  # ignores model.eval()


def test_dropout_in_train_mode_is_evidence_of_forgotten_eval():
    result = eval_mode_consistency(mlp(dropout=0.5), batch())
    assert result.status == "failed" and result.training and result.has_dropout
    assert result.max_abs_diff > 0 and result.eval_abs_diff == 0
    assert "model.eval()" in result.message


def test_eval_mode_model_with_dropout_and_batchnorm_is_consistent():
    model = mlp(dropout=0.5, batchnorm=True).eval()
    result = eval_mode_consistency(model, batch())
    assert result.status == "passed" and result.training is False
    assert result.has_dropout and result.has_batchnorm
    assert result.max_abs_diff == 0 and result.batch_dependence_diff == 0


def test_batchnorm_in_train_mode_makes_outputs_depend_on_the_batch():
    result = eval_mode_consistency(mlp(batchnorm=True), batch())
    assert result.max_abs_diff == 0  # the same batch twice is identical under batch-norm...
    assert result.batch_dependence_diff > 0  # ...but a sample's output depends on its batch
    assert result.status == "failed" and "batch-norm" in result.message


def test_plain_model_in_train_mode_is_not_a_false_alarm():
    result = eval_mode_consistency(mlp(), batch())
    assert result.status == "passed" and result.training and result.max_abs_diff == 0


def test_dropout_that_ignores_eval_mode_is_caught_in_eval_mode():
    model = nn.Sequential(nn.Linear(8, 8), AlwaysDropout(), nn.Linear(8, 3)).eval()
    result = eval_mode_consistency(model, batch())
    assert result.status == "failed" and result.eval_abs_diff > 0
    assert "ignores model.eval()" in result.message


def test_batchnorm_running_stats_and_rng_of_the_user_untouched():
    model = mlp(batchnorm=True, dropout=0.3)
    before = snapshot(model)
    eval_mode_consistency(model, batch())
    assert_untouched(before, model)
    assert model.training


class SequenceFirst(nn.Module):
    """Takes (batch, features), returns (time, batch, features): not batch-first."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        return self.linear(x).unsqueeze(0).expand(4, -1, -1)


def test_output_not_batch_first_is_not_a_false_alarm():
    result = eval_mode_consistency(SequenceFirst(), batch())
    assert result.status == "passed" and result.batch_dependence_diff is None
