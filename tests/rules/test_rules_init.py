"""NNDX207's init scale: a Linear/Conv weight whose gain (rms x sqrt(fan_in)) is far
above any standard init's, as N(0, 1) init gives — measured through nndx.probe."""

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import nndx


def probe_findings(model, x, y):
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), probes=["hooks"], progress=False)
    return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX207"]


def mlp():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-6), dtype=torch.float32)
    return x, torch.tensor(y)


def test_standard_normal_init_fires(digits):
    torch.manual_seed(0)
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, 0.0, 1.0)
    findings = probe_findings(model, digits[0][:128], digits[1][:128])
    assert findings and all(f.code.value == "BAD_INIT" for f in findings)
    assert max(f.evidence["gain"] for f in findings) > 6


@pytest.mark.parametrize("init", ["default", "kaiming", "xavier"])
def test_standard_inits_are_silent(digits, init):
    torch.manual_seed(0)
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear) and init == "kaiming":
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        elif isinstance(layer, nn.Linear) and init == "xavier":
            nn.init.xavier_normal_(layer.weight)
    assert not probe_findings(model, digits[0][:128], digits[1][:128])


def test_an_embedding_table_initialised_n01_is_no_linear_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 64), nn.Flatten(), nn.Linear(64 * 8, 4))
    tokens = torch.randint(0, 100, (32, 8))
    assert not probe_findings(model, tokens, torch.randint(0, 4, (32,)))


class NoisyGate(nn.Module):
    """A mixture of experts' router at init: the noise scale softplus(x @ w_noise) with w_noise
    zero is the constant ln 2, whose std over the batch is float rounding (~1e-7), before a
    healthy expert. The gain from that "first layer" to the expert is no init breaking learning."""

    def __init__(self, w_noise):
        super().__init__()
        self.w_noise = nn.Parameter(w_noise)
        self.softplus = nn.Softplus()
        self.expert = mlp()

    def forward(self, x):
        noise_scale = self.softplus(x @ self.w_noise)
        return self.expert(x) * noise_scale.mean(1, keepdim=True)


def test_a_constant_up_to_rounding_is_no_base_for_the_growth_of_activations(digits):
    torch.manual_seed(0)
    x, y = digits[0][:128], digits[1][:128]
    assert not probe_findings(NoisyGate(torch.zeros(64, 4)), x, y)
    # the same shape with a weight blown up a million-fold after the gate still fires
    blown = NoisyGate(torch.zeros(64, 4))
    with torch.no_grad():
        blown.expert[2].weight.mul_(1e6)
    assert any("grows" in f.symptom or f.evidence.get("gain", 0) > 5 for f in probe_findings(blown, x, y))


class TinyEmbeddings(nn.Module):
    """pointer-generator's init: embeddings drawn at std 1e-4, then Linear layers with PyTorch's
    default biases. The first layer's outputs are ~1e-6; the next layer's bias alone is ~0.1."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        nn.init.normal_(self.embed.weight, std=1e-4)
        self.project = nn.Linear(16, 32, bias=False)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def forward(self, tokens):
        return self.head(self.project(self.embed(tokens).mean(1)))


def test_activations_too_small_to_measure_a_gain_from_are_no_base_for_growth():
    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (64, 10))
    assert not probe_findings(TinyEmbeddings(), tokens, torch.randint(0, 4, (64,)))


@pytest.mark.slow
def test_a_model_trained_long_on_digits_is_silent(digits):
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = digits
    for _ in range(600):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert not probe_findings(model, x[:128], y[:128])


def test_weights_blown_up_by_the_first_step_of_a_far_too_high_lr_are_no_bad_init(digits):
    """The hooks probe takes one step with the user's optimizer: at lr 1000x too high the
    weights after it are huge, but the update did that, not the initialisation."""
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=3.0)
    report = nndx.probe(model, (digits[0][:128], digits[1][:128]), nn.CrossEntropyLoss(), optimizer=optimizer,
                        probes=["hooks"], progress=False)  # fmt: skip
    assert max(p.update_ratio for p in report.parameters if p.update_ratio is not None) > 1  # the step did it
    assert not [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX207"]


class Block(nn.Module):
    """torchvision's BasicBlock on features: the branch's last norm zero-initialised
    (``zero_init_residual=True``, Goyal et al.) so each block starts as the identity; or,
    with ``residual=False``, the same zero norm with nothing added to it (a dead layer)."""

    def __init__(self, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.fc1, self.bn1 = nn.Linear(32, 32), nn.BatchNorm1d(32)
        self.fc2, self.bn2 = nn.Linear(32, 32), nn.BatchNorm1d(32)
        nn.init.zeros_(self.bn2.weight)

    def forward(self, x):
        out = self.bn2(self.fc2(torch.relu(self.bn1(self.fc1(x)))))
        if self.residual:
            out += x
        return torch.relu(out)


@pytest.mark.parametrize("residual", [True, False])
def test_a_zero_initialised_residual_branch_is_the_identity_not_a_bad_init(digits, residual):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), Block(residual), Block(residual), nn.Linear(32, 10))
    findings = probe_findings(model, digits[0][:128], digits[1][:128])
    assert bool(findings) == (not residual), [f.symptom for f in findings]


class Mix(nn.Module):
    """RWKV-v4's time-mix as a branch: key, receptance and output initialised to zero (its
    ``scale_init = 0``), so the block starts as nothing added; the gate sigmoid(r) is then 0.5
    for every sample. With ``residual=False`` nothing is added to the zero output: a dead layer."""

    def __init__(self, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.key, self.value = nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False)
        self.receptance, self.output = nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False)
        for layer in (self.key, self.receptance, self.output):
            nn.init.zeros_(layer.weight)

    def forward(self, x):
        k = self.key(x)
        out = self.output(torch.sigmoid(self.receptance(x)) * torch.tanh(k + self.value(x)))
        return x + out if self.residual else out


@pytest.mark.parametrize("residual", [True, False])
def test_zero_layers_inside_a_residual_branch_that_starts_at_zero_are_no_bad_init(digits, residual):
    """RWKV's healthy run got ten BAD_INIT warnings for the zeros inside its time-mix blocks, whose
    output layer starts at zero on purpose: once it moves, they get their gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), Mix(residual), nn.LayerNorm(32), Mix(residual), nn.Linear(32, 10))
    findings = probe_findings(model, digits[0][:128], digits[1][:128])
    assert bool(findings) == (not residual), [f.symptom for f in findings]


class LoRALinear(nn.Module):
    """loralib's Linear: a frozen base plus scaling * B @ A, B zero-initialised so that the
    adapter starts as nothing added (A random: B gets a gradient at the first step); with
    ``zero_a`` A is zero as well (a reported bug: both stay zero forever)."""

    def __init__(self, features: int, zero_a: bool, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(features, features).requires_grad_(False)
        self.lora_A = nn.Parameter(torch.zeros(rank, features) if zero_a else torch.randn(rank, features) * 0.1)
        self.lora_B = nn.Parameter(torch.zeros(features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.lora_A.t() @ self.lora_B.t() * 2.0


@pytest.mark.parametrize("zero_a", [False, True])
def test_a_zero_weight_that_its_gradient_moves_is_a_deliberate_start_one_without_is_stuck(digits, zero_a):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), LoRALinear(32, zero_a), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    # a linear warm-up from 0 (Hugging Face's get_linear_schedule_with_warmup): the probe's step moves nothing
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 100)
    report = nndx.probe(model, (digits[0][:128], digits[1][:128]), nn.CrossEntropyLoss(), optimizer=optimizer,
                        probes=["hooks"], progress=False)  # fmt: skip
    stuck = {f.evidence.get("parameter") for f in nndx.diagnose(report).findings if f.rule_id == "NNDX207"}
    assert stuck == ({"2.lora_A", "2.lora_B"} if zero_a else set())


class ZeroLinear(nn.Module):
    """Glow's ZeroConv2d as a Linear: weight and bias zero, times exp(3 * scale) with scale zero,
    so a coupling starts as the identity. Its output is 0 for every sample (the weight's
    gradient moves it at the first step); the scale gets its gradient from the second step on."""

    def __init__(self, features_in: int, features_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.scale = nn.Parameter(torch.zeros(1, features_out))

    def forward(self, x):
        return self.linear(x) * torch.exp(self.scale * 3)


class AffineCoupling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), ZeroLinear(64, 64))

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        log_s, t = self.net(a).chunk(2, dim=1)
        return torch.cat([a, (b + t) * torch.sigmoid(log_s + 2)], dim=1)


def test_a_zero_initialised_layer_whose_gradient_moves_it_is_a_deliberate_start(digits):
    """Glow starts every coupling as the identity with zero-initialised convolutions (so do
    ControlNet's zero convs and DiT's adaLN-Zero): 15 BAD_INIT warnings on the healthy
    program, for the zero outputs and the zero scales beside them. The same layers as the
    only path, both factors zero as in LoRA's reported bug, still fire (test above)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), AffineCoupling(), AffineCoupling(), nn.Linear(64, 10))
    findings = probe_findings(model, digits[0][:128], digits[1][:128])
    assert not findings, [f.symptom for f in findings]


class AdaLNZeroBlock(nn.Module):
    """DiT's block: shift, scale and gate from a zero-initialised modulation (adaLN-Zero), so the
    block starts as the identity."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))
        nn.init.zeros_(self.adaLN_modulation[1].weight)
        nn.init.zeros_(self.adaLN_modulation[1].bias)

    def forward(self, x):
        shift, scale, gate = self.adaLN_modulation(x).chunk(3, dim=1)
        return x + gate * self.mlp(self.norm(x) * (1 + scale) + shift)


def dit_like(zero_everything: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), AdaLNZeroBlock(), AdaLNZeroBlock(), nn.Linear(32, 10))
    nn.init.zeros_(model[3].weight)  # DiT's final layer starts at zero too: every gradient before it is 0 at first
    nn.init.zeros_(model[3].bias)
    if zero_everything:
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                nn.init.zeros_(layer.weight)
    return model


@pytest.mark.parametrize("zero_everything", [False, True])
def test_zero_layers_behind_a_zero_output_layer_are_a_deliberate_start(digits, zero_everything):
    """DiT zeroes its adaLN modulations and its final layer: at the first step no gradient
    reaches the modulations (the final layer passes none back), and its healthy run got seven
    BAD_INIT warnings, LR_TOO_HIGH (the zero final layer's first update is its whole weight) and
    VANISHING_GRADIENTS. Every weight matrix zero is still a broken init."""
    x, y = digits[0][:128], digits[1][:128]
    report = nndx.probe(dit_like(zero_everything), (x, y), nn.CrossEntropyLoss(), probes=["hooks"], progress=False)
    findings = [f for f in nndx.diagnose(report).findings if f.severity != "info"]
    if zero_everything:
        assert any(f.rule_id == "NNDX207" for f in findings), [f.symptom for f in findings]
    else:
        assert not findings, [(f.rule_id, f.symptom) for f in findings]


class ChannelMix(nn.Module):
    """RWKV-v4's channel-mix: receptance and value initialised to zero, key random; the gate
    sigmoid(receptance(x)) is 0.5 for every sample at the start and multiplies the value's output,
    so the branch starts as nothing added. Without the residual, nothing else feeds the stream."""

    def __init__(self, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.key, self.value, self.receptance = (nn.Linear(32, 32, bias=False) for _ in range(3))
        for layer in (self.value, self.receptance):
            nn.init.zeros_(layer.weight)

    def forward(self, x):
        out = torch.sigmoid(self.receptance(x)) * self.value(torch.square(torch.relu(self.key(x))))
        return x + out if self.residual else out


@pytest.mark.parametrize("residual", [True, False])
def test_a_gated_residual_branch_that_starts_at_zero_is_no_bad_init(digits, residual):
    """RWKV's healthy run got a BAD_INIT warning per block for its channel-mix: a sigmoid gate
    over a zero-initialised receptance, times a zero-initialised value, added to the stream. The
    product ends the branch as a layer's own output would; without the residual it is a dead layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), ChannelMix(residual), nn.LayerNorm(32), ChannelMix(residual),
                          nn.Linear(32, 10))  # fmt: skip
    findings = probe_findings(model, digits[0][:128], digits[1][:128])
    assert bool(findings) == (not residual), [f.symptom for f in findings]
