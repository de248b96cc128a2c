"""Diagnosis by intervention: the remedy of the planted cause makes a copy learn, the
others do not, and the user's model, optimizer and RNG are untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nndx.collector.interventions import interventions

torch.set_num_threads(1)


def _data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 20, generator=gen)
    y = (x @ torch.randn(20, 4, generator=gen)).argmax(1)
    return x, y


def _mlp(seed: int = 0, *extra: nn.Module) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4), *extra)


class FunctionalSigmoidHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out = nn.Linear(20, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.out(F.relu(self.hidden(x))))


def _dead(model: nn.Sequential) -> nn.Sequential:
    nn.init.constant_(model[0].bias, -8.0)
    return model


def _statuses(result) -> dict[str, str]:
    return {r.cause: r.status for r in result.results}


def test_a_healthy_setup_learns_and_no_remedy_is_judged():
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(model.parameters(), 1e-3))
    assert result.results == [] and "nothing for a remedy to explain" in result.message
    assert result.baseline_final_loss < 0.5 * result.baseline_initial_loss


@pytest.mark.parametrize(
    "name, build, expected",
    [
        ("lr far too high", lambda m: (m, torch.optim.SGD(m.parameters(), lr=50.0)), "LR_TOO_HIGH"),
        ("lr far too low", lambda m: (m, torch.optim.SGD(m.parameters(), lr=1e-4)), "LR_TOO_LOW"),
        ("softmax before CE", lambda m: (m.append(nn.Softmax(dim=1)), torch.optim.SGD(m.parameters(), lr=0.1)), "DOUBLE_SOFTMAX"),
        ("dead units", lambda m: (_dead(m), torch.optim.Adam(m.parameters(), 1e-3)), "DEAD_RELU"),
    ],
)
def test_the_planted_causes_remedy_is_confirmed_and_no_other(name, build, expected):
    x, y = _data()
    model, optimizer = build(_mlp())
    statuses = _statuses(interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer))
    assert statuses.get(expected) == "confirmed", statuses
    assert [cause for cause, status in statuses.items() if status == "confirmed"] == [expected]


def test_a_functional_sigmoid_on_the_logits_is_found_and_removed():
    x, y = _data()
    model = FunctionalSigmoidHead()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    tried = {r.cause: r for r in result.results}
    assert "WRONG_OUTPUT_ACTIVATION" in tried, result
    assert tried["WRONG_OUTPUT_ACTIVATION"].remedy == "the Sigmoid on the output removed"


def test_a_loss_that_cannot_run_on_class_labels_is_fixed_by_the_matching_loss():
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y.float()), nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), 1e-2))
    assert result.baseline_initial_loss is None  # [128, 4] against [128]: the setup cannot train as given
    assert _statuses(result).get("WRONG_LOSS") == "confirmed"


def test_the_users_model_optimizer_and_rng_are_untouched():
    x, y = _data()
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=50.0, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {} and optimizer.param_groups[0]["lr"] == 50.0
    assert torch.equal(rng, torch.get_rng_state())


def test_the_budget_bounds_the_remedies_tried():
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-5),
                           budget_seconds=0.0)  # fmt: skip
    assert result.results and all(r.status == "skipped" and "budget" in r.message for r in result.results)
