import pytest
import torch
from _probe_models import assert_untouched, batch, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

import nndx
from nndx.collector.probes.sample_independence import sample_independence


class SequenceClassifier(nn.Module):
    """An LSTM classifier over (batch, time, features) batches; ``batch_first=False`` is the bug."""

    def __init__(self, batch_first: bool, time_major_input: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.time_major_input = time_major_input
        self.lstm = nn.LSTM(4, 16, batch_first=batch_first)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        last = out[-1] if self.time_major_input else out[:, -1]
        return self.head(last)


def sequences(time_major=False, n=12, steps=7):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, steps, 4, generator=g)
    return (x.transpose(0, 1) if time_major else x), torch.randint(0, 3, (n,), generator=g)


def test_lstm_run_over_the_batch_axis_is_caught():
    result = sample_independence(SequenceClassifier(batch_first=False), sequences())
    assert result.status == "failed" and result.batch_axis == 0
    assert (result.replaced_samples, result.changed_samples) == (6, 6)  # every sample after the replaced half
    report = nndx.probe(SequenceClassifier(batch_first=False), sequences(), nn.CrossEntropyLoss(),
                        probes=["sample_independence"])  # fmt: skip
    assert [f.code.value for f in nndx.diagnose(report).findings][:1] == ["WRONG_RESHAPE"]


def test_correct_batch_first_and_time_major_models_pass():
    assert sample_independence(SequenceClassifier(batch_first=True), sequences()).status == "passed"
    time_major = sample_independence(SequenceClassifier(batch_first=False, time_major_input=True), sequences(True))
    assert time_major.status == "passed" and time_major.batch_axis == 1


def test_dropout_batchnorm_and_sampling_models_pass_in_eval_mode():
    assert sample_independence(mlp(dropout=0.5, batchnorm=True), batch()).status == "passed"

    class Sampler(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(x) + torch.randn(x.shape[0], 3)  # noise per sample

    assert sample_independence(Sampler(), batch()).status == "passed"


class MixtureDensity(nn.Module):
    """hardmaru's mixture density network on (N, 1) inputs and (N, 1) targets; ``over`` is
    the axis of the mixture weights' softmax (0, the batch, is the bug)."""

    def __init__(self, over: int):
        super().__init__()
        torch.manual_seed(0)
        self.over = over
        self.hidden, self.pi, self.sigma, self.mu = nn.Linear(1, 16), nn.Linear(16, 3), nn.Linear(16, 3), nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        return torch.softmax(self.pi(h), dim=self.over), torch.exp(self.sigma(h)), self.mu(h)


def test_one_value_per_sample_is_a_batch_not_a_sequence():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, generator=g), torch.randn(16, 1, generator=g)
    assert sample_independence(MixtureDensity(over=1), (x, y)).status == "passed"
    leaky = sample_independence(MixtureDensity(over=0), (x, y))
    assert leaky.status == "failed" and leaky.batch_axis == 0


def test_a_softmax_over_a_large_batch_is_caught_though_one_sample_barely_moves_it():
    """The mixture density network trains on 1000 samples at once: one sample's change moves
    a softmax over the batch by ~1/1000, under the rounding tolerance; half the batch does not."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 1, generator=g) * 6, torch.randn(1000, 1, generator=g)
    leaky = sample_independence(MixtureDensity(over=0), (x, y))
    assert leaky.status == "failed" and leaky.changed_samples == 500
    assert sample_independence(MixtureDensity(over=1), (x, y)).status == "passed"


def test_ambiguous_batch_axis_is_skipped_not_guessed():
    tokens = torch.randint(0, 50, (6, 9))
    lm = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    result = sample_independence(lm, (tokens, tokens))  # per-position targets: time or batch?
    assert result.status == "skipped" and "per position" in result.message
    # one unbatched sentence of token ids with a tag each: positions, not samples
    tagger = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 5))
    result = sample_independence(tagger, (torch.randint(0, 50, (9,)), torch.randint(0, 5, (9,))))
    assert result.status == "skipped" and "unbatched" in result.message


def test_model_state_untouched():
    model = mlp(batchnorm=True, dropout=0.3)
    before = snapshot(model)
    sample_independence(model, batch())
    assert_untouched(before, model)


class DenseGraphAttention(nn.Module):
    """pytorch/examples' GAT on a whole graph: node features (N, F) and a dense adjacency
    (N, N); every node attends to its neighbours, so nodes depend on each other by design.
    ``F.dropout`` (on by default, as the example's bug) ignores eval mode."""

    def __init__(self, dropout_ignores_eval: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w, self.a, self.out = nn.Linear(6, 8), nn.Linear(16, 1), nn.Linear(8, 3)
        self.ignores_eval = dropout_ignores_eval

    def forward(self, x, adj):
        h = self.w(nn.functional.dropout(x, 0.5, training=True if self.ignores_eval else self.training))
        n = h.shape[0]
        pairs = torch.cat([h.unsqueeze(1).expand(n, n, -1), h.unsqueeze(0).expand(n, n, -1)], dim=2)
        scores = self.a(pairs).squeeze(2).masked_fill(adj == 0, float("-inf"))
        return nn.functional.log_softmax(self.out(torch.softmax(scores, dim=1) @ h), dim=1)


def _graph():
    g = torch.Generator().manual_seed(0)
    adj = ((torch.rand(40, 40, generator=g) < 0.1) | torch.eye(40, dtype=torch.bool)).float()
    return (torch.randn(40, 6, generator=g), adj), torch.randint(0, 3, (40,), generator=g)


def test_a_whole_graph_with_a_dense_adjacency_is_no_batch_of_independent_samples():
    result = sample_independence(DenseGraphAttention(), _graph())
    assert result.status == "skipped" and "adjacency" in result.message


def test_a_whole_graph_is_not_halved_by_the_eval_mode_probe_and_its_dropout_bug_is_still_seen():
    from nndx.collector.probes.eval_mode import eval_mode_consistency

    healthy = eval_mode_consistency(DenseGraphAttention().eval(), _graph())
    assert healthy.status == "passed" and healthy.batch_dependence_diff is None
    broken = eval_mode_consistency(DenseGraphAttention(dropout_ignores_eval=True).eval(), _graph())
    assert broken.status == "failed" and broken.ignores_eval


def test_a_square_batch_of_per_sample_inputs_relates_no_samples():
    """64 samples of 64 features, or 16 sequences of 16 tokens with their mask: square by
    coincidence, per-sample all the same."""
    from nndx.collector._common import relates_samples

    assert not relates_samples(torch.randn(64, 64), 64)
    assert not relates_samples((torch.randint(0, 9, (16, 16)), torch.ones(16, 16)), 16)
    assert relates_samples((torch.randn(40, 6), torch.ones(40, 40)), 40)
    # a neural process's 8 functions: 4 context points beside 8 target points, one more axis alike
    assert not relates_samples((torch.randn(8, 4, 1), torch.randn(8, 4, 1), torch.randn(8, 8, 1)), 8)
    # edge features (N, N, F) beside node features (N, F) still relate the nodes
    assert relates_samples((torch.randn(8, 5), torch.randn(8, 8, 3)), 8)
    # STGCN's forward(A_hat, X): the road graph's adjacency first, then (batch, nodes, time, features)
    assert relates_samples((torch.rand(20, 20), torch.randn(50, 20, 12, 2)), 20)
    assert not relates_samples((torch.randn(20, 20), torch.randn(20, 20)), 20)  # two per-sample inputs


class NeighbourSampler(nn.Module):
    """GraphSAGE's MeanAggregator: each node averages the features of neighbours drawn with
    Python's random.sample, as many draws as it has neighbours to choose from, so replacing
    one node shifts the draws of every later one. ``mix`` adds a real batch mixing."""

    def __init__(self, mix: bool = False, sample: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Embedding(40, 8)
        self.head = nn.Linear(8, 3)
        self.mix, self.sample = mix, sample
        gen = torch.Generator().manual_seed(1)
        self.neighbours = [sorted(set(torch.randint(0, 40, (2 + i % 5,), generator=gen).tolist())) for i in range(40)]

    def forward(self, nodes):
        import random

        def pick(n):
            neighbours = self.neighbours[n]  # two of them, drawn by shuffling all: draws per node vary
            return random.sample(neighbours, len(neighbours))[:2] if self.sample else neighbours[:2]

        rows = [self.features(torch.tensor(pick(n))).mean(0) for n in nodes.view(-1).tolist()]
        h = torch.stack(rows)
        return self.head(h - h.mean(0) if self.mix else h)


def test_a_forward_that_samples_from_pythons_stream_is_not_read_as_mixing():
    nodes, labels = torch.arange(12).view(12, 1), torch.randint(0, 3, (12,))
    import random

    state = random.getstate()
    sampled = sample_independence(NeighbourSampler(), (nodes, labels))
    assert sampled.status == "skipped" and "random stream" in sampled.message
    assert random.getstate() == state  # the user's stream is where it was
    assert sample_independence(NeighbourSampler(sample=False), (nodes, labels)).status == "passed"
    assert sample_independence(NeighbourSampler(mix=True, sample=False), (nodes, labels)).status == "failed"


class FunctionalLearner(nn.Module):
    """MAML-Pytorch's Learner: batch norm written as F.batch_norm(..., training=True), batch
    statistics in train and eval mode alike (transductive, by design)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w, self.b = nn.Parameter(torch.randn(8, 4) * 0.5), nn.Parameter(torch.zeros(8))
        self.head = nn.Parameter(torch.randn(3, 8) * 0.5)

    def forward(self, x):
        h = nn.functional.linear(x, self.w, self.b)
        h = nn.functional.batch_norm(h, None, None, training=True)
        return nn.functional.linear(torch.relu(h), self.head)


def test_functional_batch_statistics_are_not_read_as_a_reshape():
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    result = sample_independence(FunctionalLearner(), (x, y))
    assert result.status == "skipped" and result.changed_samples > 0 and "batch_norm" in result.message


def test_batchnorm_without_running_statistics_couples_the_samples_in_eval_mode_by_design():
    """BatchNorm(track_running_stats=False) normalises by the batch in eval mode too (Reptile's
    few-shot learner): moved outputs are that design, named; the same net with running
    statistics keeps its samples apart in eval mode."""
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    torch.manual_seed(0)
    batch_stats = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 3))
    result = sample_independence(batch_stats, (x, y))
    assert result.status == "skipped" and result.changed_samples > 0 and "track_running_stats" in result.message
    torch.manual_seed(0)
    running = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    assert sample_independence(running, (x, y)).status == "passed"


class MinibatchStddevCritic(nn.Module):
    """StyleGAN2's discriminator end (rosinality/stylegan2-pytorch): the standard deviation
    of each feature over groups of 4 samples, ``out.view(group, -1, ...).var(0)``, averaged
    and concatenated as one more channel, so that the critic sees the batch's variety (and
    mode collapse). The samples are coupled on purpose. ``spread=False``: the same critic
    with the batch mean subtracted instead, ``x - x.mean(0)``, which is no such design."""

    def __init__(self, spread: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.out, self.spread = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(9 * 16, 1), spread

    def forward(self, x):
        h = torch.relu(self.conv(x))
        if not self.spread:
            return self.out(torch.cat([h, h[:, :1] - h[:, :1].mean(0)], 1).flatten(1))
        n, c, height, width = h.shape
        group = min(n, 4)
        stddev = h.view(group, -1, 1, c, height, width)
        stddev = torch.sqrt(stddev.var(0, unbiased=False) + 1e-8).mean([2, 3, 4], keepdim=True).squeeze(2)
        stddev = stddev.repeat(group, 1, height, width)
        return self.out(torch.cat([h, stddev], 1).flatten(1))


def test_a_minibatch_standard_deviation_couples_the_samples_by_design():
    x, y = torch.randn(16, 1, 4, 4), torch.rand(16, 1)
    result = sample_independence(MinibatchStddevCritic(), (x, y))
    assert result.status == "skipped" and result.changed_samples > 0 and "var" in result.message
    assert sample_independence(MinibatchStddevCritic(spread=False), (x, y)).status == "failed"


class LengthSortedClassifier(nn.Module):
    """bentrevett's sentiment RNN in the pre-1.1 recipe: the batch sorted by length for
    pack_padded_sequence(enforce_sorted=True); ``unsort=False`` (the bug) returns the
    predictions in that sorted order; ``return_order`` returns the order beside them (the
    image-captioning decoders' sort_ind, which their loss applies to the targets)."""

    def __init__(self, unsort: bool, return_order: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.unsort, self.return_order = unsort, return_order
        self.emb, self.rnn, self.head = nn.Embedding(20, 8), nn.GRU(8, 8, batch_first=True), nn.Linear(8, 1)

    def forward(self, text, lengths):
        lengths, order = lengths.sort(descending=True)
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(text[order]), lengths, batch_first=True)
        out = self.head(self.rnn(packed)[1][-1])
        if self.return_order:
            return out, order
        return out[order.argsort()] if self.unsort else out


def reviews(n=16, steps=16):
    """As many reviews as tokens per review: either axis could hold the samples."""
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(3, steps + 1, (n,), generator=g)
    text = torch.randint(1, 20, (n, steps), generator=g) * (torch.arange(steps)[None, :] < lengths[:, None])
    return (text, lengths), torch.randint(0, 2, (n,), generator=g).float()


def test_a_batch_sorted_and_never_unsorted_is_misaligned_and_a_square_batch_is_read_along_either_axis():
    result = sample_independence(LengthSortedClassifier(unsort=False), reviews())
    assert result.status == "failed" and result.reordered and result.batch_axis == 0
    report = nndx.probe(LengthSortedClassifier(unsort=False), reviews(), nn.BCEWithLogitsLoss(),
                        probes=["sample_independence"])  # fmt: skip
    assert [f.code.value for f in nndx.diagnose(report).findings][:1] == ["LABELS_MISALIGNED"]
    healthy = sample_independence(LengthSortedClassifier(unsort=True), reviews())
    assert healthy.status == "passed" and healthy.batch_axis == 0
    with_order = sample_independence(LengthSortedClassifier(unsort=False, return_order=True), reviews())
    assert with_order.status == "skipped" and "sort_ind" in with_order.message
    # mixing is not reordering: an LSTM over the batch axis moves rows to values no sample had
    mixed = sample_independence(SequenceClassifier(batch_first=False), sequences())
    assert mixed.status == "failed" and mixed.reordered is False
    # 8 samples of 8 features: the per-sample axis passes; one that mixes fails along both
    assert sample_independence(mlp(), (torch.randn(8, 8), torch.randint(0, 3, (8,)))).status == "passed"
    centred = nn.Sequential(mlp(), Centre())
    assert sample_independence(centred, (torch.randn(8, 8), torch.randint(0, 3, (8,)))).status == "failed"


class Centre(nn.Module):
    def forward(self, x):
        return x - x.mean(0)


class FactorizationMachine(nn.Module):
    """DeepFM's pairwise term; ``whole_batch`` reduces with torch.sum(ix) and no dim=, a
    reported bug: one scalar over the whole batch is broadcast onto every sample's logit."""

    def __init__(self, whole_batch: bool):
        super().__init__()
        torch.manual_seed(0)
        self.whole_batch = whole_batch
        self.embedding = nn.Linear(6, 12)
        self.linear = nn.Linear(6, 1)

    def forward(self, x):
        v = self.embedding(x).view(len(x), 3, 4)
        ix = v.sum(dim=1) ** 2 - (v**2).sum(dim=1)
        pairwise = torch.sum(ix) if self.whole_batch else torch.sum(ix, dim=1, keepdim=True)
        return self.linear(x) + 0.5 * pairwise


def test_a_reduction_that_forgot_its_dim_is_a_broadcast_not_a_reshape():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(32, 6, generator=g), torch.randint(0, 2, (32, 1), generator=g).float()
    result = sample_independence(FactorizationMachine(whole_batch=True), (x, y))
    assert result.status == "failed" and result.batch_reduction and "sum" in result.batch_reduction
    report = nndx.probe(FactorizationMachine(whole_batch=True), (x, y), nn.BCEWithLogitsLoss(),
                        probes=["sample_independence"])  # fmt: skip
    assert [f.code.value for f in nndx.diagnose(report).findings][:1] == ["SHAPE_BROADCAST"]
    assert sample_independence(FactorizationMachine(whole_batch=False), (x, y)).status == "passed"
    # sigmoids saturated at 1.0 match many rows at once: the reversed outputs are compared in place
    saturating = torch.cat([x[:16] * 0 + 40, x[16:]])
    saturated = sample_independence(SumShifted(), (saturating, y))
    assert saturated.status == "failed" and saturated.batch_reduction
    # a statistic along the batch axis that keeps it (a centring, a softmax over dim 0) is no dropped dim=
    centred = sample_independence(nn.Sequential(mlp(), Centre()), (torch.randn(8, 8), torch.randint(0, 3, (8,))))
    assert centred.status == "failed" and not centred.batch_reduction
    # nor is a whole-tensor reduction of a model whose samples mix by position (an LSTM over the batch axis)
    mixed = sample_independence(NormedSequenceClassifier(), sequences())
    assert mixed.status == "failed" and not mixed.batch_reduction


class NormedSequenceClassifier(SequenceClassifier):
    """batch_first=False on (batch, time, features), and a whole-tensor norm that is no bug
    in itself (a weight scale)."""

    def __init__(self):
        super().__init__(batch_first=False)

    def forward(self, x):
        return super().forward(x) / self.head.weight.norm()


class SumShifted(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 1)

    def forward(self, x):
        return torch.sigmoid(self.linear(x) + 0.01 * torch.sum(x))


class AttentionSeq2Seq(nn.Module):
    """pytorch-seq2seq's notebook 3 in miniature: time-major ``forward(src, trg, ratio)``,
    Bahdanau attention over the source positions (``softmax_dim=1``; the reported bug takes
    it over the batch, 0), a teacher-forcing coin per step from Python's ``random``."""

    def __init__(self, softmax_dim: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.softmax_dim = softmax_dim
        self.src_emb, self.trg_emb = nn.Embedding(9, 8), nn.Embedding(9, 8)
        self.encoder, self.decoder = nn.GRU(8, 12), nn.GRUCell(8 + 12, 12)
        self.score, self.head = nn.Linear(24, 1), nn.Linear(12, 9)

    def forward(self, src, trg, ratio):
        import random

        enc = self.encoder(self.src_emb(src))[0]  # (src len, batch, 12)
        hidden, token = enc[-1], trg[0]
        outputs = torch.zeros(trg.shape[0], trg.shape[1], 9)
        for t in range(1, trg.shape[0]):
            energy = self.score(torch.cat([hidden.expand(len(enc), -1, -1), enc], dim=2)).squeeze(2).t()
            weights = torch.softmax(energy, dim=self.softmax_dim)  # (batch, src len)
            context = (weights.t().unsqueeze(2) * enc).sum(0)
            hidden = self.decoder(torch.cat([self.trg_emb(token), context], dim=1), hidden)
            outputs[t] = self.head(hidden)
            token = trg[t] if random.random() < ratio else outputs[t].argmax(1)
        return outputs


def test_a_decoders_targets_per_position_beside_a_longer_source_are_read_along_the_batch():
    g = torch.Generator().manual_seed(0)
    src, trg = torch.randint(0, 9, (7, 10), generator=g), torch.randint(0, 9, (5, 10), generator=g)
    healthy = sample_independence(AttentionSeq2Seq(), ((src, trg, 0.5), trg))
    assert healthy.status == "passed" and healthy.batch_axis == 1 and healthy.samples == 10
    mixed = sample_independence(AttentionSeq2Seq(softmax_dim=0), ((src, trg, 0.5), trg))
    assert mixed.status == "failed" and mixed.changed_samples > 0
    # a language model's (batch, time) targets still cannot tell the batch from time
    tokens = torch.randint(0, 9, (6, 8), generator=g)
    assert sample_independence(AttentionSeq2Seq(), ((tokens, tokens, 0.5), tokens)).status == "skipped"


class HeldGraph(nn.Module):
    """DaehanKim/vgae_pytorch's shape: the normalised adjacency is an attribute of the model,
    not an input; the forward propagates node features over it. ``decoder=True`` returns
    VGAE's inner-product scores (N, N), otherwise per-node class scores."""

    def __init__(self, adj: torch.Tensor | None, decoder: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.adj, self.decoder = adj, decoder
        self.lin, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h = h if self.adj is None else self.adj @ h
        return torch.sigmoid(h @ h.t()) if self.decoder else self.head(h)


@pytest.mark.parametrize("decoder", [True, False])
def test_a_graph_the_model_holds_relates_its_nodes_by_design(decoder):
    g = torch.Generator().manual_seed(0)
    adj = (torch.rand(20, 20, generator=g) < 0.2).float()
    adj = (adj + adj.t() + torch.eye(20)).clamp(max=1)
    adj = adj / adj.sum(1, keepdim=True)
    x = torch.randn(20, 6, generator=g)
    targets = adj.gt(0).float() if decoder else torch.randint(0, 3, (20,), generator=g)
    result = sample_independence(HeldGraph(adj, decoder), (x, targets))
    assert result.status == "skipped" and "by design" in result.message
    # the same layers with no graph, each node on its own: judged, and passed
    assert sample_independence(HeldGraph(None, False), (x, torch.randint(0, 3, (20,)))).status == "passed"


class SortedPacker(nn.Module):
    """deepspeech.pytorch's shape: ``pack_padded_sequence`` with its default
    ``enforce_sorted=True``, so a batch must come sorted longest first."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        return self.head(self.rnn(packed)[1][0])


def test_a_model_that_refuses_the_changed_batch_is_skipped_with_the_reason():
    x, lengths = torch.randn(8, 6, 4), torch.tensor([6, 6, 5, 5, 4, 3, 2, 1])
    result = sample_independence(SortedPacker(), ((x, lengths), torch.randint(0, 3, (8,))))
    assert result.status == "skipped" and "sorted" in result.message


class SortedSampler(nn.Module):
    """timbmg/Sentence-VAE: the batch is sorted by length, z is drawn for the sorted batch
    (in eval mode too) and the sort undone. Replacing samples changes the sort, so the others
    get other rows of noise: no mixing. ``noise=False, mix=True``: a real mixing after a sort."""

    def __init__(self, noise: bool = True, mix: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.noise, self.mix = nn.Linear(8, 3), noise, mix

    def forward(self, x):
        order = torch.argsort(x[:, 0], descending=True)
        h = self.fc(x[order])
        if self.noise:
            h = h + torch.randn_like(h)
        if self.mix:
            h = h - h.mean(0)
        return h[torch.argsort(order)]


def test_noise_drawn_in_an_order_the_samples_decide_is_not_read_as_mixing():
    skipped = sample_independence(SortedSampler(), batch())
    assert skipped.status == "skipped" and "sorts" in skipped.message and skipped.changed_samples > 0
    assert sample_independence(SortedSampler(noise=False), batch()).status == "passed"
    assert sample_independence(SortedSampler(noise=False, mix=True), batch()).status == "failed"


class Gaussian(nn.Module):
    """A neural process's decoder or a policy: the forward returns a torch distribution."""

    def __init__(self, mix: bool):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.mix = mlp(out=2), mix

    def forward(self, x):
        mu, log_sigma = self.body(x).unbind(-1)
        if self.mix:  # a batch mean broadcast onto every sample
            mu = mu + mu.mean()
        return torch.distributions.Normal(mu, log_sigma.exp())


def test_a_forward_that_returns_a_distribution_is_read_through_its_first_parameter():
    assert sample_independence(Gaussian(mix=False).eval(), batch()).status == "passed"
    mixed = sample_independence(Gaussian(mix=True).eval(), batch())
    assert mixed.status == "failed" and mixed.changed_samples == 8


class StepPredictor(nn.Module):
    """World Models' MDRNN in miniature: a time-major LSTM over (time, batch, action + latent)
    that predicts the next latent at every step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.LSTM(3 + 4, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, actions, latents):
        return self.head(self.rnn(torch.cat([actions, latents], dim=-1))[0])


@pytest.mark.parametrize("batch_size", [8, 5])
def test_per_step_targets_of_another_width_are_per_position_not_per_sample(batch_size):
    """(time, batch, 4) targets beside (time, batch, 3) actions: along time the steps depend on
    each other by design; the MDRNN's healthy run read time as the batch (WRONG_RESHAPE, error)."""
    g = torch.Generator().manual_seed(0)
    actions, latents = torch.randn(8, batch_size, 3, generator=g), torch.randn(8, batch_size, 4, generator=g)
    result = sample_independence(StepPredictor(), ((actions, latents), torch.randn(8, batch_size, 4, generator=g)))
    assert result.status != "failed", result.message


def test_one_image_with_dense_targets_is_a_batch_of_one_not_of_its_rows():
    """Style transfer, deep image prior, super-resolution on one image: a [1, 3, 8, 8] input
    beside [1, 8, 8, 8] targets shares only the 8 pixels a side, and a convolution mixes
    neighbouring rows by design. The batch is the leading axis both agree on: one image."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    result = sample_independence(model, (torch.rand(1, 3, 8, 8), torch.rand(1, 8, 8, 8)))
    assert result.status == "skipped" and "only 1 samples" in result.message


class _BagOfWordsDecoder(nn.Module):
    """ProdLDA's shape: a document's word counts in, a distribution over the vocabulary out, the
    loss computed by the model (no targets); ``over`` is the axis of the decoder's softmax."""

    def __init__(self, over: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.over = over
        self.encode, self.decode = nn.Linear(40, 6), nn.Linear(6, 40)

    def forward(self, counts):
        return torch.softmax(self.decode(torch.softmax(self.encode(counts), dim=1)), dim=self.over)


def test_without_targets_every_axis_is_tried_and_a_softmax_over_the_batch_is_caught():
    """No targets say which axis holds the samples: each axis is tried and the batch passes when
    one of them keeps the other samples in place. A decoder whose softmax runs over the batch
    moves the other documents along both axes (the vocabulary mixes by design): caught. The
    same model over the vocabulary, and a time-major recurrent model (time moves later steps,
    the batch keeps its samples), pass; one image is no batch."""
    counts = torch.poisson(torch.full((12, 40), 2.0), generator=torch.Generator().manual_seed(0))
    over_batch = sample_independence(_BagOfWordsDecoder(over=0), (counts, None))
    assert over_batch.status == "failed" and over_batch.batch_axis == 0, over_batch.message
    assert sample_independence(_BagOfWordsDecoder(over=1), (counts, None)).status == "passed"
    time_major = nn.LSTM(4, 5)
    assert sample_independence(time_major, (torch.randn(7, 6, 4), None)).status == "passed"
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    assert sample_independence(conv, (torch.rand(1, 3, 8, 8), None)).status == "skipped"


class SinToCos(nn.Module):
    """MorvanZhou's RNN regressor (403_RNN_regressor.py): reads sin, predicts cos at every step."""

    def __init__(self, batch_first: bool = True, recurrent: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.RNN(1, 32, batch_first=batch_first) if recurrent else nn.Linear(1, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x, h_state=None):
        if not isinstance(self.rnn, nn.RNN):
            return self.out(torch.tanh(self.rnn(x))), None
        r_out, h_state = self.rnn(x, h_state)
        return torch.stack([self.out(r_out[:, t, :]) for t in range(r_out.size(1))], dim=1), h_state


def sin_cos(batch=1, steps=10):
    t = torch.linspace(0, 3.14, steps * batch).reshape(batch, steps, 1)
    return torch.sin(t), torch.cos(t)


@pytest.mark.parametrize("steps", [10, 3])
def test_a_recurrent_layer_that_reads_no_context_along_the_sequence_is_caught(steps):
    """batch_first dropped on a (1, time, 1) batch: the RNN reads one step of 10 "samples", so no
    output depends on another position of the sequence. A batch of one cannot mix samples; its
    positions must read each other. Healthy, with the layout right or time-major, the steps
    read the ones before; a model with no recurrent layer is per position by design. (With a
    batch of two, the same bug reads like a healthy time-major model over two steps: not judged.)"""
    x, y = sin_cos(1, steps)

    def loss(out, target):
        return nn.functional.mse_loss(out[0], target)

    result = sample_independence(SinToCos(batch_first=False), (x, y))
    assert result.status == "failed" and result.no_context == "rnn", result.message
    report = nndx.probe(SinToCos(batch_first=False), (x, y), loss, probes=["sample_independence"], progress=False)
    assert [f.rule_id for f in nndx.diagnose(report).findings][:1] == ["NNDX620"]
    xs, ys = sin_cos(4, steps)
    for model, batch_ in ((SinToCos(), (x, y)), (SinToCos(batch_first=False), (xs.transpose(0, 1), ys.transpose(0, 1))),
                          (SinToCos(recurrent=False), (x, y))):  # fmt: skip
        result = sample_independence(model, batch_)
        assert result.status != "failed" and not result.no_context, result.message


class FlatSteps(nn.Module):
    """udacity's Simple_RNN: an RNN over one (1, time, 1) window, every step's output flattened to
    (time, 1) rows, scored against (time, 1) next values."""

    def __init__(self, batch_first: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.fc = nn.RNN(1, 16, batch_first=batch_first), nn.Linear(16, 1)

    def forward(self, x):
        r_out, _ = self.rnn(x)
        return self.fc(r_out.reshape(-1, 16))


def test_the_steps_of_one_sequence_flattened_to_rows_are_not_samples():
    """A batch_first RNN fed one window: the targets count its 20 steps, which the recurrence
    carries into each other; that is no mixing of samples (it was read as WRONG_RESHAPE). The same
    shapes into a time-major RNN are 20 one-step samples, still judged: they stay apart."""
    x = torch.sin(torch.linspace(0, 3.0, 21)).reshape(1, 21, 1)
    inputs, targets = x[:, :-1], x[0, 1:]
    result = sample_independence(FlatSteps(), (inputs, targets))
    assert result.status == "skipped" and "one sequence" in result.message, result.message
    assert sample_independence(FlatSteps(batch_first=False), (inputs, targets)).status == "passed"


class TimeMajorTagger(nn.Module):
    """Embedding and a time-major LSTM over (time, batch) token ids, a class per position."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.rnn, self.out = nn.Embedding(12, 8), nn.LSTM(8, 16), nn.Linear(16, 12)

    def forward(self, tokens):
        return self.out(self.rnn(self.embed(tokens))[0])


def batch_first_sentences(n=12, longest=9, pad=1, seed=0):
    """(n, longest) batch-first ids: sentences of 3 to ``longest`` tokens (ids 2-11), then padding."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.full((n, longest), pad)
    for row, length in enumerate(torch.randint(3, longest + 1, (n,), generator=g).tolist()):
        batch[row, :length] = torch.randint(2, 12, (length,), generator=g)
    return batch


def test_padded_sentences_made_time_major_by_a_reshape_are_caught():
    """persson's seq2seq: a padded batch-first batch turned (time, batch) with reshape, not .t():
    the padding lands in the middle of the lines along both axes, and the same ids read back in
    memory order are the padded sentences. A transpose, or the batch-first batch as it is, is not."""
    batch_first = batch_first_sentences()
    wrong = batch_first.reshape(batch_first.shape[1], batch_first.shape[0])
    result = sample_independence(TimeMajorTagger(), (wrong, wrong))
    assert result.status == "failed" and result.stitched["padded_lines_reread"] >= 0.25, result.message
    report = nndx.probe(TimeMajorTagger(), (wrong, wrong),
                        lambda out, y: nn.functional.cross_entropy(out.reshape(-1, 12), y.reshape(-1)),
                        probes=["sample_independence"], progress=False)  # fmt: skip
    assert [f.rule_id for f in nndx.diagnose(report).findings][:1] == ["NNDX625"]
    for right in (batch_first.t(), batch_first):
        assert not sample_independence(TimeMajorTagger(), (right, right)).stitched


class PositionalTagger(nn.Module):
    """A batch-first encoder with the PyTorch tutorial's time-major (max_len, 1, d) positional table:
    ``x + pe[:x.size(0)]`` on (batch, time, d) inputs adds row b of the table to every position of
    sample b (the bug: uvadlc's reversal task loses its positions); ``x + pe[:, :x.size(1)]`` on a
    (1, max_len, d) table is right. A time-major model adds it along time, which is no sample."""

    def __init__(self, on_batch_axis: bool, time_major: bool = False, tokens: int = 6):
        super().__init__()
        torch.manual_seed(0)
        self.on_batch_axis, self.time_major = on_batch_axis, time_major
        self.embed = nn.Linear(tokens, 16)
        self.register_buffer("pe", torch.randn(64, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=not time_major)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, tokens)

    def forward(self, x):
        x = self.embed(x)
        if self.on_batch_axis or self.time_major:
            x = x + self.pe[: x.size(0)]
        else:
            x = x + self.pe.transpose(0, 1)[:, : x.size(1)]
        return self.head(self.encoder(x))


def _reversal_batch(samples: int = 12, steps: int = 8, time_major: bool = False):
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 6, (samples, steps), generator=g)
    x, y = torch.nn.functional.one_hot(tokens, 6).float(), tokens.flip(1)
    return (x.transpose(0, 1), y.transpose(0, 1)) if time_major else (x, y)


@pytest.mark.parametrize("targets", ["per_position", "per_sample"])
def test_a_table_indexed_along_the_batch_axis_makes_outputs_depend_on_batch_position(targets):
    """Replacing half of the samples moves no other (each sample is computed on its own), but the
    reversed batch does not give the outputs reversed: sample b's output depends on b."""
    x, y = _reversal_batch()
    y = y if targets == "per_position" else y[:, 0]
    broken = sample_independence(PositionalTagger(on_batch_axis=True), (x, y))
    assert broken.status == "failed" and broken.position_dependent and broken.changed_samples == 0
    report = nndx.probe(PositionalTagger(on_batch_axis=True), (x, y), lambda out, t: out.sum() * 0 + 1.0,
                        probes=["sample_independence"])  # fmt: skip
    assert [f.code.value for f in nndx.diagnose(report).findings][:1] == ["SHAPE_BROADCAST"]
    healthy = sample_independence(PositionalTagger(on_batch_axis=False), (x, y))
    assert healthy.status in ("passed", "skipped") and not healthy.position_dependent
    time_major = sample_independence(PositionalTagger(on_batch_axis=False, time_major=True),
                                     _reversal_batch(time_major=True))  # fmt: skip
    assert time_major.status == "skipped" and not time_major.position_dependent  # positions along time


class TokenGRU(nn.Module):
    """d2l's concise GRU language model: ids (batch, time) one-hot encoded time-major for a GRU built
    without batch_first. ``one_hot(X)`` in place of ``one_hot(X.T)`` (the bug) makes the GRU run
    its recurrence over the batch. ``stateful`` keeps the last hidden state for the next call, as
    fastbook's LMModel3 does across its ordered batches (``self.h = h.detach()``, from ``self.h = 0``),
    or ``"in_place"`` appends it to a list it keeps."""

    def __init__(self, over_batch: bool = False, stateful: bool | str = False, vocab: int = 7):
        super().__init__()
        torch.manual_seed(0)
        self.over_batch, self.stateful, self.vocab = over_batch, stateful, vocab
        self.gru = nn.GRU(vocab, 16)
        self.head = nn.Linear(16, vocab)
        self.h, self.states = 0, []

    def forward(self, x):
        steps = nn.functional.one_hot(x if self.over_batch else x.T, self.vocab).float()
        state = self.states[-1] if self.stateful == "in_place" and self.states else None
        out, h = self.gru(steps, self.h if self.stateful is True and torch.is_tensor(self.h) else state)
        if self.stateful is True:
            self.h = h.detach()
        self.states.append(h.detach())
        return self.head(out).swapaxes(0, 1)


def next_tokens(samples=12, steps=9, vocab=7, time_major=False):
    g = torch.Generator().manual_seed(4)
    text = torch.randint(0, vocab, (samples, steps + 1), generator=g)
    x, y = text[:, :-1], text[:, 1:]
    return (x.T.contiguous(), y.T.contiguous()) if time_major else (x, y)


def test_targets_that_are_the_next_inputs_tell_the_batch_axis_of_a_language_model():
    """Targets per position leave batch and time ambiguous, but a language model's targets are its
    inputs shifted by one along time: the other axis holds the samples. A GRU run over that axis
    mixes them (WRONG_RESHAPE); the right layout passes; so does a time-major batch, read along its
    second axis. A model that carries its hidden state from call to call (fastbook's stateful
    LMModel3) has it put back before each of the probe's forwards, as when the copy was made; one that
    keeps it where nndx does not put it back (appended to a list) moves every output between two calls
    of one batch: no verdict, never a failure."""
    broken = sample_independence(TokenGRU(over_batch=True), next_tokens())
    assert broken.status == "failed" and broken.batch_axis == 0 and broken.changed_samples > 0, broken.message
    healthy = sample_independence(TokenGRU(), next_tokens())
    assert healthy.status == "passed" and healthy.batch_axis == 0, healthy.message

    class TimeMajor(TokenGRU):
        def forward(self, x):
            return self.head(self.gru(nn.functional.one_hot(x, self.vocab).float())[0])

    time_major = sample_independence(TimeMajor(), next_tokens(time_major=True))
    assert time_major.status == "passed" and time_major.batch_axis == 1, time_major.message
    stateful = sample_independence(TokenGRU(stateful=True), next_tokens())
    assert stateful.status == "passed", stateful.message
    in_place = sample_independence(TokenGRU(over_batch=True, stateful="in_place"), next_tokens())
    assert in_place.status == "skipped" and "state" in in_place.message, in_place.message
    # a tagger's labels are no shifted inputs: still ambiguous
    x, _ = next_tokens()
    assert sample_independence(TokenGRU(over_batch=True), (x, (x * 3) % 5)).status == "skipped"


def test_a_recurrent_layer_run_over_a_language_models_batch_outranks_the_misaligned_targets_it_causes():
    """The GRU over the batch hands the loss time-major outputs against batch-major targets: the
    causality probe reads misaligned targets (NNDX613), which the layout explains."""
    report = nndx.probe(TokenGRU(over_batch=True), next_tokens(), lambda out, y: nn.functional.cross_entropy(
        out.reshape(-1, out.shape[-1]), y.reshape(-1)), probes=["sample_independence", "causality"], progress=False)
    findings = nndx.diagnose(report).findings
    assert [f.rule_id for f in findings][:1] == ["NNDX611"], [(f.rule_id, f.explained_by) for f in findings]


def test_outputs_that_are_not_finite_are_not_compared():
    """d2l's house prices with fillna(0) left out: NaN features make NaN outputs for their samples, and
    NaN equals nothing, so the reversed batch "did not give the outputs reversed" (a SHAPE_BROADCAST
    error beside the real NAN_IN_DATA). Non-finite outputs leave nothing to compare: skipped."""
    x, y = batch()
    x = x.clone()
    x[::3, 0] = float("nan")
    result = sample_independence(mlp(), (x, y))
    assert result.status == "skipped" and "finite" in result.message, result.message
    assert not result.position_dependent


class Translator(nn.Module):
    """A seq2seq model reduced to its encoder: an output per source position."""

    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.gru, self.head = nn.Embedding(12, 8), nn.GRU(8, 16, batch_first=batch_first), nn.Linear(16, 12)

    def forward(self, src):
        return self.head(self.gru(self.embed(src))[0])


def padded_sentences(time_major: bool, pad: int = 1, n: int = 16):
    """Sentences of 3 to 7 tokens, padded to the longest; the targets a word-by-word translation."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 8, (n,), generator=g)
    lengths[0] = 7
    src = torch.full((n, 7), pad)
    for i, length in enumerate(lengths):
        src[i, :length] = torch.randint(2, 12, (int(length),), generator=g)
    trg = torch.where(src == pad, src, (src * 5) % 10 + 2)
    return (src.T.contiguous(), trg.T.contiguous()) if time_major else (src, trg)


def test_padding_at_the_end_of_each_sentence_tells_the_batch_axis_of_a_seq2seq_batch():
    """bentrevett's seq2seq with pad_sequence(batch_first=True) into its time-major LSTM: the targets,
    a translation, are no shift of the inputs, so batch and time were ambiguous and the probe skipped.
    Padding ends every sentence along time: the other axis holds the samples. Fed its axes swapped, the
    recurrence runs over the batch (WRONG_RESHAPE); time-major and batch-first layouts that match pass."""
    broken = sample_independence(Translator(batch_first=False), padded_sentences(time_major=False))
    assert broken.status == "failed" and broken.batch_axis == 0 and broken.changed_samples > 0, broken.message
    time_major = sample_independence(Translator(batch_first=False), padded_sentences(time_major=True))
    assert time_major.status == "passed" and time_major.batch_axis == 1, time_major.message
    batch_first = sample_independence(Translator(batch_first=True), padded_sentences(time_major=False))
    assert batch_first.status == "passed" and batch_first.batch_axis == 0, batch_first.message
    # sorted by length, the padding ends the lines of both axes: no reading, no guess
    src, trg = padded_sentences(time_major=False)
    order = (src != 1).sum(dim=1).argsort(descending=True)
    result = sample_independence(Translator(batch_first=False), (src[order], trg[order]))
    assert result.status == "skipped", result.message


class LastValidStep(nn.Module):
    """A time-major encoder that reads each sample's last valid step through its lengths, a
    (batch,) vector beside the (time, batch) tokens (the PyTorch chatbot tutorial's encoder)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.gru, self.head = nn.Embedding(12, 8), nn.GRU(8, 16), nn.Linear(16, 3)

    def forward(self, tokens, lengths):
        out = self.gru(self.embed(tokens))[0]
        return self.head(out[lengths - 1, torch.arange(tokens.shape[1])])


def test_per_sample_lengths_beside_a_time_major_batch_move_with_their_samples():
    """chatbot's healthy run drew NNDX621 SHAPE_BROADCAST as an error: the probe swapped samples along
    the tokens' second axis and left the (batch,) lengths where they were, so each sample read another's
    length and its output 'depended on its position'. A (batch,) tensor beside a time-major batch is
    edited along its own axis."""
    g = torch.Generator().manual_seed(4)
    tokens, lengths = torch.randint(0, 12, (7, 10), generator=g), torch.randint(2, 8, (10,), generator=g)
    targets = torch.randint(0, 3, (10,), generator=g)
    result = sample_independence(LastValidStep(), ((tokens, lengths), targets))
    assert result.status == "passed" and result.batch_axis == 1, result.message


def _row_images(n=64, seed=0):
    """Smooth 8x4 'images' (each row close to the one above it) and a label each: an RNN reads
    them as sequences of 8 rows, as the PyTorch tutorials read MNIST."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    start = torch.randn(n, 1, 4, generator=g) + labels[:, None, None]
    return start + 0.3 * torch.randn(n, 8, 4, generator=g).cumsum(dim=1), labels


def test_sequences_stitched_by_a_reshape_where_transpose_was_meant_are_caught():
    images, labels = _row_images()
    model = SequenceClassifier(batch_first=False, time_major_input=True)
    stitched = sample_independence(model, (images.reshape(8, -1, 4), labels))  # yunjey/pytorch-tutorial#89
    assert stitched.status == "failed" and stitched.changed_samples == 0
    assert stitched.stitched["batch_as_given"] < 0.8 and stitched.stitched["time_reread"] < 0.8
    right = sample_independence(model, (images.transpose(0, 1), labels))
    assert right.status == "passed" and right.stitched is None
    batch_first = sample_independence(SequenceClassifier(batch_first=True), (images, labels))
    assert batch_first.status == "passed" and batch_first.stitched is None


def test_sorted_batches_overlapping_windows_and_unordered_steps_are_not_read_as_stitched():
    images, labels = _row_images()
    order = labels.argsort()  # an unshuffled loader: neighbouring samples alike for a reason
    model = SequenceClassifier(batch_first=False, time_major_input=True)
    assert sample_independence(model, (images[order].transpose(0, 1), labels[order])).stitched is None
    signal = torch.sin(torch.arange(400) * 0.1)[:, None].repeat(1, 4)
    windows = torch.stack([signal[i:i + 20] for i in range(64)])  # sliding windows in order
    assert sample_independence(model, (windows.transpose(0, 1), labels)).stitched is None
    by_class = torch.randn(64, 8, 4, generator=torch.Generator().manual_seed(1)) + 3 * labels[order][:, None, None]
    assert sample_independence(model, (by_class.transpose(0, 1), labels[order])).stitched is None  # steps unordered
    # fastbook's batches of 3s then 7s, flattened: pixels are no steps, and the batch-first layout is not read
    flat = nn.Sequential(nn.Linear(32, 1), nn.Flatten(0))
    assert sample_independence(flat, (images[order].reshape(64, -1), labels[order].float())).stitched is None
