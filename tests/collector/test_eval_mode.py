import pytest
import torch
from _probe_models import assert_untouched, batch, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

import nndx
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
    assert result.has_dropout and result.has_batchnorm and result.ignores_eval is False
    # a half batch reduces in another order: equal within rounding, not necessarily exactly
    assert result.max_abs_diff <= result.tolerance and result.batch_dependence_diff <= result.tolerance
    assert 0 < result.tolerance < 1e-3


def test_batchnorm_in_train_mode_makes_outputs_depend_on_the_batch():
    result = eval_mode_consistency(mlp(batchnorm=True), batch())
    assert result.max_abs_diff == 0  # the same batch twice is identical under batch-norm...
    assert result.batch_dependence_diff > 0  # ...but a sample's output depends on its batch
    assert result.status == "failed" and "batch-norm" in result.message


class SortsTheBatch(nn.Module):
    """Sorts the batch by a score (as a packed-sequence forward sorts by length) and never
    restores the order: sample i's output is another sample's, in any mode."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 3)

    def forward(self, x):
        return self.body(x[x[:, 0].argsort()])


class BatchStatisticsAlways(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.norm = nn.Linear(8, 3), nn.BatchNorm1d(3, track_running_stats=False)

    def forward(self, x):
        return self.norm(self.body(x))


def test_a_batch_dependence_in_eval_mode_is_blamed_on_eval_mode_only_with_batch_statistics():
    sorted_ = eval_mode_consistency(SortsTheBatch().eval(), batch())
    assert sorted_.status == "failed" and sorted_.batch_statistics is False and "mixes samples" in sorted_.message
    always = eval_mode_consistency(BatchStatisticsAlways().eval(), batch())
    assert always.status == "failed" and always.batch_statistics is True and "batch-norm" in always.message
    report = nndx.probe(SortsTheBatch().eval(), batch(), nn.CrossEntropyLoss(), probes=["eval_mode"], progress=False)
    assert "NNDX609" not in {f.rule_id for f in nndx.diagnose(report).findings}
    report = nndx.probe(BatchStatisticsAlways().eval(), batch(), nn.CrossEntropyLoss(), probes=["eval_mode"],
                        progress=False)  # fmt: skip
    assert "NNDX609" in {f.rule_id for f in nndx.diagnose(report).findings}


def test_plain_model_in_train_mode_is_not_a_false_alarm():
    result = eval_mode_consistency(mlp(), batch())
    assert result.status == "passed" and result.training and result.max_abs_diff == 0


def test_dropout_that_ignores_eval_mode_is_caught_in_eval_mode():
    model = nn.Sequential(nn.Linear(8, 8), AlwaysDropout(), nn.Linear(8, 3)).eval()
    result = eval_mode_consistency(model, batch())
    assert result.status == "failed" and result.eval_abs_diff > 0 and result.ignores_eval
    assert "ignores model.eval()" in result.message
    assert result.has_dropout  # no nn.Dropout module, but a dropout it was seen calling (Co-teaching's F.dropout2d)


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


class TinyVAE(nn.Module):
    """Samples its latent code in every mode: the model's purpose, not a forgotten eval()."""

    def __init__(self):
        super().__init__()
        self.encode, self.decode = nn.Linear(8, 4), nn.Linear(2, 8)

    def forward(self, x):
        mu, log_var = self.encode(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * log_var).exp()
        return self.decode(z)


def test_sampling_inside_the_model_is_not_dropout_that_ignores_eval():
    torch.manual_seed(0)
    for model in (TinyVAE(), TinyVAE().eval()):
        result = eval_mode_consistency(model, batch())
        assert result.status == "passed", result.message
        assert result.eval_abs_diff > result.tolerance and result.ignores_eval is False
        assert "sampling" in result.message
    report = probe_only(TinyVAE().eval(), probes=["eval_mode"])
    assert "EVAL_MODE_FORGOTTEN" not in [f.code.value for f in nndx.diagnose(report).findings]


class HandDropout(nn.Module):
    """d2l's ``dropout_layer``: a mask drawn by hand, ``(torch.rand(X.shape) > p)``, applied
    whatever the mode unless the module checks ``self.training`` itself."""

    def __init__(self, checks_mode: bool):
        super().__init__()
        self.checks_mode = checks_mode
        self.lin1, self.lin2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.lin1(x))
        if self.training or not self.checks_mode:
            h = (torch.rand(h.shape) > 0.5).float() * h / 0.5
        return self.lin2(h)


class StochasticUnits(nn.Module):
    """An RBM-style layer: each unit fires with its own probability (a tensor, not one p),
    in every mode: sampling is the model's purpose."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        p = torch.sigmoid(self.lin1(x))
        return self.lin2((torch.rand_like(p) < p).float())


def test_a_mask_drawn_by_hand_that_ignores_eval_mode_is_dropout_that_ignores_eval():
    torch.manual_seed(0)
    result = eval_mode_consistency(HandDropout(checks_mode=False).eval(), batch())
    assert result.status == "failed" and result.ignores_eval and result.has_dropout
    guarded = eval_mode_consistency(HandDropout(checks_mode=True).eval(), batch())
    assert guarded.status == "passed" and not guarded.ignores_eval
    assert eval_mode_consistency(HandDropout(checks_mode=True), batch()).status == "failed"  # train mode: active
    sampled = eval_mode_consistency(StochasticUnits().eval(), batch())
    assert sampled.ignores_eval is False and "sampling" in sampled.message


class Recentre(nn.Module):
    """x - mean + mean: x exactly in arithmetic, but rounded differently for every batch."""

    def forward(self, x):
        centre = x.mean(dim=0, keepdim=True)
        return (x - centre) + centre


class CorruptedInput(nn.Module):
    """ELECTRA's pretraining wrapper: 15% of the tokens chosen by a uniform draw, prob_mask_like's
    ``uniform_(0, 1) < 0.15``, replaced by the mask id in every mode; the mask selects tokens, it
    multiplies no activation. Sampling the corruption is the model's purpose, not a dropout."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(10, 16), nn.Linear(16, 3)

    def forward(self, tokens):
        chosen = torch.zeros_like(tokens).float().uniform_(0, 1) < 0.15
        return self.head(self.embed(tokens.masked_fill(chosen, 9)).mean(1))


def test_a_mask_that_corrupts_inputs_is_sampling_not_a_dropout():
    torch.manual_seed(0)
    tokens = torch.randint(0, 9, (32, 12))
    result = eval_mode_consistency(CorruptedInput().eval(), (tokens, None))
    assert result.ignores_eval is False and not result.has_dropout and "sampling" in result.message
    report = nndx.probe(CorruptedInput().eval(), (tokens, torch.randint(0, 3, (32,))), nn.CrossEntropyLoss(),
                        probes=["eval_mode"])  # fmt: skip
    assert "EVAL_MODE_FORGOTTEN" not in [f.code.value for f in nndx.diagnose(report).findings]


def test_rounding_differences_of_a_half_batch_are_not_batch_dependence():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 64), Recentre(), nn.ReLU(), nn.Linear(64, 10)).eval()
    x = torch.randn(64, 8) * 30
    result = eval_mode_consistency(model, (x, None))
    assert 0 < result.batch_dependence_diff <= result.tolerance  # not exactly 0, and no evidence of anything
    assert result.status == "passed", result.message
    leaky = eval_mode_consistency(nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.Linear(64, 10)), (x, None))
    assert leaky.status == "failed" and leaky.batch_dependence_diff > 100 * leaky.tolerance


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_every_dtype_is_measured(dtype):
    good = eval_mode_consistency(mlp(dropout=0.5, batchnorm=True).eval().to(dtype), (batch()[0].to(dtype), None))
    bad = eval_mode_consistency(mlp(dropout=0.5).to(dtype), (batch()[0].to(dtype), None))
    assert good.status == "passed" and bad.status == "failed", (good.message, bad.message)


def probe_only(model, **kw):
    return nndx.probe(model, batch(), nn.CrossEntropyLoss(), **kw)


class TimeMajorEncoder(nn.Module):
    """(time, batch) token ids and a (time, time) causal mask, as PyTorch's transformer
    tutorial calls its model; BatchNorm over the features (batch statistics in train mode)."""

    def __init__(self, vocab=11, width=8):
        super().__init__()
        self.embed, self.norm = nn.Embedding(vocab, width), nn.BatchNorm1d(width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 16, dropout=0.0)
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens, mask=None):
        h = self.embed(tokens)
        h = self.norm(h.flatten(0, 1)).view_as(h)
        return self.out(self.layer(h, src_mask=mask))


def test_a_time_major_batch_is_halved_along_its_samples_and_never_along_time():
    torch.manual_seed(0)
    time, samples = 12, 6
    tokens = torch.randint(0, 11, (time, samples))
    mask = nn.Transformer.generate_square_subsequent_mask(time)
    model = TimeMajorEncoder()
    # flattened next-token targets line up with no axis: no half-batch check, and no error
    # from a mask halved as if it were the batch
    flat = eval_mode_consistency(model.eval(), ((tokens, mask), torch.randint(0, 11, (time * samples,))))
    assert flat.status == "passed" and flat.batch_dependence_diff is None, flat.message
    # one target per sample: the samples are axis 1, and batch statistics in train mode show there
    labels = torch.randint(0, 11, (samples,))
    per_sample = eval_mode_consistency(model.train(), (tokens, labels))
    assert per_sample.status == "failed" and per_sample.batch_dependence_diff > per_sample.tolerance
    evaluated = eval_mode_consistency(model.eval(), (tokens, labels))
    assert evaluated.status == "passed" and evaluated.batch_dependence_diff <= evaluated.tolerance
    # a mask shared by the batch cannot be halved with it: no half-batch check
    assert eval_mode_consistency(model.train(), ((tokens, mask), labels)).batch_dependence_diff is None


class FixedBatch(nn.Module):
    """A model built for one batch size (a positional table over the batch, say): the half
    batch the probe makes is its own doing, not an error of the user's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer, self.per_row = nn.Linear(8, 3), nn.Parameter(torch.zeros(16, 3))

    def forward(self, x):
        return self.layer(x) + self.per_row


def test_a_model_that_cannot_take_half_the_batch_is_still_checked():
    result = eval_mode_consistency(FixedBatch().eval(), (torch.randn(16, 8), torch.randint(0, 3, (16,))))
    assert result.status == "passed" and result.batch_dependence_diff is None
