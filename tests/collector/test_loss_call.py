"""What reaches torch's loss is evidence whoever wraps it: a loss function of the user's
own (a plain ``def``) shows the call of torch's loss inside it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nndx


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def mse_on_class_index(out, y):
    return F.mse_loss(out, y.float().unsqueeze(-1))  # broadcasts [64, 4] against [64, 1]


def my_cross_entropy(out, y):
    return F.cross_entropy(out, y)


def test_a_broadcast_inside_the_users_own_loss_function_is_seen():
    report = nndx.probe(model(), batch(), mse_on_class_index, probes=["nan_origin"], progress=False)
    inner = [c for c in report.loop.loss_calls if c.loss_type == "MSELoss"]
    assert inner and inner[0].output_shape == [64, 4] and inner[0].target_shape == [64, 1]
    assert "SHAPE_BROADCAST" in [f.code.value for f in nndx.diagnose(report).findings]


def test_a_correct_loss_of_the_users_own_is_silent():
    report = nndx.probe(model(), batch(), my_cross_entropy, probes=["nan_origin"], progress=False)
    assert [c.loss_type for c in report.loop.loss_calls] == ["my_cross_entropy", "CrossEntropyLoss"]
    assert nndx.diagnose(report).healthy


def test_what_the_probes_saw_inside_the_loss_survives_the_merge_with_the_monitors_calls():
    """The ViT port wraps its label-smoothing loss in the Monitor (mon.loss_fn) and probes
    after training: the Monitor's call of the same signature carried no ``applies``, and
    replaced the probes' call that did."""
    x, y = batch()
    model_ = nn.Sequential(model(), nn.Softmax(dim=-1))
    optimizer = torch.optim.SGD(model_.parameters(), lr=0.1)
    with nndx.Monitor(model_, optimizer, every=1, loss_fn=LabelSmoothingCrossEntropy()) as mon:
        for _ in range(3):
            optimizer.zero_grad()
            loss = mon.loss_fn(model_(x), y)
            loss.backward()
            optimizer.step()
            mon.log(loss)
    report = nndx.probe(model_, (x, y), LabelSmoothingCrossEntropy(), optimizer=optimizer, monitor=mon,
                        probes=["nan_origin"], progress=False)  # fmt: skip
    (own,) = [c for c in report.loop.loss_calls if c.loss_type == "LabelSmoothingCrossEntropy"]
    assert own.calls >= 3 and own.applies == "log_softmax"
    assert "NNDX314" in {f.rule_id for f in nndx.diagnose(report).findings}


def test_kl_divergence_on_probabilities_inside_a_distillation_loss_is_a_wrong_loss():
    """The knowledge-distillation loss of the user's own: KL of temperature-softened student
    and teacher distributions plus cross-entropy. KLDivLoss takes log-probabilities; given
    the student's softmax it is negative and trains the wrong thing."""
    torch.manual_seed(1)
    teacher = nn.Sequential(nn.Linear(8, 4))
    x, y = batch()
    with torch.no_grad():
        soft = teacher(x)

    def distillation(norm):
        def loss(out, targets):
            labels, teacher_out = targets
            kl = nn.KLDivLoss(reduction="batchmean")(norm(out / 4.0, dim=1), F.softmax(teacher_out / 4.0, dim=1))
            return kl * 16.0 * 0.9 + F.cross_entropy(out, labels) * 0.1
        return loss

    found = {}
    for name, norm in (("log_softmax", F.log_softmax), ("softmax", F.softmax)):
        report = nndx.probe(model(), (x, (y, soft)), distillation(norm), probes=["nan_origin"], progress=False)
        found[name] = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert "NNDX315" not in found["log_softmax"]
    assert "KLDivLoss" in found["softmax"]["NNDX315"].symptom


class LabelSmoothingCrossEntropy(nn.Module):
    """A label-smoothing loss written by hand (omihub777/ViT-CIFAR's): log_softmax inside."""

    def forward(self, pred, target):
        pred = pred.log_softmax(dim=-1)
        with torch.no_grad():
            smooth = torch.full_like(pred, 0.1 / (pred.shape[-1] - 1)).scatter_(1, target.unsqueeze(1), 0.9)
        return torch.mean(torch.sum(-smooth * pred, dim=-1))


def test_a_softmax_head_before_a_hand_written_loss_that_applies_log_softmax_is_a_double_softmax():
    x, y = batch()
    found = {}
    for name, head in (("logits", nn.Identity()), ("softmax", nn.Softmax(dim=-1))):
        report = nndx.probe(nn.Sequential(model(), head), (x, y), LabelSmoothingCrossEntropy(), probes=["nan_origin"],
                            progress=False)  # fmt: skip
        own = next(c for c in report.loop.loss_calls if c.loss_type == "LabelSmoothingCrossEntropy")
        assert own.applies == "log_softmax"
        found[name] = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert "NNDX314" not in found["logits"]
    assert "log_softmax itself" in found["softmax"]["NNDX314"].symptom


def test_a_broadcast_in_a_loss_written_as_arithmetic_is_seen():
    """A PINN's data term, ``torch.mean((u - u_pred) ** 2)``, with u flattened to [N] against
    the network's [N, 1]: no torch loss is called, so no warning; the op's shapes show it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    u = torch.sin(x[:, :1]).detach()
    regressor = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))

    def data_term(u_pred, target):
        return torch.mean((target - u_pred) ** 2)

    codes = {}
    for name, target in (("column", u), ("flat", u.flatten())):
        report = nndx.probe(regressor, (x, target), data_term, probes=["nan_origin"], progress=False)
        codes[name] = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert "NNDX312" not in codes["column"]
    assert "into [64, 64]" in codes["flat"]["NNDX312"].symptom


def test_a_broadcast_through_where_or_a_comparison_in_the_users_loss_is_seen():
    """fastbook's mnist_loss, ``torch.where(targets == 1, 1 - predictions, predictions).mean()``,
    with targets left [N] beside [N, 1] predictions (``unsqueeze(1)`` forgotten): a three-operand
    op broadcasts them into [N, N]. A hinge loss's ``torch.maximum`` does the same."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).float()
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def mnist_loss(predictions, targets):
        predictions = predictions.sigmoid()
        return torch.where(targets == 1, 1 - predictions, predictions).mean()

    def hinge(scores, targets):
        return torch.maximum(torch.zeros_like(scores), 1 - scores * (2 * targets - 1)).mean()

    def nndx312(loss, target):
        report = nndx.probe(net, (x, target), loss, probes=["nan_origin"], progress=False)
        return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX312"]

    for loss in (mnist_loss, hinge):
        (found,) = nndx312(loss, y)
        assert "into [64, 64]" in found.symptom, found.symptom
        assert nndx312(loss, y.unsqueeze(1)) == []


def test_batches_of_one_class_are_counted_with_their_class():
    from nndx.collector.loss_call import LossCallLog

    log = LossCallLog()
    out = torch.randn(16, 3)
    log.add("CrossEntropyLoss", out, torch.full((16,), 2))  # a batch of class 2 only
    log.add("CrossEntropyLoss", out, torch.full((16,), 0), measure=True)
    log.add("CrossEntropyLoss", out, torch.arange(16) % 3, measure=True)  # mixed
    log.add("CrossEntropyLoss", out, torch.full((16,), 1))  # not measured: counted only
    (call,) = log.records()
    assert (call.calls, call.measured_batches, call.single_target_batches) == (4, 3, 2)
    assert sorted(call.single_target_values) == [0.0, 2.0]
    one_row = LossCallLog()
    one_row.add("CrossEntropyLoss", torch.randn(1, 3), torch.tensor([1]))  # one target: no evidence
    assert one_row.records()[0].measured_batches == 0


def test_bce_on_minus_one_plus_one_labels_is_named_as_the_labels_encoding():
    """-1/+1 labels into BCEWithLogitsLoss: the loss has no minimum and falls below 0. The
    root is the encoding (LABEL_DTYPE), seen in the targets' range at the loss; 0/1 labels
    of the same data are healthy."""
    torch.manual_seed(0)
    x = torch.randn(256, 10)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).float()[:, None]
    found = {}
    for name, target in (("plus_minus", 2 * y - 1), ("zero_one", y)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
        report = nndx.probe(net, (x[:64], target[:64]), nn.BCEWithLogitsLoss(), progress=False)
        call = report.loop.loss_calls[0]
        assert (call.target_min, call.target_max) == ((-1.0, 1.0) if name == "plus_minus" else (0.0, 1.0))
        found[name] = [f for f in nndx.diagnose(report).findings if f.severity != "info"]
    assert found["plus_minus"][0].code.value == "LABEL_DTYPE"
    assert found["zero_one"] == []


def _ignored_findings(targets: torch.Tensor, classes: int, direct: bool) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, classes), nn.LogSoftmax(dim=1))
    criterion = nn.NLLLoss(ignore_index=0)

    def own_loss(out, y):  # BERT-pytorch's trainer: one criterion for both of its tasks
        return criterion(out, y)

    report = nndx.probe(model, (torch.randn(len(targets), 8), targets), criterion if direct else own_loss,
                        probes=["nan_origin"], progress=False)  # fmt: skip
    return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX326"]


@pytest.mark.parametrize("direct", [True, False])
def test_an_ignore_index_that_leaves_one_class_to_score_is_a_wrong_loss(direct):
    next_sentence = torch.arange(64) % 2  # is-next 1, not-next 0: the criterion made for padding drops half
    (finding,) = _ignored_findings(next_sentence, 2, direct)
    assert finding.evidence["ignore_index"] == 0 and finding.evidence["scored_classes"] == 1
    masked_tokens = torch.where(torch.arange(64) % 4 == 0, torch.arange(64) % 19 + 1, 0)  # 0: not masked
    assert _ignored_findings(masked_tokens, 20, direct) == []


class LineReader(nn.Module):
    """crnn.pytorch's head on features: (time, batch, classes) scores for CTCLoss;
    ``log_softmax=False`` is the reported bug (raw scores given to the CTC loss)."""

    def __init__(self, log_softmax: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.log_softmax = log_softmax
        self.rnn, self.head = nn.LSTM(8, 16), nn.Linear(16, 6)

    def forward(self, x):
        scores = self.head(self.rnn(x)[0])
        return scores.log_softmax(2) if self.log_softmax else scores


def ctc(scores, targets):
    labels, lengths = targets
    sizes = torch.full((scores.shape[1],), scores.shape[0], dtype=torch.long)
    return nn.CTCLoss(reduction="sum", zero_infinity=True)(scores, labels, sizes, lengths) / scores.shape[1]


@pytest.mark.parametrize("log_softmax", [True, False])
def test_a_loss_that_takes_log_probabilities_given_raw_scores_is_a_wrong_loss(log_softmax):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 16, 8, generator=g)
    labels, lengths = torch.randint(1, 6, (16, 3), generator=g), torch.full((16,), 3, dtype=torch.long)
    report = nndx.probe(LineReader(log_softmax), (x, (labels, lengths)), ctc, probes=["nan_origin"], progress=False)
    found = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert [c.loss_type for c in report.loop.loss_calls] == ["ctc", "CTCLoss"]
    assert ("NNDX315" in found) == (not log_softmax)
    if not log_softmax:
        assert "above 0" in found["NNDX315"].symptom
    # NLLLoss on logits: the same class
    report = nndx.probe(model(), batch(), nn.NLLLoss(), probes=["nan_origin"], progress=False)
    assert "NNDX315" in {f.rule_id for f in nndx.diagnose(report).findings}


class Transcriber(nn.Module):
    """DeepSpeech's shape: (batch, time, characters) out of a recurrent layer; ``softmax``
    puts its inference-time softmax in training too (deepspeech.pytorch's
    InferenceBatchSoftmax without its training switch)."""

    def __init__(self, softmax: bool):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.GRU(6, 16, batch_first=True)
        self.fc = nn.Linear(16, 5)
        self.softmax = softmax

    def forward(self, x):
        out = self.fc(self.rnn(x)[0])
        return out.softmax(-1) if self.softmax else out


def transcription_loss(out, targets):
    """training_step's loss: time-major log-probabilities for CTCLoss, log_softmax applied here."""
    log_probs = out.transpose(0, 1).log_softmax(-1)
    lengths = torch.full((out.shape[0],), out.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs, targets, lengths, torch.full((out.shape[0],), targets.shape[1], dtype=torch.long))


def test_a_softmax_before_a_time_major_ctc_loss_is_a_double_softmax():
    g = torch.Generator().manual_seed(0)
    x, targets = torch.randn(8, 12, 6, generator=g), torch.randint(1, 5, (8, 3), generator=g)
    found = {}
    for softmax in (False, True):
        report = nndx.probe(Transcriber(softmax), (x, targets), transcription_loss, probes=["nan_origin"],
                            progress=False)  # fmt: skip
        found[softmax] = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert "NNDX314" not in found[False]
    assert "log_softmax itself" in found[True]["NNDX314"].symptom


def test_per_pixel_logits_viewed_without_moving_the_classes_last_are_an_interleaving_view():
    """jzbontar/pixelcnn-pytorch's loss written as cross_entropy(out.view(-1, C), target.view(-1))
    on (N, C, H, W) logits: each row holds C neighbouring values of one map, not one pixel's
    classes. With permute(0, 2, 3, 1) first, or cross-entropy on the (N, C, H, W) logits, it
    is right."""
    g = torch.Generator().manual_seed(0)
    images, targets = torch.rand(8, 1, 6, 6, generator=g), torch.randint(0, 4, (8, 6, 6), generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))

    def viewed(out, y):
        return F.cross_entropy(out.view(-1, 4), y.view(-1))

    def permuted(out, y):
        return F.cross_entropy(out.permute(0, 2, 3, 1).reshape(-1, 4), y.view(-1))

    found = {}
    for loss in (viewed, permuted):
        report = nndx.probe(net, (images, targets), loss, probes=["nan_origin", "hooks"], progress=False)
        found[loss.__name__] = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert "NNDX404" not in found["permuted"]
    assert "loss: view [8, 4, 6, 6] -> [288, 4]" in found["viewed"]["NNDX404"].symptom


class LossInside(nn.Module):
    """A model that computes its own loss in forward and returns it (ELECTRA's discriminator,
    a Hugging Face model given labels): the probe's loss_fn is None and reads ``.loss``."""

    def __init__(self, softmax: bool) -> None:
        super().__init__()
        self.body, self.softmax = model(), softmax

    def forward(self, pixel_values, labels):
        logits = self.body(pixel_values)
        scores = logits.softmax(dim=-1) if self.softmax else logits
        return {"loss": F.cross_entropy(scores, labels), "logits": logits}


@pytest.mark.parametrize("softmax", [False, True])
def test_a_loss_the_model_computes_in_its_forward_is_evidence_too(softmax):
    x, y = batch()
    report = nndx.probe(LossInside(softmax), {"pixel_values": x, "labels": y}, None, probes=["nan_origin"],
                        progress=False)  # fmt: skip
    call = next(c for c in report.loop.loss_calls if c.loss_type == "CrossEntropyLoss")
    assert call.output_shape == list(y.shape) + [4] and bool(call.output_rows_sum_to_one) == softmax
    assert ("NNDX314" in {f.rule_id for f in nndx.diagnose(report).findings}) == softmax


class Discriminator(nn.Module):
    """ELECTRA's discriminator loss, computed in forward on the non-padded tokens:
    ``binary_cross_entropy_with_logits(logits[keep], labels[keep])`` — given sigmoid outputs
    when the adapter squashes them first (electra-pytorch's first adapter ended in Sigmoid)."""

    def __init__(self, squash: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head, self.squash = nn.Linear(8, 1), squash

    def forward(self, tokens, labels):
        logits = self.head(tokens).squeeze(-1)
        logits = logits.sigmoid() if self.squash else logits
        keep = labels >= 0
        return {"loss": F.binary_cross_entropy_with_logits(logits[keep], labels[keep].float()), "logits": logits}


@pytest.mark.parametrize("squash", [False, True])
def test_a_sigmoid_before_a_loss_on_logits_inside_the_forward_is_a_double_softmax(squash):
    g = torch.Generator().manual_seed(0)
    tokens, labels = torch.randn(4, 12, 8, generator=g), torch.randint(0, 2, (4, 12), generator=g)
    labels[:, -3:] = -1  # padding
    report = nndx.probe(Discriminator(squash), {"tokens": tokens, "labels": labels}, None, probes=["nan_origin"],
                        progress=False)  # fmt: skip
    call = next(c for c in report.loop.loss_calls if c.loss_type == "BCEWithLogitsLoss")
    assert call.output_activation == ("Sigmoid" if squash else None)
    assert ("NNDX314" in {f.rule_id for f in nndx.diagnose(report).findings}) == squash


def test_a_broadcast_between_what_the_output_and_the_targets_alone_became_is_seen():
    """A dueling DQN's TD loss (higgsfield/RL-Adventure): the targets are (actions, TD targets),
    the Q-value of each action is gathered from the output as [N, 1] and minus the [N] TD targets
    is [N, N]. With the gathered values squeezed it is not; nor is a pairwise loss over the
    output alone (a contrastive loss's [N, 1, D] - [1, N, D])."""
    g = torch.Generator().manual_seed(0)
    states = torch.randn(32, 4, generator=g)
    targets = (torch.randint(0, 2, (32,), generator=g), torch.randn(32, generator=g))
    q_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    def td_loss(squeeze):
        def loss(q_values, target):
            actions, expected = target
            q = q_values.gather(1, actions.unsqueeze(1))
            return (q.squeeze(1) if squeeze else q).sub(expected.detach()).pow(2).mean()
        return loss

    def pairwise(q_values, target):
        spread = (q_values[:, None, :] - q_values[None, :, :]).pow(2).sum(-1)
        return spread.mean() + (q_values[:, 0] - target[1]).pow(2).mean()

    def nndx312(loss):
        report = nndx.probe(q_net, (states, targets), loss, probes=["nan_origin"], progress=False)
        return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX312"]

    (found,) = nndx312(td_loss(squeeze=False))
    assert "[32, 1] from the output with [32] from the targets into [32, 32]" in found.symptom
    assert nndx312(td_loss(squeeze=True)) == []
    assert nndx312(pairwise) == []


class _MaskedItems(nn.Module):
    """BERT4Rec's shape: item ids (0 pads, V + 1 masks) into an embedding with padding_idx=0, a
    scorer over the V + 1 ids (0 included), or a tagger's 5 tags over the same word embedding."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.items, self.head = nn.Embedding(22, 16, padding_idx=0), nn.Linear(16, classes)

    def forward(self, ids):
        return self.head(torch.tanh(self.items(ids))).flatten(0, 1)


def test_a_loss_that_scores_the_padding_id_as_a_class_is_seen():
    """BERT4Rec (jaywonchung/BERT4Rec-VAE-Pytorch) labels the unmasked positions 0 and scores
    them with CrossEntropyLoss(ignore_index=0); without ignore_index 85% of the targets are the
    padding id. A tagger whose 'O' tag is 0 at 80% reads words through an embedding with
    padding_idx=0 too: its 5 tags are no vocabulary of that embedding."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 21, (16, 10), generator=g)
    masked = torch.rand(16, 10, generator=g) < 0.15
    labels = torch.where(masked, ids, torch.zeros_like(ids)).flatten()
    tags = torch.where(torch.rand(160, generator=g) < 0.8, 0, torch.randint(1, 5, (160,), generator=g))

    def nndx317(model, targets, loss):
        report = nndx.probe(model, (torch.where(masked, 21, ids), targets), loss, progress=False)
        return [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX317"]

    (found,) = nndx317(_MaskedItems(21), labels, nn.CrossEntropyLoss())
    assert found.evidence["padding_id"] == 0 and found.evidence["scored_share"] > 0.7
    assert nndx317(_MaskedItems(21), labels, nn.CrossEntropyLoss(ignore_index=0)) == []
    assert nndx317(_MaskedItems(5), tags, nn.CrossEntropyLoss()) == []


class OrdinalHead(nn.Module):
    """CORAL's ordinal regression: K - 1 binary tasks, the forward returning (logits, probas)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.fc = nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Linear(16, 4)

    def forward(self, x):
        logits = self.fc(self.body(x))
        return logits, torch.sigmoid(logits)


def coral_cost(values, levels):
    return -(F.logsigmoid(values) * levels + (F.logsigmoid(values) - values) * (1 - levels)).sum(dim=1).mean()


@pytest.mark.parametrize("probas", [False, True])
def test_a_loss_of_the_users_own_given_probabilities_where_it_takes_logits_squashes_twice(probas):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    levels = (torch.randint(0, 5, (64, 1), generator=g) > torch.arange(4)).float()

    def loss_fn(output, target):
        return coral_cost(output[1] if probas else output[0], target)

    report = nndx.probe(OrdinalHead(), (x, levels), loss_fn, probes=["nan_origin"], progress=False)
    (call,) = report.loop.loss_calls
    assert call.squashes_again == ("Sigmoid -> log_sigmoid" if probas else None)
    found = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert ("NNDX314" in found) == probas
    if probas:
        assert nndx.diagnose(report).top().code.value == "DOUBLE_SOFTMAX"
