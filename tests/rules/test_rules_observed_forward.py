"""Rules read what an observed forward showed before guessing from names or values.

NNDX401 reads the data flow, not module order: a Linear fed by another Linear (through
reshapes, dropout or normalisation only) is a composition; F.relu between layers kept in
an nn.ModuleList, parallel branches reading one input, and a loss module kept as an
attribute are not. NNDX402 trusts an observed Linear output over logits that merely
happen to lie in [0, 1]."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nndx


class Stack(nn.Module):
    def __init__(self, between: str) -> None:
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 16)])
        self.out = nn.Linear(16, 3)
        self.act, self.drop, self.between = nn.ReLU(), nn.Dropout(0.1), between
        self.loss_fn = nn.CrossEntropyLoss()  # registered, never run in forward

    def forward(self, x):
        for layer in self.hidden:
            x = layer(x)
            if self.between == "functional":
                x = F.relu(x)
            elif self.between == "module":
                x = self.act(x)
            elif self.between == "dropout only":
                x = self.drop(x).view(x.shape[0], -1)
        return self.out(x)


class Parallel(nn.Module):
    """Three Linears read the same input (as attention's query, key and value)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        weights = torch.softmax(self.q(x) @ self.k(x).T, dim=-1)
        return self.head(torch.tanh(weights @ self.v(x)))


def fired(model):
    torch.manual_seed(0)
    batch = (torch.randn(32, 8), torch.randint(0, 3, (32,)))
    report = nndx.probe(model, batch, nn.CrossEntropyLoss(), probes=["nan_origin"], progress=False)
    assert report.model.forward_observed
    return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX401"]


@pytest.mark.parametrize("between", ["functional", "module"])
def test_an_activation_between_layers_of_a_module_list_is_seen(between):
    assert not fired(Stack(between))


@pytest.mark.parametrize("between", ["nothing", "dropout only"])
def test_linear_fed_by_linear_fires(between):
    (finding,) = fired(Stack(between))
    assert "hidden.0 -> hidden.1" in finding.evidence["linear_pairs"]
    # the model has no activation anywhere, and the observed forward saw none run either:
    # a warning whether or not the loss falls (a linear model fits a linear part of any task)
    assert finding.severity == "warning"


def test_parallel_branches_over_one_input_are_no_composition():
    assert not fired(Parallel())


class GatedResidual(nn.Module):
    """A Temporal Fusion Transformer's gated residual network (pytorch-forecasting): fc1, ELU,
    fc2, then a gated linear unit whose own Linear reads fc2's output and whose gate (F.glu or
    nn.GLU) is its non-linearity; or (the bug) a plain Linear there."""

    def __init__(self, gate: str) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 16)
        self.glu_fc = nn.Linear(16, 32 if gate != "none" else 16)
        self.glu, self.gate, self.out = nn.GLU(), gate, nn.Linear(16, 3)

    def forward(self, x):
        h = self.glu_fc(self.fc2(F.elu(self.fc1(x))))
        h = F.glu(h) if self.gate == "functional" else self.glu(h) if self.gate == "module" else h
        return self.out(F.layer_norm(h, (16,)))


@pytest.mark.parametrize("gate", ["functional", "module"])
def test_a_gated_linear_units_own_projection_is_no_missing_activation(gate):
    assert not fired(GatedResidual(gate))
    (finding,) = fired(GatedResidual("none"))
    assert finding.evidence["linear_pairs"] == ["fc2 -> glu_fc"]


class AutoEncoder(nn.Module):
    """Lightning's example autoencoder: 64 -> 16 -> ReLU -> code, code -> 16 -> ReLU -> 64;
    the encoder's last Linear feeds the decoder's first directly (a linear code)."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, code))
        self.decoder = nn.Sequential(nn.Linear(code, 16), nn.ReLU(), nn.Linear(16, 64))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def test_a_linear_code_narrower_than_both_sides_is_no_missing_activation():
    """A 3-unit code between 16-unit layers is a low-rank map no single layer could be; a
    32-unit "code" between them is two Linears that compose to one."""
    torch.manual_seed(0)
    x = torch.rand(32, 64)

    def found(code):
        report = nndx.probe(AutoEncoder(code), (x, x), nn.MSELoss(), probes=["nan_origin"], progress=False)
        return [f.evidence["linear_pairs"] for f in nndx.diagnose(report).findings if f.rule_id == "NNDX401"]

    assert found(3) == []
    assert found(32) == [["encoder.2 -> decoder.0"]]


class PostNorm(nn.Module):
    """A post-norm Transformer block's feed-forward half as jadore801120's port writes the
    attention output: ``q = fc(...); q += residual; q = layer_norm(q)``, then the FFN's
    ``w_1``. The in-place residual makes fc's output more than fc's: no composition. Without
    the residual, fc -> LayerNorm -> w_1 is one (LayerNorm passes the data flow through)."""

    def __init__(self, residual: bool) -> None:
        super().__init__()
        self.inp, self.fc, self.norm = nn.Linear(8, 16), nn.Linear(16, 16), nn.LayerNorm(16)
        self.w_1, self.w_2, self.residual = nn.Linear(16, 32), nn.Linear(32, 3), residual

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        q = self.fc(h)
        if self.residual:
            q += h
        return self.w_2(F.relu(self.w_1(self.norm(q))))


def test_a_residual_added_in_place_breaks_the_linear_chain():
    assert not fired(PostNorm(residual=True))
    (finding,) = fired(PostNorm(residual=False))
    assert finding.evidence["linear_pairs"] == ["fc -> w_1"]


class Shortcut(nn.Module):
    """Mean Teacher's ResNet: the stem's output goes straight to the first block, whose
    shortcut projection reads it beside a residual branch that starts with F.relu. The same
    block with its feed-forward branch missing its activation (``x + w2(w1(x))``) is the bug."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.stem, self.downsample = nn.Linear(8, 16), nn.Linear(16, 32)
        self.w1, self.w2, self.head = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 3)
        self.bug = bug

    def forward(self, x):
        x = self.stem(x)
        branch = self.w2(self.w1(x) if self.bug else F.relu(self.w1(F.relu(x))))
        return self.head(torch.tanh(self.downsample(x) + branch))


def test_a_shortcut_projection_beside_a_residual_branch_is_no_missing_activation():
    assert not fired(Shortcut(bug=False))
    (finding,) = fired(Shortcut(bug=True))
    assert finding.evidence["linear_pairs"] == ["w1 -> w2"]


class Squashed(nn.Module):
    """Logits all in (0, 1): by a sigmoid, or by weights that make them small and positive."""

    def __init__(self, sigmoid: bool) -> None:
        super().__init__()
        self.fc, self.sigmoid = nn.Linear(8, 3), sigmoid
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.copy_(torch.tensor([0.2, 0.3, 0.4]))

    def forward(self, x):
        out = self.fc(x)
        return torch.sigmoid(out) if self.sigmoid else out


@pytest.mark.parametrize("sigmoid", [True, False])
def test_squashed_logits_are_blamed_on_an_activation_only_when_one_ran(sigmoid):
    torch.manual_seed(0)
    report = nndx.probe(Squashed(sigmoid), (torch.randn(32, 8), torch.randint(0, 3, (32,))), nn.CrossEntropyLoss(),
                        probes=["nan_origin"], progress=False)  # fmt: skip
    call = report.loop.loss_calls[0]
    assert 0 < call.output_min and call.output_max < 1
    fired = [f.rule_id for f in nndx.diagnose(report).findings]
    assert ("NNDX402" in fired) == sigmoid


class Bottleneck(nn.Module):
    """A regression MLP 8 -> width -> 16 -> 1; the bottleneck's output goes through a ReLU
    (module or function), or stays linear (a 2-d code, as an autoencoder's plotted latent)."""

    def __init__(self, width: int, after: str) -> None:
        super().__init__()
        self.narrow, self.wide, self.out = nn.Linear(8, width), nn.Linear(width, 16), nn.Linear(16, 1)
        self.act, self.after = nn.ReLU(), after

    def forward(self, x):
        h = self.narrow(x)
        if self.after == "module":
            h = self.act(h)
        elif self.after == "functional":
            h = F.relu(h)
        return self.out(F.relu(self.wide(h)))


def narrow_findings(model):
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    batch = (x, x.sin().sum(1, keepdim=True) * 3 + x[:, :1] * x[:, 1:2])
    report = nndx.probe(model, batch, nn.MSELoss(), progress=False)
    assert report.model.forward_observed
    return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX403"]


@pytest.mark.parametrize("after", ["functional", "module"])
def test_a_two_unit_layer_through_an_activation_is_a_bottleneck_in_any_task(after):
    """Not only a classifier's: a regression net is as capped by it, and F.relu feeds it as
    nn.ReLU does (the observed forward carries the data flow through functional calls)."""
    (finding,) = narrow_findings(Bottleneck(2, after))
    assert finding.evidence["layer"] == "narrow" and finding.evidence["width"] == 2


def test_a_linear_two_d_code_and_a_wide_layer_are_no_bottleneck():
    assert not narrow_findings(Bottleneck(2, "nothing"))
    assert not narrow_findings(Bottleneck(16, "functional"))


class VariableSelection(nn.Module):
    """A Temporal Fusion Transformer's variable selection over 2 inputs (pytorch-forecasting):
    a gated residual network whose hidden width is the number of inputs, 2 units through an ELU
    into 2 outputs softmaxed into the inputs' weights; then a wide regression net on the mix."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 2), nn.Linear(2, 2)
        self.body, self.out = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):  # x: (batch, 2 inputs, 8)
        weights = F.softmax(self.fc2(F.elu(self.fc1(x.flatten(1)))), dim=-1)
        mixed = (x * weights.unsqueeze(-1)).sum(1)
        return self.out(F.relu(self.body(mixed)))


def test_two_units_into_two_are_a_small_sub_network_not_a_bottleneck():
    torch.manual_seed(0)
    x = torch.randn(64, 2, 8)
    report = nndx.probe(VariableSelection(), (x, x[:, 0, :1] * 3 + x[:, 1, 1:2]), nn.MSELoss(), progress=False)
    assert report.model.forward_observed
    assert "NNDX403" not in {f.rule_id for f in nndx.diagnose(report).findings}
    # 2 units the one-unit output head reads are the representation it has: a bottleneck
    (finding,) = narrow_findings(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2), nn.ReLU(), nn.Linear(2, 1)))
    assert finding.evidence["width"] == 2


class ActorCritic(nn.Module):
    """pytorch/examples' actor-critic: a 2-action softmax head beside a 1-unit value head
    (the model's last layer), and a Bahdanau-style score Linear(h, 1) softmaxed over time."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.score = nn.Linear(8, 16), nn.Linear(16, 1)
        self.action_head, self.value_head = nn.Linear(16, 2), nn.Linear(16, 1)

    def forward(self, x):  # x: (batch, time, 8)
        h = F.relu(self.body(x))
        attended = (h * F.softmax(self.score(h), dim=1)).sum(1)
        return F.softmax(self.action_head(attended), dim=-1), self.value_head(attended)


def test_a_softmax_head_beside_the_last_layer_and_attention_scores_are_no_bottleneck():
    torch.manual_seed(0)
    x = torch.randn(64, 5, 8)

    def loss(outputs, targets):
        probs, value = outputs
        return nn.functional.nll_loss(probs.log(), targets[0]) + nn.functional.mse_loss(value.squeeze(1), targets[1])

    report = nndx.probe(ActorCritic(), (x, ((x[:, 0, 0] > 0).long(), x[:, 0, 1])), loss, progress=False)
    assert report.model.forward_observed
    assert "NNDX403" not in {f.rule_id for f in nndx.diagnose(report).findings}


class GaussianHeads(nn.Module):
    """DeepAR's net: an LSTM's last states into a mean head and a one-unit sigma head put through
    a softplus, both returned: no layer reads the sigma head, so it is no hidden bottleneck."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 16, batch_first=True)
        self.presigma, self.mu, self.sigma = nn.Linear(16, 1), nn.Linear(16, 1), nn.Softplus()

    def forward(self, x):
        out, _ = self.lstm(x)
        hidden = out[:, -1]
        pre_sigma = self.presigma(hidden)  # in DeepAR's order: the sigma head runs before the mean head
        mu = self.mu(hidden)
        return torch.cat([mu, self.sigma(pre_sigma)], dim=1)


def test_a_one_unit_head_through_a_softplus_into_the_output_is_no_bottleneck():
    torch.manual_seed(0)
    x, y = torch.randn(64, 6, 3), torch.randn(64)

    def nll(output, target):
        return nn.functional.gaussian_nll_loss(output[:, 0], target, output[:, 1] ** 2)

    report = nndx.probe(GaussianHeads(), (x, y), nll, progress=False)
    assert report.model.forward_observed
    assert "NNDX403" not in {f.rule_id for f in nndx.diagnose(report).findings}


class Heads(nn.Module):
    """Self-attention over (batch, time, width) that splits heads by view, as nanoGPT does,
    or (the bug) by a view to the permuted sizes."""

    def __init__(self, split: str) -> None:
        super().__init__()
        self.embed, self.qkv, self.out = nn.Embedding(11, 24), nn.Linear(24, 72), nn.Linear(24, 11)
        self.split = split

    def forward(self, idx):
        B, T = idx.shape
        q, k, v = self.qkv(self.embed(idx)).split(24, dim=2)
        if self.split == "view_to_permuted_sizes":
            q, k, v = (t.reshape(B, 4, T, 6) for t in (q, k, v))
        else:
            q, k, v = (t.view(B, T, 4, 6).transpose(1, 2) for t in (q, k, v))
        y = (q @ k.transpose(-2, -1) / 6**0.5).softmax(-1) @ v
        y = y.reshape(B, T, 24) if self.split == "view_to_permuted_sizes" else y.transpose(1, 2).reshape(B, T, 24)
        return self.out(y)


class TimeMajorLSTM(nn.Module):
    def __init__(self, transpose: bool) -> None:
        super().__init__()
        self.lstm, self.head, self.transpose = nn.LSTM(4, 16), nn.Linear(16, 3), transpose

    def forward(self, x):  # x: (batch, time, features); the LSTM wants time first
        B, T, F_ = x.shape
        x = x.transpose(0, 1) if self.transpose else x.view(T, B, F_)
        return self.head(self.lstm(x)[0][-1])


@pytest.mark.parametrize("case", ["heads", "time_major"])
def test_a_view_to_permuted_sizes_is_named_a_permute_is_not(case):
    torch.manual_seed(0)
    if case == "heads":
        batch = (torch.randint(0, 11, (8, 16)), torch.randint(0, 11, (8, 16)))
        loss = lambda out, y: F.cross_entropy(out.reshape(-1, 11), y.reshape(-1))  # noqa: E731
        right, wrong = Heads("permute"), Heads("view_to_permuted_sizes")
    else:
        batch = (torch.randn(32, 12, 4), torch.randint(0, 3, (32,)))
        loss, right, wrong = F.cross_entropy, TimeMajorLSTM(True), TimeMajorLSTM(False)

    def found(model):
        report = nndx.probe(model, batch, loss, probes=[])
        return {f.rule_id: f for f in nndx.diagnose(report).findings}, report.model.moved_axes

    findings, moved = found(wrong)
    assert findings["NNDX404"].code.value == "WRONG_RESHAPE" and moved, moved
    findings, moved = found(right)
    assert "NNDX404" not in findings and moved == []


class AnchorHeads(nn.Module):
    """RetinaNet's heads (yhenon/pytorch-retinanet): 9 anchors x 4 box coordinates and 9 x 2
    class scores per position, each laid out (N, H, W, channels) by the code's own
    ``permute(0, 2, 3, 1).contiguous()`` and then viewed (N, positions x anchors, 4). On a 4 x 4
    map one length equals the 4 coordinates, and on the 2 x 2 map 36 positions equal 36 channels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.box, self.cls = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 36, 1), nn.Conv2d(8, 18, 1)

    def forward(self, x):
        outs = []
        for feature in (self.stem(x), F.avg_pool2d(self.stem(x), 2)):
            box = self.box(feature).permute(0, 2, 3, 1).contiguous().view(x.shape[0], -1, 4)
            cls = self.cls(feature).permute(0, 2, 3, 1).contiguous().view(x.shape[0], -1, 2)
            outs.append(torch.cat([box, cls], dim=2))
        return torch.cat(outs, dim=1).flatten(1)


def test_a_view_of_axes_the_code_moved_itself_is_no_reshape_bug():
    torch.manual_seed(0)
    batch = (torch.randn(8, 3, 4, 4), torch.randn(8, 1080))
    report = nndx.probe(AnchorHeads(), batch, F.mse_loss, probes=[])
    assert report.model.forward_observed and report.model.moved_axes == []
    assert "NNDX404" not in {f.rule_id for f in nndx.diagnose(report).findings}


def test_splits_and_merges_of_axes_are_not_interleaving():
    from nndx.collector.probes._observe import moved_axis

    interleaving = [([32, 16, 96], [32, 4, 16, 24]), ([32, 12, 4], [12, 32, 4]), ([8, 3, 16, 16], [8, 16, 16, 3])]
    regrouping = [([32, 16, 96], [32, 16, 4, 24]), ([32, 16, 96], [512, 96]), ([16, 256], [16, 16, 16]),
                  ([32, 16, 96], [32, 192, 8]), ([64, 1, 28, 28], [64, 28, 28]), ([160, 50], [16, 10, 50]),
                  ([8, 784], [8, 1, 28, 28]), ([32, 16, 96], [32, 1536]), ([16, 16, 8], [16, 16, 8]),
                  ([16, 32, 2, 16], [16, 32, 32])]  # GPT-2's 2 heads of 16 merged back over 32 positions  # fmt: skip
    # a class axis viewed last: pixelcnn's logits flattened without the permute (a 4-class head on 8 x 8)
    interleaving += [([32, 4, 8, 8], [2048, 4]), ([32, 4, 8, 8], [32, 64, 4])]
    # the sizes swapped (iTransformer's embedding reshaped where permuted, even when one divides the other;
    # view(T, B, F) for a (B, T, F) batch) against consecutive steps grouped into the features (makemore
    # part 5's FlattenConsecutive: 8 steps of 16 as 4 of 32, whose 32 is the batch's size by chance)
    interleaving += [([32, 96, 7], [32, 7, 96]), ([32, 96, 8], [32, 8, 96]), ([32, 8, 16], [8, 32, 16])]
    regrouping += [([32, 8, 16], [32, 4, 32]), ([32, 4, 32], [32, 2, 64])]
    assert all(moved_axis(before, after) for before, after in interleaving)
    assert not any(moved_axis(before, after) for before, after in regrouping)


class RelativeShiftAttention(nn.Module):
    """Transformer-XL's relative attention: scores against relative positions, moved into
    place by ``_rel_shift`` — pad a zero column, view the padded (q, k + 1) scores as
    (k + 1, q), drop the first row, view back. The view interleaves on purpose: each row
    slides by one. ``skew="view_of_unpadded"`` is the same regrouping without the padding (a bug)."""

    def __init__(self, skew: str = "padded") -> None:
        super().__init__()
        self.embed, self.q, self.r = nn.Embedding(11, 16), nn.Linear(16, 16), nn.Parameter(torch.randn(16, 16))
        self.out, self.skew = nn.Linear(16, 11), skew

    def _rel_shift(self, x):  # x: (q, k, batch)
        if self.skew == "view_of_unpadded":
            return x.reshape(x.size(1), x.size(0), *x.size()[2:]).reshape_as(x)
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1)
        x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    def forward(self, idx):  # idx: (time, batch)
        h = self.embed(idx)
        keys = torch.cat([h[:4].detach(), h])  # a memory of 4 earlier positions in front
        scores = self._rel_shift(torch.einsum("ibd,jd->ijb", self.q(h), self.r[: len(keys)]))
        return self.out(torch.einsum("ijb,jbd->ibd", scores.softmax(1), keys))


def test_transformer_xl_relative_shift_is_no_reshape_bug():
    torch.manual_seed(0)
    batch = (torch.randint(0, 11, (12, 4)), torch.randint(0, 11, (12, 4)))

    def loss(out, y):
        return F.cross_entropy(out.reshape(-1, 11), y.reshape(-1))

    report = nndx.probe(RelativeShiftAttention(), batch, loss, probes=[])
    assert report.model.moved_axes == [] and "NNDX404" not in {f.rule_id for f in nndx.diagnose(report).findings}
    assert nndx.probe(RelativeShiftAttention("view_of_unpadded"), batch, loss, probes=[]).model.moved_axes


class FieldAttention(nn.Module):
    """DeepCTR's AutoInt and DCN in miniature: field embeddings at DeepCTR's init_std 1e-4
    (its default), attention over the fields, and a dense MLP over the dense features whose
    one-unit output is summed into the logit (a head, not a hidden layer of 1 unit)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(40, 8)
        nn.init.normal_(self.embed.weight, std=1e-4)
        self.query, self.dense = nn.Linear(8, 8), nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
        self.out = nn.Linear(8 * 5, 1)

    def forward(self, fields, dense):
        e = self.embed(fields)  # (batch, 5 fields, 8)
        attention = torch.softmax(self.query(e) @ e.transpose(1, 2), dim=-1)
        return (self.out((attention @ e).flatten(1)) + self.dense(dense)).squeeze(1)


def test_small_embedding_init_and_a_branch_summed_into_the_logit_are_no_bad_init_nor_bottleneck():
    g = torch.Generator().manual_seed(0)
    fields, dense = torch.randint(0, 40, (64, 5), generator=g), torch.randn(64, 3, generator=g)
    clicks = (torch.rand(64, generator=g) < 0.3).float()
    model = FieldAttention()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with nndx.Monitor(model, optimizer) as monitor:
        for _ in range(20):
            optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(fields, dense), clicks)
            loss.backward()
            optimizer.step()
            monitor.log(loss)
    report = nndx.probe(model, ((fields, dense), clicks), F.binary_cross_entropy_with_logits, monitor=monitor)
    found = {f.rule_id for f in nndx.diagnose(report).findings}
    assert "NNDX207" not in found and "NNDX403" not in found


class TwoHeads(nn.Module):
    """ACGAN's discriminator: (Sigmoid validity, class scores); the class loss reads the second."""

    def __init__(self, softmax: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2))
        self.adv_layer = nn.Sequential(nn.Linear(16, 1), nn.Sigmoid())
        self.aux_layer = nn.Sequential(nn.Linear(16, 3), nn.Softmax(dim=1)) if softmax else nn.Linear(16, 3)

    def forward(self, x):
        h = self.body(x)
        return self.adv_layer(h), self.aux_layer(h)


@pytest.mark.parametrize("softmax", [False, True])
def test_the_output_activation_is_that_of_the_output_the_loss_reads(softmax):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    report = nndx.probe(TwoHeads(softmax), (x, y), lambda out, t: F.cross_entropy(out[1], t), progress=False,
                        probes=["hooks"])  # fmt: skip
    assert report.model.output_activation == ("Softmax" if softmax else None)
    codes = {f.code.value for f in nndx.diagnose(report).findings if f.severity != "info"}
    assert "WRONG_OUTPUT_ACTIVATION" not in codes
    assert ("DOUBLE_SOFTMAX" in codes) == softmax


@pytest.mark.parametrize("path", ["module", "functional"])
def test_class_imbalance_the_loss_weights_against_is_context(path):
    """LDAM-DRW trains on a long-tailed split (143:1 here) on purpose and re-weights the
    classes in its loss (F.cross_entropy(..., weight=per_cls_weights)). Imbalance the loss
    weights against is context; the same split with an unweighted loss warns."""
    torch.manual_seed(0)
    counts = [143, 86, 51, 30, 18, 11, 6, 3, 2, 1]
    y = torch.cat([torch.full((n,), k) for k, n in enumerate(counts)])
    x = torch.randn(len(y), 8) + y[:, None].float()
    weights = 1.0 / torch.tensor(counts, dtype=torch.float)
    weights = weights / weights.sum() * len(counts)

    def severity(weight):
        if path == "module":
            loss = torch.nn.CrossEntropyLoss(weight=weight)
        else:
            def loss(out, target):
                return F.cross_entropy(out, target, weight=weight)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        report = nndx.probe(model, (x[::3], y[::3]), loss, data=(x, y), probes=[])
        return next((f.severity for f in nndx.diagnose(report).findings if f.rule_id == "NNDX504"), None)

    assert severity(None) == "warning"
    assert severity(weights) == "info"
    assert severity(torch.ones(10)) == "warning"  # weights that weight nothing


class ProjectThenDeconvolve(nn.Module):
    """AntixK's WAE decoder and the context encoder's bottleneck: a layer of another kind read by a
    transposed convolution with nothing between (a dense projection viewed as maps, a 1x1 code), ReLUs
    elsewhere; or two transposed convolutions of one decoder with the ReLU between them forgotten."""

    def __init__(self, first: str, forgotten: bool = False) -> None:
        super().__init__()
        self.first = first
        self.project = nn.Linear(8, 4 * 2 * 2) if first == "linear" else nn.Conv2d(1, 4, 1)
        self.up1, self.up2 = nn.ConvTranspose2d(4, 4, 2, stride=2), nn.ConvTranspose2d(4, 1, 2, stride=2)
        self.forgotten = forgotten

    def forward(self, x):
        h = self.project(x).view(-1, 4, 2, 2) if self.first == "linear" else self.project(x)
        h = self.up1(h)
        return self.up2(h if self.forgotten else F.relu(h))


@pytest.mark.parametrize("first", ["linear", "conv"])
def test_a_transposed_convolution_reading_a_layer_of_another_kind_is_context(first):
    torch.manual_seed(0)
    x = torch.rand(16, 8) if first == "linear" else torch.rand(16, 1, 2, 2)

    def found(forgotten):
        model = ProjectThenDeconvolve(first, forgotten)
        target = model(x).detach().clone().uniform_()
        report = nndx.probe(model, (x, target), nn.MSELoss(), probes=["nan_origin"], progress=False)
        return {f.evidence["linear_pairs"][0]: f.severity for f in nndx.diagnose(report).findings
                if f.rule_id == "NNDX401"}  # fmt: skip

    assert found(False) == {"project -> up1": "info"}
    assert found(True)["up1 -> up2"] == "warning"
