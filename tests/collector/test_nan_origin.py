import pytest
import torch
from _probe_models import Log, Sqrt, assert_untouched, batch, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

import nndx
from nndx.collector.probes.nan_origin import nan_origin
from nndx.report import DiagnosticReport, Probes


def test_healthy_model_everything_finite():
    result = nan_origin(mlp(), batch(), nn.CrossEntropyLoss())
    assert result.status == "passed" and result.loss_finite
    assert result.forward_module is None and result.backward_module is None
    assert result.input_nonfinite_count == 0


def test_first_module_producing_nan_in_forward_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Log(), nn.Linear(8, 3))  # log of negative values
    result = nan_origin(model, batch(), nn.CrossEntropyLoss())
    assert result.status == "failed" and not result.loss_finite
    assert (result.forward_module, result.forward_module_type) == ("1", "Log")
    assert result.input_nonfinite_count == 0


def test_nested_module_named_not_its_container():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 8), Log()), nn.Linear(8, 3))
    result = nan_origin(model, batch(), nn.CrossEntropyLoss())
    assert result.forward_module == "1.2"


def test_nan_in_inputs_counted_and_first_layer_named():
    x, y = batch()
    x[3, 2] = float("nan")
    x[5, 0] = float("inf")
    result = nan_origin(mlp(), (x, y), nn.CrossEntropyLoss())
    assert result.status == "failed" and result.input_nonfinite_count == 2
    assert result.forward_module == "0"


def test_non_finite_gradient_in_backward_with_finite_forward():
    torch.manual_seed(0)
    # sqrt(0·z): forward finite, derivative inf·0 = NaN flowing into layer 0's output
    model = nn.Sequential(nn.Linear(8, 8), Sqrt(), nn.Linear(8, 3))
    result = nan_origin(model, batch(), nn.CrossEntropyLoss())
    assert result.loss_finite and result.forward_module is None
    assert result.status == "failed"
    assert (result.backward_module, result.backward_module_type) == ("0", "Linear")


def test_users_model_and_rng_untouched_and_hooks_removed():
    model = mlp(batchnorm=True, dropout=0.3)
    before = snapshot(model)
    nan_origin(model, batch(), nn.CrossEntropyLoss())
    assert_untouched(before, model)


class Functional(nn.Module):
    """The non-finite value is made by an op in forward's own code, not by a module."""

    def __init__(self, op):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.op = nn.Linear(8, 8), nn.Linear(8, 3), op

    def forward(self, x):
        h = self.fc1(x)
        if self.op == "log":
            h = torch.log(h)
        elif self.op == "div":
            h = h / (h - h)
        elif self.op == "exp":
            h = torch.exp(h * 1000)
        return self.fc2(h)


@pytest.mark.parametrize("op, code", [("log", "LOG_OF_ZERO"), ("div", "DIVISION_BY_ZERO"), ("exp", "NUMERICAL_OVERFLOW")])
def test_the_functional_op_that_made_the_first_nan_is_named(op, code):
    result = nan_origin(Functional(op), batch(), nn.CrossEntropyLoss())
    assert (result.forward_module, result.forward_module_type, result.forward_op) == ("Functional", "Functional", op)
    report = DiagnosticReport(probes=Probes(nan_origin=result))
    assert [f.code.value for f in nndx.diagnose(report).findings][:1] == [code]


def test_healthy_functional_code_names_nothing():
    result = nan_origin(Functional(None), batch(), nn.CrossEntropyLoss())
    assert result.status == "passed" and result.forward_op is None


class MaskedAttention(nn.Module):
    """Causal attention that hides future positions with -inf, as nanoGPT does: the -inf
    scores become exact zeros after the softmax."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x):  # x: (batch, 4 positions, 8)
        q, k, v = self.qkv(x).split(8, dim=-1)
        scores = q @ k.transpose(1, 2)
        mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.out((weights @ v).mean(1))


def test_a_mask_of_minus_inf_that_reaches_neither_loss_nor_gradient_passes():
    x, y = batch()
    result = nan_origin(MaskedAttention(), (x.view(4, 4, 8).repeat(4, 1, 1), y), nn.CrossEntropyLoss())
    assert result.status == "passed" and result.forward_module is None
    assert "masked_fill" in result.message and "a mask" in result.message
    report = DiagnosticReport(probes=Probes(nan_origin=result))
    assert [f for f in nndx.diagnose(report).findings if f.severity != "info"] == []


class CausalEncoder(nn.Module):
    """Takes the float causal mask as an input, as nn.Transformer's users pass it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.encoder, self.out = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), nn.Linear(8, 3)

    def forward(self, x, mask):
        return self.out(self.encoder(x, mask=mask).mean(1))


def test_a_float_causal_mask_passed_as_input_is_no_nan_in_the_data():
    """nn.Transformer.generate_square_subsequent_mask is -inf above the diagonal: an input
    that is non-finite by design. The same -inf as data (reaching the loss) still counts."""
    x, y = batch()
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    result = nan_origin(CausalEncoder(), ((x.view(4, 4, 8).repeat(4, 1, 1), mask), y), nn.CrossEntropyLoss())
    assert result.status == "passed" and result.input_nonfinite_count == 0, result.message
    assert "additive mask" in result.message
    report = DiagnosticReport(probes=Probes(nan_origin=result))
    assert [f for f in nndx.diagnose(report).findings if f.severity != "info"] == []

    data = x.clone()
    data[0, 0] = float("-inf")
    leaked = nan_origin(mlp(), (data, y), nn.CrossEntropyLoss())
    assert leaked.status == "failed" and leaked.input_nonfinite_count == 1


def test_minus_inf_that_reaches_the_loss_is_still_named():
    class Unmasked(MaskedAttention):
        def forward(self, x):
            return super().forward(x).masked_fill(torch.ones(3, dtype=torch.bool), float("-inf"))

    x, y = batch()
    result = nan_origin(Unmasked(), (x.view(4, 4, 8).repeat(4, 1, 1), y), nn.CrossEntropyLoss())
    assert result.status == "failed" and not result.loss_finite and result.forward_module is not None


@pytest.mark.parametrize("op, code", [("exp", "NUMERICAL_OVERFLOW"), ("log", "LOG_OF_ZERO")])
def test_a_nan_made_by_the_loss_functions_own_code_is_named(op, code):
    """Every module's output is finite; a hand-written loss makes the first NaN/Inf: exp
    of large logits without the max subtracted, or log of a probability that is 0."""

    def naive_softmax_nll(out, y):
        e = torch.exp(out * 1000)
        return -torch.log((e / e.sum(-1, keepdim=True)).gather(-1, y.unsqueeze(-1))).mean()

    def unclamped_log(out, y):
        p = torch.softmax(out * 1000, -1)
        return -torch.log(p.gather(-1, y.unsqueeze(-1))).mean()

    result = nan_origin(mlp(), batch(), naive_softmax_nll if op == "exp" else unclamped_log)
    assert (result.forward_module, result.forward_op) == ("loss", op) and not result.loss_finite
    report = DiagnosticReport(probes=Probes(nan_origin=result))
    assert nndx.diagnose(report).top().code.value == code


def test_a_diverged_model_is_traced_from_its_initial_state():
    """After training, the weights are NaN and every forward is NaN from the first layer on:
    that says nothing about where the first NaN came from. With the Monitor's snapshot the
    probe traces it from the initial state (here the loss's own log of a 0); without one it
    says skipped, and why."""
    from nndx.integrations.monitor import Monitor

    def bce_by_hand(logits, y):  # log(sigmoid) without a clamp: log(0) once a logit is large
        p = torch.sigmoid(logits[:, 0])
        return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()

    model = mlp(out=1)
    with torch.no_grad():
        model[-1].weight.mul_(1000.0)
    x, y = batch(classes=2)
    y = y.float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        for _ in range(5):
            opt.zero_grad()
            loss = bce_by_hand(model(x), y)
            loss.backward()
            opt.step()
            mon.log(loss)
    assert not all(bool(torch.isfinite(p).all()) for p in model.parameters())
    traced = nndx.probe(model, (x, y), bce_by_hand, probes=["nan_origin"], monitor=mon, progress=False)
    result = traced.probes.nan_origin
    assert (result.forward_module, result.forward_op) == ("loss", "log"), result.message
    blind = nndx.probe(model, (x, y), bce_by_hand, probes=["nan_origin"], progress=False).probes.nan_origin
    assert blind.status == "skipped" and "non-finite" in blind.message


class LastStateOnly(nn.Module):
    """DeepAR's net: the LSTM's per-step outputs unused, its final hidden states read; their
    gradient reaches the LSTM's backward as undefined (None in a tensor hook)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(3, 8, num_layers=2)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        _, (hidden, _) = self.lstm(x)
        return self.head(hidden.permute(1, 0, 2).reshape(x.shape[1], -1))


def test_an_output_the_loss_never_reads_is_no_error():
    result = nan_origin(LastStateOnly(), (torch.randn(5, 4, 3), torch.randn(4, 1)), nn.MSELoss())
    assert result.status == "passed", result.message


@pytest.mark.parametrize("bad", ["-inf", "nan"])
def test_inputs_whose_only_non_finite_values_are_minus_inf_are_a_log_of_zero_upstream(bad):
    """MelGAN's mel-spectrogram without its clamp: log10 of the zero-padded frames' 0 energy is -inf,
    in the data pipeline, before the model. -inf is what a log of 0 gives (0/0 gives NaN): the
    finding names LOG_OF_ZERO; a NaN in the inputs stays NAN_IN_DATA."""
    x, y = batch()
    x[3, 2] = x[5, 0] = float(bad)
    report = nndx.probe(mlp(), (x, y), nn.CrossEntropyLoss(), probes=["nan_origin"], progress=False)
    assert report.probes.nan_origin.input_minus_inf_count == (2 if bad == "-inf" else 0)
    (found,) = [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX501"]
    assert found.code.value == ("LOG_OF_ZERO" if bad == "-inf" else "NAN_IN_DATA")
