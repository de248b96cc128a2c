import pytest
import torch
from _probe_models import assert_untouched, batch, dead_relu_mlp, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

from nndx.collector.probes.layer_stats import hook_statistics


def test_healthy_layers_parameters_and_summary_in_forward_order():
    model, (x, y) = mlp(dropout=0.2), batch()
    stats = hook_statistics(model, (x, y), nn.CrossEntropyLoss())
    assert [s.name for s in stats.layers] == ["0", "1", "3", "4", "5"]  # dropout has no stats
    assert all(s.gradient is not None and s.gradient.norm > 0 for s in stats.layers)
    assert stats.layers[1].activation.dead_unit_fraction < 0.2
    assert [p.name for p in stats.parameters] == [n for n, _ in model.named_parameters()]
    assert all(p.grad_norm > 0 and 0 < p.update_ratio < 0.1 for p in stats.parameters)
    assert [layer.name for layer in stats.model.layers] == ["0", "1", "2", "3", "4", "5"]
    assert stats.model.has_dropout and stats.model.last_layer == "Linear"
    assert "Adam" in stats.optimizer


def test_dead_relu_units_from_negative_bias():
    stats = hook_statistics(dead_relu_mlp(), batch(), nn.CrossEntropyLoss())
    relu = {s.name: s for s in stats.layers}["1"]
    assert relu.activation.dead_unit_fraction == 1.0


def test_update_ratio_reflects_the_users_learning_rate():
    ratios = {}
    for lr in (10.0, 0.01):
        model = mlp()
        stats = hook_statistics(model, batch(), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=lr))
        assert "copy of the user's SGD" in stats.optimizer
        ratios[lr] = stats.parameters
    assert max(p.update_ratio for p in ratios[10.0]) > 0.3 > 0.03 > max(p.update_ratio for p in ratios[0.01])
    for big, small in zip(ratios[10.0], ratios[0.01]):  # plain SGD: ‖Δw‖ = lr·‖g‖ exactly
        assert big.update_ratio * big.weight_norm / (small.update_ratio * small.weight_norm) == pytest.approx(1000, rel=1e-3)


def test_optimizer_over_another_model_uses_a_fresh_optimizer_and_steps_nothing():
    model, other = mlp(), mlp(seed=5)
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    before, before_other = snapshot(model, optimizer), snapshot(other)
    stats = hook_statistics(model, batch(), nn.CrossEntropyLoss(), optimizer=optimizer)
    assert "fresh SGD" in stats.optimizer
    assert all(p.update_ratio > 0 for p in stats.parameters)
    assert_untouched(before, model, optimizer)
    assert_untouched(before_other, other)


def test_users_model_optimizer_rng_and_grads_untouched():
    model, (x, y) = mlp(batchnorm=True, dropout=0.3), batch()
    optimizer = torch.optim.Adam(model.parameters())
    nn.CrossEntropyLoss()(model(x), y).backward()  # a stale .grad and Adam state to keep
    optimizer.step()
    before = snapshot(model, optimizer)
    hook_statistics(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer)
    assert_untouched(before, model, optimizer)



class _Hooked(nn.Module):
    """A trunk whose features a forward hook taps while the classifier behind it runs and is
    thrown away (BYOL's ``hidden_layer``), a branch detached into the features, a layer never
    called, and dropout before all of it, so the probe's forwards must draw alike."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.drop, self.classifier = nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 5)
        self.side, self.head, self.never = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(3, 3)
        self.tapped: dict = {}
        self.trunk.register_forward_hook(self._tap)
        self.eps = nn.Parameter(torch.zeros(1))  # GIN's with learn_eps off: never read
        self.scale = nn.Parameter(torch.ones(1))  # read, then detached: a cut graph

    def _tap(self, _module: nn.Module, _args: object, output: torch.Tensor) -> None:
        self.tapped["features"] = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier(self.drop(torch.relu(self.trunk(x))))  # computed, never read
        features = self.tapped["features"] + self.side(x).detach()
        return self.head(self.drop(torch.relu(features))) * self.scale.detach()


def test_unused_modules_are_those_whose_output_cannot_move_the_loss():
    model = _Hooked()
    before = snapshot(model)
    stats = hook_statistics(model, batch(), nn.CrossEntropyLoss())
    # the detached side branch gets no gradient either, but its value reaches the loss: a cut graph
    # a parameter no call of the forward read is named on its own; one read and detached is not
    assert stats.model.unused_modules == ["classifier", "never", "eps"]
    assert_untouched(before, model)


class _Gate(nn.Module):
    """TopKPooling with its gate dropped (Graph U-Net): the scores pick which features go on, as
    indices, and are not multiplied in; the selector's weight gets no gradient, yet moves the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.argsort(torch.tanh(self.weight), descending=True)[:4]
        return index, torch.tanh(self.weight)[index]


class _Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.select, self.head = _Gate(), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index, _score = self.select(x)
        return self.head(x[:, index])


def test_a_module_whose_output_only_indexes_is_used_not_unused():
    """Its float output can be perturbed without effect, but its parameters decide the indices:
    the graph is cut there (NNDX304 at warning), the module is not computed and thrown away."""
    stats = hook_statistics(_Pooled(), batch(), nn.CrossEntropyLoss())
    assert stats.model.unused_modules == []


def test_no_unused_modules_in_a_healthy_model():
    assert hook_statistics(mlp(dropout=0.2), batch(), nn.CrossEntropyLoss()).model.unused_modules == []


class _Reparametrised(nn.Module):
    """CompressAI's entropy bottleneck: its density's matrices are parameters read through
    softplus (a positive reparametrisation), filled with one constant at init."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(20, 3)
        self.matrix = nn.Parameter(torch.full((3, 3), 0.5))

    def forward(self, x):
        return torch.relu(self.body(x)) @ nn.functional.softplus(self.matrix)


def test_an_activation_over_a_parameter_is_no_layer_of_the_data():
    """softplus(self.matrix) runs on a parameter, not on the samples: its output is the same for
    every sample by construction (a constant init: zero spread), which is no dead or constant layer.
    It is not measured; the ReLU over the data is."""
    x, y = torch.randn(16, 20), torch.randn(16, 3)
    stats = hook_statistics(_Reparametrised(), (x, y), nn.MSELoss())
    names = [s.name for s in stats.layers]
    assert any("relu" in n for n in names) and not any("softplus" in n for n in names), names
