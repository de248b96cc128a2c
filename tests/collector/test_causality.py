import math

import pytest
import torch
import torch.nn.functional as F
from _probe_models import assert_untouched, single_thread, snapshot  # noqa: F401
from torch import nn

import nndx
from nndx.collector.probes.causality import causality

VOCAB, BLOCK = 11, 12


class TinyGPT(nn.Module):
    """nanoGPT in miniature: token + position embeddings, one pre-LN block with
    hand-written multi-head attention (a tril mask unless ``causal=False``), a head."""

    def __init__(self, causal: bool = True, dropout: float = 0.0, width: int = 16, heads: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.causal, self.heads = causal, heads
        self.tok, self.pos = nn.Embedding(VOCAB, width), nn.Embedding(BLOCK, width)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, VOCAB)
        self.register_buffer("tril", torch.tril(torch.ones(BLOCK, BLOCK)))

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.heads)
        if self.causal:
            att = att.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, idx):
        h = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1])))
        h = h + self.attention(self.ln1(h))
        h = h + self.drop(self.mlp(self.ln2(h)))
        return self.head(self.ln_f(h))


class LSTMLM(nn.Module):
    """A word-language-model-style LSTM; ``time_major`` takes (time, batch) tokens and
    returns (time, batch, vocab) logits with the hidden state, as the PyTorch example."""

    def __init__(self, bidirectional: bool = False, time_major: bool = False, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 12)
        self.lstm = nn.LSTM(12, 16, batch_first=not time_major, bidirectional=bidirectional)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(32 if bidirectional else 16, VOCAB)

    def forward(self, idx):
        out, hidden = self.lstm(self.drop(self.emb(idx)))
        return self.head(self.drop(out)), hidden


class ConvLM(nn.Module):
    """A 1-D convolutional LM: causal only when padded on the left."""

    def __init__(self, left_padded: bool):
        super().__init__()
        torch.manual_seed(0)
        self.left_padded = left_padded
        self.emb = nn.Embedding(VOCAB, 12)
        self.conv = nn.Conv1d(12, 16, 3, padding=0 if left_padded else 1)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx):
        h = self.emb(idx).transpose(1, 2)
        h = F.pad(h, (2, 0)) if self.left_padded else h
        return self.head(torch.relu(self.conv(h)).transpose(1, 2))


class SequenceClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.lstm, self.head = nn.Embedding(VOCAB, 12), nn.LSTM(12, 16, batch_first=True, bidirectional=True), nn.Linear(32, 3)

    def forward(self, idx):
        return self.head(self.lstm(self.emb(idx))[0].mean(dim=1))


def text(n: int = 6, seed: int = 3) -> torch.Tensor:
    """(n, BLOCK + 1) windows of a token stream that seldom repeats a token."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(1, VOCAB, (n, BLOCK + 1), generator=g)
    return steps.cumsum(dim=1) % VOCAB


def lm_batch(shift: bool = True, time_major: bool = False):
    windows = text()
    x, y = (windows[:, :-1], windows[:, 1:]) if shift else (windows[:, :-1], windows[:, :-1].clone())
    return (x.t(), y.t()) if time_major else (x, y)


def flat_cross_entropy(out, y):
    logits = out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def codes(model, batch, loss_fn=flat_cross_entropy):
    return [f.code.value for f in nndx.diagnose(nndx.probe(model, batch, loss_fn)).findings]


@pytest.mark.slow
def test_causal_transformer_passes_and_is_silent():
    result = causality(TinyGPT(), lm_batch(), flat_cross_entropy)
    assert result.status == "passed" and result.time_axis == 1 and result.next_fraction == 1.0
    assert result.changed_positions == 0 and result.max_change <= result.tolerance
    assert not {"DATA_LEAKAGE", "LABELS_MISALIGNED"} & set(codes(TinyGPT(), lm_batch()))


def test_transformer_without_mask_sees_the_future():
    result = causality(TinyGPT(causal=False), lm_batch(), flat_cross_entropy)
    assert result.status == "failed" and result.future_visible
    assert result.changed_positions == result.cut + 1 and result.max_change > 100 * result.tolerance
    assert codes(TinyGPT(causal=False), lm_batch())[:1] == ["DATA_LEAKAGE"]


class MasksWhenTraining(TinyGPT):
    """d2l's TransformerDecoder: the causal mask is built only when ``self.training``; at prediction the
    decoder runs one token at a time, so a whole sequence in eval mode attends both ways by design."""

    def attention(self, x):
        self.causal = self.training
        return super().attention(x)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_causal_mask_built_only_in_training_is_causal_where_the_loss_trains(dropout):
    result = causality(MasksWhenTraining(dropout=dropout), lm_batch(), flat_cross_entropy)
    assert result.status == "passed" and not result.future_visible, result.message
    assert "training" in result.message
    leak = causality(TinyGPT(causal=False, dropout=dropout), lm_batch(), flat_cross_entropy)
    assert leak.status == "failed" and leak.future_visible


def test_lstm_language_models_unidirectional_passes_bidirectional_leaks():
    assert causality(LSTMLM(), lm_batch(), flat_cross_entropy).status == "passed"
    assert not {"DATA_LEAKAGE", "LABELS_MISALIGNED"} & set(codes(LSTMLM(), lm_batch()))
    leak = causality(LSTMLM(bidirectional=True), lm_batch(), flat_cross_entropy)
    assert leak.status == "failed" and leak.future_visible and leak.changed_positions == leak.cut + 1
    assert codes(LSTMLM(bidirectional=True), lm_batch())[:1] == ["DATA_LEAKAGE"]


def test_convolution_padded_on_both_sides_leaks_one_position():
    assert causality(ConvLM(left_padded=True), lm_batch(), flat_cross_entropy).status == "passed"
    leak = causality(ConvLM(left_padded=False), lm_batch(), flat_cross_entropy)
    assert leak.status == "failed" and leak.changed_positions == 1  # only the cut sees one token ahead


def test_targets_equal_to_inputs_are_unshifted():
    result = causality(TinyGPT(), lm_batch(shift=False), flat_cross_entropy)
    assert result.status == "failed" and result.unshifted and result.copy_fraction == 1.0
    assert result.next_fraction < 0.5
    assert codes(TinyGPT(), lm_batch(shift=False))[:1] == ["LABELS_MISALIGNED"]


def runs(n: int = 6, seed: int = 3) -> torch.Tensor:
    """(n, BLOCK + 1) windows where 60% of the tokens repeat the one before (templated text,
    a padded response's run of end-of-text tokens)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(1, VOCAB, (n, BLOCK + 1), generator=g) * (torch.rand(n, BLOCK + 1, generator=g) > 0.6)
    return steps.cumsum(dim=1) % VOCAB


def test_targets_equal_to_inputs_are_unshifted_in_text_that_repeats_its_tokens():
    """LLMs-from-scratch ch07 with targets = padded[:-1] (not [1:]): on its templated data the next
    token equals the current one at 63% of the positions, the unshifted targets the inputs at
    100%. That is still unshifted; the same text shifted right is still next-token prediction."""
    windows = runs()
    x = windows[:, :-1]
    unshifted = causality(TinyGPT(), (x, x.clone()), flat_cross_entropy)
    assert unshifted.status == "failed" and unshifted.unshifted and unshifted.copy_fraction == 1.0
    assert 0.4 < unshifted.next_fraction < 0.8
    assert causality(TinyGPT(), (x, windows[:, 1:]), flat_cross_entropy).status == "passed"


def test_loss_that_shifts_itself_is_read_right():
    """Hugging Face style: labels = input_ids, the loss drops the last logit and the first label."""

    def shifting_loss(logits, y):
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), y[:, 1:].reshape(-1))

    x = text()[:, :-1]
    result = causality(TinyGPT(), (x, x.clone()), shifting_loss)
    assert result.status == "passed" and result.next_fraction == 1.0 and result.scored_positions == x.numel() - len(x)
    assert causality(TinyGPT(causal=False), (x, x.clone()), shifting_loss).status == "failed"


def test_time_major_batch_is_read_along_time():
    result = causality(LSTMLM(time_major=True), lm_batch(time_major=True), flat_cross_entropy)
    assert result.status == "passed" and result.time_axis == 0 and result.positions == BLOCK
    leak = causality(LSTMLM(bidirectional=True, time_major=True), lm_batch(time_major=True), flat_cross_entropy)
    assert leak.status == "failed" and leak.time_axis == 0 and leak.future_visible
    assert codes(LSTMLM(bidirectional=True, time_major=True), lm_batch(time_major=True))[:1] == ["DATA_LEAKAGE"]


def test_flattened_targets_are_read_in_the_layout_of_their_tokens():
    """PyTorch's language-model examples pass targets.reshape(-1) with a time-major batch."""
    x, y = lm_batch(time_major=True)
    result = causality(LSTMLM(time_major=True), (x, y.reshape(-1)), flat_cross_entropy)
    assert result.status == "passed" and result.time_axis == 0 and result.next_fraction == 1.0
    leak = causality(LSTMLM(bidirectional=True, time_major=True), (x, y.reshape(-1)), flat_cross_entropy)
    assert leak.status == "failed" and leak.future_visible
    unshifted = causality(LSTMLM(time_major=True), (x, x.reshape(-1)), flat_cross_entropy)
    assert unshifted.status == "failed" and unshifted.unshifted
    # a classifier's one label per sequence is no flattened sequence of targets
    assert causality(SequenceClassifier(), (x.t(), torch.zeros(len(x.t()), dtype=torch.long)),
                     F.cross_entropy).status == "skipped"  # fmt: skip


def test_dropout_does_not_look_like_a_leak():
    model = TinyGPT(dropout=0.3).train()
    result = causality(model, lm_batch(), flat_cross_entropy)
    assert result.status == "passed" and model.training
    assert causality(LSTMLM(dropout=0.3), lm_batch(), flat_cross_entropy).status == "passed"
    assert not {"DATA_LEAKAGE", "LABELS_MISALIGNED"} & set(codes(TinyGPT(dropout=0.3), lm_batch()))


def test_sequence_classifier_and_taggers_are_skipped():
    x = text()[:, :-1]
    result = causality(SequenceClassifier(), (x, torch.randint(0, 3, (len(x),))), nn.CrossEntropyLoss())
    assert result.status == "skipped" and "targets of shape" in result.message
    report = nndx.probe(SequenceClassifier(), (x, torch.randint(0, 3, (len(x),))), nn.CrossEntropyLoss())
    assert report.probes.causality.status == "skipped"
    assert not {"DATA_LEAKAGE", "LABELS_MISALIGNED"} & {f.code.value for f in nndx.diagnose(report).findings}
    # a bidirectional tagger: per-token labels that are neither the tokens nor the next ones
    tags = torch.randint(0, VOCAB, x.shape, generator=torch.Generator().manual_seed(9))
    tagged = causality(LSTMLM(bidirectional=True), (x, tags), flat_cross_entropy)
    assert tagged.status == "skipped" and "not next-token" in tagged.message
    floats = causality(TinyGPT(), (x, torch.randn(x.shape)), flat_cross_entropy)
    assert floats.status == "skipped"


def test_ignored_positions_do_not_count():
    x, y = lm_batch()
    y = y.clone()
    y[:, -4:] = -100  # padding
    result = causality(TinyGPT(), (x, y), flat_cross_entropy)
    assert result.status == "passed" and result.scored_positions == (BLOCK - 4) * len(x)


def padded_batch(pad: int = 0):
    """Sequences of varying length (5 to 12 tokens) padded to the longest with ``pad``, as a
    collate function pads a batch of sentences: inputs and next-token targets."""
    windows = text()
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(5, BLOCK + 2, (len(windows),), generator=g)
    windows = torch.where(torch.arange(BLOCK + 1)[None, :] < lengths[:, None], windows, torch.full_like(windows, pad))
    return windows[:, :-1], windows[:, 1:]


@pytest.mark.parametrize("ignored", [False, True])
def test_padding_the_loss_scores_is_named(ignored):
    """Padded targets without ignore_index: the model is trained to predict padding. With
    ignore_index=pad the loss ignores them, and unpadded text or a single end token at the end
    of every sequence is no padding either."""
    x, y = padded_batch()

    def loss(out, target):
        return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1), ignore_index=0 if ignored else -100)

    result = causality(TinyGPT(), (x, y), loss)
    assert result.status == "passed"
    if ignored:
        assert result.scored_padding_fraction is None
    else:
        assert result.padding_id == 0 and result.scored_padding_fraction > 0.1
    report = nndx.DiagnosticReport(probes=nndx.report.Probes(causality=result))
    assert any(f.rule_id == "NNDX616" for f in nndx.diagnose(report).findings) == (not ignored)
    assert causality(TinyGPT(), lm_batch(), flat_cross_entropy).scored_padding_fraction is None
    x, y = lm_batch()
    y = y.clone()
    y[:, -1] = 0  # one end-of-sequence token each: no run
    assert causality(TinyGPT(), (x, y), flat_cross_entropy).scored_padding_fraction is None


def test_user_model_and_rng_untouched():
    model = TinyGPT(dropout=0.2)
    before = snapshot(model)
    state = torch.random.get_rng_state()
    causality(model, lm_batch(), flat_cross_entropy)
    assert_untouched(before, model)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


def test_model_without_per_position_output_is_skipped_and_errors_are_evidence():
    class LastToken(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)

        def forward(self, idx):
            return self.head(self.emb(idx)[:, -1])

    x, y = lm_batch()
    skipped = causality(LastToken(), (x, y), lambda out, t: F.cross_entropy(out, t[:, -1]))
    assert skipped.status == "skipped" and "no entry per input position" in skipped.message

    def broken_loss(out, t):
        raise RuntimeError("boom")

    report = nndx.probe(TinyGPT(), (x, y), broken_loss, probes=["causality"])
    assert report.probes.causality.status == "error" and any(e.source == "causality" for e in report.errors)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_every_dtype_is_judged_against_its_own_rounding(dtype):
    healthy = causality(TinyGPT().to(dtype), lm_batch(), flat_cross_entropy)
    assert healthy.status == "passed", healthy.message
    leak = causality(TinyGPT(causal=False).to(dtype), lm_batch(), flat_cross_entropy)
    assert leak.status == "failed" and leak.max_change > 10 * leak.tolerance


def test_under_autocast_from_probe():
    for causal, status in ((True, "passed"), (False, "failed")):
        report = nndx.probe(TinyGPT(causal=causal), lm_batch(), flat_cross_entropy, amp=torch.bfloat16,
                            probes=["causality"])  # fmt: skip
        assert report.errors == [] and report.probes.causality.status == status, report.probes.causality


def test_dict_batch_with_an_attention_mask_perturbs_the_token_ids():
    class MaskedGPT(TinyGPT):
        def forward(self, attention_mask, input_ids):
            return {"logits": super().forward(input_ids) * attention_mask.unsqueeze(-1)}

    x, y = lm_batch()
    batch = {"attention_mask": torch.ones_like(x), "input_ids": x, "labels": y}
    def loss(out, labels):
        return flat_cross_entropy(out["logits"], labels)

    assert causality(MaskedGPT(), batch, loss).status == "passed"
    assert causality(MaskedGPT(causal=False), batch, loss).status == "failed"


class OwnLossGPT(nn.Module):
    """makemore's shape: forward(idx, targets) returns (logits, loss), so the batch hands
    the model the targets as well as the tokens it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = TinyGPT()

    def forward(self, idx, targets):
        logits = self.gpt(idx)
        return logits, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-1)


def test_targets_handed_to_a_model_that_computes_its_own_loss_are_not_its_tokens():
    x, y = lm_batch()
    y = y.clone()
    y[:, -2:] = -1  # padding after the word ends (ignore_index): more distinct values than the tokens
    result = causality(OwnLossGPT(), ((x, y), y), lambda output, _targets: output[1])
    assert result.status == "passed" and not result.unshifted and result.next_fraction == 1.0


class LossOnlyGPT(nn.Module):
    """RWKV-v4's shape: forward(idx, targets) returns only the loss, computed from the
    flattened logits with F.cross_entropy (through a custom autograd function of its own)."""

    def __init__(self, causal: bool = True) -> None:
        super().__init__()
        self.gpt = TinyGPT(causal=causal)

    def forward(self, idx, targets):
        logits = self.gpt(idx)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1)) * 1.0


@pytest.mark.parametrize("causal", [True, False])
def test_a_model_that_returns_only_its_loss_is_read_where_it_calls_the_loss(causal):
    x, y = (t.contiguous() for t in lm_batch())
    result = causality(LossOnlyGPT(causal), ((x, y), y), lambda loss, _targets: loss)
    assert result.status == ("passed" if causal else "failed") and result.next_fraction == 1.0
    assert result.future_visible is (not causal)


class ZeroBranchLM(nn.Module):
    """RWKV's and ReZero's shape: a residual branch whose output projection starts at zero, so
    at initialisation every output reads only its own token. The branch's convolution is
    padded on the left only, or on both sides (it reads the next token once trained)."""

    def __init__(self, left_padded: bool) -> None:
        super().__init__()
        self.conv_lm = ConvLM(left_padded)
        self.out = nn.Linear(16, 12)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, idx):
        lm = self.conv_lm
        h = lm.emb(idx)
        c = h.transpose(1, 2)
        c = lm.conv(F.pad(c, (2, 0)) if lm.left_padded else c).transpose(1, 2)
        return (h + self.out(torch.relu(c))) @ lm.emb.weight.T  # tied embeddings read the logits


@pytest.mark.parametrize("left_padded", [True, False])
def test_a_branch_that_starts_at_zero_is_judged_by_what_it_will_read(left_padded):
    result = causality(ZeroBranchLM(left_padded), lm_batch(), flat_cross_entropy)
    assert result.status == ("passed" if left_padded else "failed"), result.message
    assert result.future_visible is (not left_padded)


class TwoHeadBERT(nn.Module):
    """BERT-pytorch's shape: (next-sentence log-probs per sample, masked-LM log-probs per
    token); a bidirectional encoder, as a masked language model is meant to be."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB + 1, 12)
        self.lstm = nn.LSTM(12, 16, batch_first=True, bidirectional=True)
        self.nsp, self.mlm = nn.Linear(32, 2), nn.Linear(32, VOCAB + 1)

    def forward(self, idx):
        h = self.lstm(self.emb(idx))[0]
        return F.log_softmax(self.nsp(h[:, 0]), dim=-1), F.log_softmax(self.mlm(h), dim=-1)


def bert_loss(output, targets):
    nsp_out, mlm_out = output
    is_next, mlm_labels = targets
    return F.nll_loss(nsp_out, is_next) + F.nll_loss(mlm_out.transpose(1, 2), mlm_labels, ignore_index=0)


@pytest.mark.parametrize("masked", [True, False])
def test_a_masked_language_model_shown_its_targets_is_caught_among_several_outputs(masked):
    """BERT-pytorch's bug report: the masked tokens left in the input. The loss's per-token
    targets are the second of two targets, the per-token output the second of two outputs."""
    mask_id = VOCAB
    tokens = text()[:, :-1] % (VOCAB - 1) + 1  # ids 1..VOCAB-1: 0 is the ignored label
    chosen = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(1)) < 0.3
    labels = torch.where(chosen, tokens, torch.zeros_like(tokens))
    inputs = torch.where(chosen, torch.full_like(tokens, mask_id), tokens) if masked else tokens
    is_next = torch.randint(0, 2, (len(tokens),), generator=torch.Generator().manual_seed(2))
    result = causality(TwoHeadBERT(), (inputs, (is_next, labels)), bert_loss)
    assert result.scored_positions == int(chosen.sum())
    if masked:
        assert result.status == "skipped" and result.copy_fraction < 0.5 and "not next-token" in result.message
    else:
        assert result.status == "failed" and result.unshifted and result.copy_fraction == 1.0
        assert codes(TwoHeadBERT(), (inputs, (is_next, labels)), bert_loss)[:1] == ["LABELS_MISALIGNED"]


def test_labels_shifted_twice_for_a_model_that_shifts_them_itself_are_misaligned():
    """run_clm's bug: labels = input_ids[1:] handed to a model whose loss shifts them again."""

    def shifting_loss(logits, y):
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), y[:, 1:].reshape(-1))

    windows = text()
    x, pre_shifted = windows[:, :-1], windows[:, 1:]
    result = causality(TinyGPT(), (x, pre_shifted), shifting_loss)
    assert result.status == "failed" and result.target_offset == 2 and not result.unshifted
    assert result.next_fraction < 0.5 and result.time_axis == 1
    assert codes(TinyGPT(), (x, pre_shifted), shifting_loss)[:1] == ["LABELS_MISALIGNED"]
    # shifted once, by either side: right, and nothing about offsets
    assert causality(TinyGPT(), (x, x.clone()), shifting_loss).target_offset is None
    assert causality(TinyGPT(), lm_batch(), flat_cross_entropy).target_offset is None


class TeacherForcedSeq2Seq(nn.Module):
    """bentrevett's pytorch-seq2seq shape: time-major ``forward(src, trg, ratio)``; the
    decoder reads ``trg[t - 1]`` (or, with probability ``1 - ratio``, its own argmax, drawn
    from Python's ``random``) to give ``outputs[t]``; ``outputs[0]`` stays zero."""

    def __init__(self, mix: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.src_emb, self.trg_emb = nn.Embedding(VOCAB, 12), nn.Embedding(VOCAB, 12)
        self.encoder, self.decoder = nn.GRU(12, 16), nn.GRUCell(12, 16)
        self.head, self.mix = nn.Linear(16, VOCAB), mix

    def forward(self, src, trg, ratio):
        import random

        hidden = self.encoder(self.src_emb(src))[1][0]
        outputs = torch.zeros(trg.shape[0], trg.shape[1], VOCAB)
        token = trg[0]
        for t in range(1, trg.shape[0]):
            hidden = self.decoder(self.trg_emb(token), hidden)
            if self.mix:  # attention's softmax taken over the batch, as in pytorch-seq2seq's reported bug
                hidden = hidden * hidden.softmax(dim=0)
            outputs[t] = self.head(hidden)
            token = trg[t] if random.random() < ratio else outputs[t].argmax(1)
        return outputs


def seq2seq_loss(output, trg):
    return F.cross_entropy(output[1:].reshape(-1, VOCAB), trg[1:].reshape(-1))


def seq2seq_loss_off_by_one(output, trg):  # pytorch-seq2seq's reported bug: output[:-1] against trg[1:]
    return F.cross_entropy(output[:-1].reshape(-1, VOCAB), trg[1:].reshape(-1))


@pytest.mark.parametrize("same_tensor", [True, False])
def test_a_decoder_fed_its_targets_is_read_by_what_each_position_reads(same_tensor):
    """A teacher-forced decoder is handed the target tensor and shifts it itself: output t
    reads trg[t - 1] and must predict trg[t]. Paired with the loss by position, its targets
    look unshifted; what each position reads says they are right, and that the off-by-one
    loss asks for trg[t + 1], two ahead of what it reads."""
    windows = text(n=8).t()  # (time, batch)
    src, trg = windows.flip(0), windows
    batch = ((src, trg if same_tensor else trg.clone(), 0.5), trg)
    healthy = causality(TeacherForcedSeq2Seq(), batch, seq2seq_loss)
    assert healthy.status == "passed" and healthy.input_shift == 1 and healthy.time_axis == 0
    assert healthy.copy_fraction < 0.5 and not healthy.unshifted and healthy.target_offset is None
    broken = causality(TeacherForcedSeq2Seq(), batch, seq2seq_loss_off_by_one)
    assert broken.status == "failed" and broken.target_offset == 2 and broken.input_shift == 1
    assert codes(TeacherForcedSeq2Seq(), batch, seq2seq_loss_off_by_one)[:1] == ["LABELS_MISALIGNED"]
    # samples that mix leave no telling what each position reads: never "unshifted" then
    assert causality(TeacherForcedSeq2Seq(mix=True), batch, seq2seq_loss).status != "failed"


class InputShiftingLM(nn.Module):
    """PixelCNN/WaveNet-style: the model shifts its input right by one itself (a start
    token in front), so ``targets = inputs`` is right for it."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = LSTMLM()

    def forward(self, idx):
        return self.lm(torch.cat([torch.zeros_like(idx[:, :1]), idx[:, :-1]], dim=1))


def test_a_model_that_shifts_its_inputs_itself_is_not_unshifted():
    x = text()[:, :-1]
    result = causality(InputShiftingLM(), (x, x.clone()), flat_cross_entropy)
    assert result.status == "passed" and result.input_shift == 1 and not result.unshifted
    # the same targets for a model that does not shift: unshifted, as before
    unshifted = causality(LSTMLM(), (x, x.clone()), flat_cross_entropy)
    assert unshifted.status == "failed" and unshifted.unshifted and unshifted.input_shift == 0


class PerTokenLossLM(nn.Module):
    """Transformer-XL's shape: ``forward(data, target)`` on time-major tokens returns
    ``[per-token loss (time, batch)]``, no logits; its mask sees one token too far when
    ``causal=False``."""

    def __init__(self, causal: bool = True, dead: bool = False) -> None:
        super().__init__()
        self.gpt, self.dead = TinyGPT(causal=causal), dead

    def forward(self, data, target):
        logits = self.gpt(data.t()).transpose(0, 1)  # (time, batch, vocab)
        if self.dead:  # an LR far too high left one prediction for every input
            logits = self.gpt.head.bias.expand_as(logits)
        return [-F.log_softmax(logits, dim=-1).gather(2, target[..., None]).squeeze(2)]


def test_a_model_that_returns_its_per_token_loss_is_read_from_its_targets():
    x, y = lm_batch(time_major=True)
    healthy = causality(PerTokenLossLM(), ((x, y), y), lambda output, _target: output[0].mean())
    assert healthy.status == "passed" and healthy.time_axis == 0 and healthy.next_fraction == 1.0
    leaky = causality(PerTokenLossLM(causal=False), ((x, y), y), lambda output, _target: output[0].mean())
    assert leaky.status == "failed" and leaky.future_visible and leaky.changed_positions > 0
    # its loss reads the targets, not the tokens: they are never taken for what the model reads
    dead = causality(PerTokenLossLM(dead=True), ((x, y), y), lambda output, _target: output[0].mean())
    assert dead.status == "skipped" and "depend" in dead.message


class MaskedLinear(nn.Linear):
    def __init__(self, n_in: int, n_out: int, mask: torch.Tensor) -> None:
        super().__init__(n_in, n_out)
        self.register_buffer("mask", mask.float())

    def forward(self, x):
        return F.linear(x, self.weight * self.mask, self.bias)


class Made(nn.Module):
    """karpathy/pytorch-made: connectivity numbers from a random order of the inputs; hidden
    unit k reads input d when m(d) <= m(k), output d reads hidden unit k when m(k) < m(d) —
    ``<=`` there (``strict=False``) hands each output its own input."""

    def __init__(self, dims: int = 16, hidden: int = 48, strict: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        order = torch.randperm(dims, generator=g)
        m_hidden = torch.randint(int(order.min()), dims - 1, (hidden,), generator=g)
        below = m_hidden[:, None] >= order[None, :]
        above = (order[:, None] > m_hidden[None, :]) if strict else (order[:, None] >= m_hidden[None, :])
        torch.manual_seed(0)
        self.net = nn.Sequential(MaskedLinear(dims, hidden, below), nn.ReLU(), MaskedLinear(hidden, dims, above))

    def forward(self, x):
        return self.net(x)


class PixelCNN(nn.Module):
    """jzbontar/pixelcnn-pytorch in miniature: masked convolutions, type A first (the centre
    pixel hidden), type B after; ``first="B"`` shows each pixel itself. 4 intensity classes."""

    def __init__(self, first: str = "A", levels: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.convs = nn.ModuleList([nn.Conv2d(1, 8, 5, padding=2), nn.Conv2d(8, 8, 3, padding=1)])
        self.out = nn.Conv2d(8, levels, 1)
        for conv, kind in zip(self.convs, (first, "B")):
            mask = torch.ones_like(conv.weight)
            k = conv.weight.shape[-1]
            mask[:, :, k // 2, k // 2 + (kind == "B"):] = 0
            mask[:, :, k // 2 + 1:] = 0
            conv.register_buffer("mask", mask)

    def forward(self, x):
        for conv in self.convs:
            x = F.relu(F.conv2d(x, conv.weight * conv.mask, conv.bias, padding=conv.padding))
        return self.out(x)


def binary_digits(n: int = 32, dims: int = 16):
    g = torch.Generator().manual_seed(0)
    return (torch.rand(n, dims, generator=g) > 0.5).float()


@pytest.mark.parametrize("strict", [True, False])
def test_a_made_whose_outputs_see_their_own_input_leaks(strict):
    x = binary_digits()
    result = causality(Made(strict=strict), (x, x), nn.BCEWithLogitsLoss())
    assert result.autoregressive and result.status == ("passed" if strict else "failed"), result.message
    assert (result.changed_positions > 0) != strict


@pytest.mark.parametrize("first", ["A", "B"])
def test_a_pixelcnn_with_a_first_mask_of_type_b_sees_each_pixel(first):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 4, (16, 1, 8, 8), generator=g).float() / 3
    targets = (images[:, 0] * 3).long()
    result = causality(PixelCNN(first), (images, targets), nn.CrossEntropyLoss())
    assert result.autoregressive and result.status == ("passed" if first == "A" else "failed"), result.message


def test_autoencoders_and_next_step_regressors_are_no_autoregressive_density_models():
    x = binary_digits()
    autoencoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 16))
    assert causality(autoencoder, (x, x), nn.BCEWithLogitsLoss()).status == "skipped"
    # a causal next-step regressor reads its own position to predict the next value: targets are no coding of it
    t = torch.linspace(0, 6, 17)
    series = torch.stack([torch.sin(t + phase) for phase in torch.linspace(0, 3, 32)])
    rnn = nn.GRU(1, 8, batch_first=True)

    class NextStep(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = rnn, nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    result = causality(NextStep(), (series[:, :-1, None], series[:, 1:, None]), nn.MSELoss())
    assert result.status == "skipped" and not result.autoregressive


class Forecaster(nn.Module):
    """Informer's call in miniature: model(history, decoder_input), the decoder input the last
    ``label`` known values followed by the horizon; a GRU over it, the horizon's outputs out."""

    def __init__(self, horizon: int = 6):
        super().__init__()
        torch.manual_seed(0)
        self.horizon = horizon
        self.encoder, self.decoder = nn.GRU(2, 8, batch_first=True), nn.GRU(2, 8, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, history, decoder_input):
        _, h = self.encoder(history)
        return self.head(self.decoder(decoder_input, h)[0])[:, -self.horizon :]


def series(n: int = 16, length: int = 30):
    t = torch.linspace(0, 6, length)
    phases = torch.linspace(0, 3, n)[:, None]
    return torch.stack([torch.sin(t + phases), torch.cos(0.5 * t + phases)], dim=2)


@pytest.mark.parametrize("handed", [False, True])
def test_a_forecaster_handed_its_horizon_in_the_decoder_input_sees_what_it_must_predict(handed):
    y = series()
    history, window, horizon = y[:, :18], y[:, 12:], y[:, -6:]
    decoder_input = window if handed else torch.cat([window[:, :12], torch.zeros_like(horizon)], dim=1)
    result = causality(Forecaster(), ((history, decoder_input), horizon), nn.MSELoss())
    if handed:
        assert result.status == "failed" and result.future_visible and result.target_input == 1, result.message
    else:
        assert result.status == "skipped", result.message


def test_a_causal_model_handed_the_whole_series_reads_only_the_values_before_each_target():
    y = series()

    class NextStep(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.rnn, self.head = nn.GRU(2, 8, batch_first=True), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0])[:, :-1]

    result = causality(NextStep(), (y, y[:, 1:]), nn.MSELoss())
    assert result.status == "passed" and result.target_start == 1, result.message


class FramePredictor(nn.Module):
    """A next-frame predictor in miniature (a ConvLSTM's shape): (N, T, 1, H, W) frames, a
    convolution within each frame, a GRU over time at each pixel, a 1x1 head per frame."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.rnn, self.head = nn.Conv2d(1, 4, 3, padding=1), nn.GRU(4, 4, batch_first=True), nn.Linear(4, 1)

    def forward(self, frames):
        n, t, _, h, w = frames.shape
        feats = self.conv(frames.reshape(n * t, 1, h, w)).reshape(n, t, 4, h * w).permute(0, 3, 1, 2)
        out = self.head(self.rnn(feats.reshape(n * h * w, t, 4))[0])  # (n * pixels, t, 1)
        return out.reshape(n, h * w, t).permute(0, 2, 1).reshape(n, t, 1, h, w)


@pytest.mark.parametrize("shifted", [True, False])
def test_a_next_frame_predictor_trained_to_reproduce_the_frame_it_sees_is_caught(shifted):
    g = torch.Generator().manual_seed(0)
    frames = torch.rand(8, 7, 1, 6, 6, generator=g)
    inputs, targets = (frames[:, :-1], frames[:, 1:]) if shifted else (frames[:, :-1], frames[:, :-1])
    result = causality(FramePredictor(), (inputs, targets), nn.MSELoss())
    if shifted:
        assert result.status == "skipped", result.message
    else:
        assert result.status == "failed" and result.unshifted and result.positions == 6, result.message
        found = {f.rule_id: f for f in nndx.diagnose(nndx.DiagnosticReport(probes=nndx.report.Probes(
            causality=result))).findings}  # fmt: skip
        assert found["NNDX613"].code.value == "LABELS_MISALIGNED" and "NNDX614" not in found


class SineRNN(nn.Module):
    """Udacity's simple RNN forecaster: one value per step, the steps flattened into rows
    (``r_out.view(-1, hidden)``, which only a batch of one allows, or ``reshape``) before the head."""

    def __init__(self, view: bool):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head, self.view = nn.RNN(1, 8, batch_first=True), nn.Linear(8, 1), view

    def forward(self, x, hidden):
        out, hidden = self.rnn(x, hidden)
        return self.head(out.view(-1, 8) if self.view else out.reshape(-1, 8)), hidden


class GRUForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head = nn.GRU(1, 8, batch_first=True), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("layout", ["batch", "rows", "one_sequence"])
@pytest.mark.parametrize("shifted", [True, False])
def test_a_forecaster_over_one_value_per_step_trained_on_the_steps_it_sees_is_caught(layout, shifted):
    """An RNN reads its current step by design: targets equal to its inputs are targets not
    shifted (LABELS_MISALIGNED), not a mask that lets a position see itself (DATA_LEAKAGE),
    whether the steps come as (N, T, 1), flattened into (N * T, 1) rows, or as one sequence."""
    t = torch.linspace(0, 6, 17)
    series = torch.stack([torch.sin(t + phase) for phase in torch.linspace(0, 3, 8)])[:, :, None]
    x, y = series[:, :-1], (series[:, 1:] if shifted else series[:, :-1]).clone()
    if layout == "batch":
        batch, model = (x, y), GRUForecaster()
    else:
        x, y = (x[:1], y[:1]) if layout == "one_sequence" else (x, y)
        batch, model = ((x, None), y.reshape(-1, 1)), SineRNN(view=layout == "one_sequence")
    result = causality(model, batch, nn.MSELoss())
    if shifted:
        assert result.status == "skipped", result.message
        return
    assert result.status == "failed" and result.unshifted and result.positions == 16, result.message
    found = {f.rule_id: f for f in nndx.diagnose(nndx.DiagnosticReport(probes=nndx.report.Probes(
        causality=result))).findings}  # fmt: skip
    assert found["NNDX613"].code.value == "LABELS_MISALIGNED" and "NNDX614" not in found


def test_a_vq_autoencoder_whose_code_flips_read_sparsely_is_no_autoregressive_model():
    """zalandoresearch's VQ-VAE at initialisation (a codebook within +-1/32): changing one
    pixel flips a few nearest codes, so the outputs read the inputs sparsely, almost never both
    ways, and two of 256 outputs move with their own pixel. That is no order and no mask."""
    from bench.programs import vqvae

    torch.manual_seed(0)
    x = vqvae.images(vqvae.digits.digit_images(seed=0)[0][:32]) - 0.5
    model = vqvae.Model(16, 2, 8, 32, 8, 0.25)
    result = causality(model, (x, x.clone()), lambda out, target: F.mse_loss(out[1], target) + out[0])
    assert result.status == "skipped" and not result.future_visible, result.message


class ContextMLP(nn.Module):
    """makemore's MLP over a window of the last characters: one next character per sample."""

    def __init__(self, vocab=27, block=3, reads_last=True):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(vocab, 8), nn.Linear(8 * block, vocab)
        self.reads_last = reads_last

    def forward(self, idx):
        e = self.emb(idx)
        if not self.reads_last:
            e = torch.cat([e[:, :-1], torch.zeros_like(e[:, -1:])], dim=1)
        return self.head(e.flatten(1))


def context_windows(shifted_before_append, n=64, block=3):
    """makemore's build_dataset: for each character, append (context, ch), then slide the window;
    the bug slides first, so the context ends with the character it must predict."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(1, 27, (n + block,), generator=g).tolist()
    xs, ys, context = [], [], [0] * block
    for ch in text[:n]:
        if shifted_before_append:
            context = context[1:] + [ch]
        xs.append(list(context))
        ys.append(ch)
        if not shifted_before_append:
            context = context[1:] + [ch]
    return torch.tensor(xs), torch.tensor(ys)


def test_a_context_window_that_ends_with_its_own_target_is_caught():
    """One target per sample, and in every sample it is the window's last input token: the model is
    handed its answer (the loss falls to ~0). The window built right, or a model that does not read
    that position, is no finding."""
    report = nndx.probe(ContextMLP(), context_windows(True), nn.CrossEntropyLoss(), probes=["causality"],
                        progress=False)  # fmt: skip
    result = report.probes.causality
    assert result.status == "failed" and result.target_position == 2 and result.copy_fraction == 1.0, result.message
    assert [f.rule_id for f in nndx.diagnose(report).findings][:1] == ["NNDX613"]
    assert causality(ContextMLP(), context_windows(False), nn.CrossEntropyLoss()).status == "skipped"
    assert causality(ContextMLP(reads_last=False), context_windows(True), nn.CrossEntropyLoss()).status == "skipped"


class ScratchRNN(nn.Module):
    """d2l's RNN from scratch (rnn-scratch.md): one-hot of X.T, a tanh loop over time, and the
    outputs stacked time-major; ``batch_major`` is d2l's fix (the targets are flattened as Y.T)."""

    def __init__(self, vocab=12, hidden=16, stacked=False):
        super().__init__()
        torch.manual_seed(0)
        self.stacked = stacked  # the book's own code: (time, batch, vocab), reshaped by the loss
        self.W_xh, self.W_hh = nn.Parameter(torch.randn(vocab, hidden) * 0.1), nn.Parameter(torch.randn(hidden, hidden) * 0.1)
        self.head = nn.Linear(hidden, vocab)
        self.vocab = vocab

    def forward(self, X):
        h = torch.zeros(X.shape[0], self.W_hh.shape[0])
        outs = []
        for x in F.one_hot(X.T, self.vocab).float():
            h = torch.tanh(x @ self.W_xh + h @ self.W_hh)
            outs.append(self.head(h))
        return torch.stack(outs, dim=0) if self.stacked else torch.cat(outs, dim=0)  # time-major


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("transposed", [True, False])
def test_targets_that_are_the_next_tokens_paired_with_other_positions_by_the_loss_are_misaligned(transposed, stacked):
    """The batch says next-token prediction (Y is X shifted by one); the loss flattens the targets
    batch-major against time-major outputs (d2l's first edition without Y.T), so each output is
    scored against another position's token. Flattened the same way, it is a healthy language model."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 12, (16 * 9,), generator=g).view(16, 9)
    X, Y = text[:, :-1], text[:, 1:]

    def loss(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), (y.T if transposed else y).reshape(-1))

    report = nndx.probe(ScratchRNN(stacked=stacked), (X, Y), loss, probes=["causality"], progress=False)
    result = report.probes.causality
    codes = [f.code.value for f in nndx.diagnose(report).findings if f.severity != "info"]
    if transposed:
        assert result.status == "passed", result.message
        assert "LABELS_MISALIGNED" not in codes
    else:
        assert result.status == "failed" and result.batch_next_fraction == 1.0, result.message
        assert codes[:1] == ["LABELS_MISALIGNED"]


def test_a_loss_that_pushes_away_from_the_next_tokens_is_no_misalignment():
    """A sign-flipped cross-entropy (or MSE on class ids) on a healthy language model: the loss's gradient
    names no next token, but every output is paired with its own position's target, so nothing is
    misaligned (the benchmark's loss_sign_flipped and mse_on_class_index on char_lm)."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 12, (16 * 9,), generator=g).view(16, 9)
    result = causality(ScratchRNN(), (text[:, :-1], text[:, 1:]), lambda out, y: -F.cross_entropy(out, y.T.reshape(-1)))
    assert not result.batch_next_fraction, result.message


class FlatRNNLM(nn.Module):
    """yunjey's language model: a batch-first LSTM whose outputs are flattened to (batch * time, V)
    for ``criterion(outputs, targets.reshape(-1))``, with its states passed in and returned."""

    def __init__(self, vocab=12, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.lstm = nn.Embedding(vocab, hidden), nn.LSTM(hidden, hidden, batch_first=True)
        self.linear = nn.Linear(hidden, vocab)

    def forward(self, x, states):
        out, states = self.lstm(self.embed(x), states)
        return self.linear(out.reshape(out.size(0) * out.size(1), out.size(2))), states


@pytest.mark.parametrize("shift", [0, 1])
def test_batch_major_rows_with_unshifted_targets_are_read_in_their_own_layout(shift):
    """Rows flattened batch-major are tried time-major too (d2l stacks its steps), and the layout
    that reads the targets better is kept. With unshifted targets neither layout makes them the
    next tokens, so "better" must count the copied token as well: read by the next-token share
    alone, a layout that pairs the rows at random won by chance and the copy went unseen."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 12, (6, 21), generator=g)
    states = (torch.zeros(1, 6, 16), torch.zeros(1, 6, 16))
    batch = ((ids[:, :20], states), ids[:, shift : shift + 20])
    result = causality(FlatRNNLM(), batch, lambda out, y: F.cross_entropy(out[0], y.reshape(-1)))
    if shift:
        assert result.status == "passed" and result.next_fraction == 1.0, result.message
    else:
        assert result.status == "failed" and result.unshifted and result.copy_fraction == 1.0, result.message


class StatefulRNNLM(nn.Module):
    """fastbook's LMModel3/4: the hidden state kept on ``self`` across calls (``self.h = 0``, a tensor
    from the first forward on, detached after each), so the next batch continues where this one left."""

    def __init__(self, vocab=12, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        self.i_h, self.h_h, self.h_o = nn.Embedding(vocab, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, vocab)
        self.h = 0

    def forward(self, x):
        outs = []
        for i in range(x.shape[1]):
            self.h = torch.relu(self.h_h(self.h + self.i_h(x[:, i])))
            outs.append(self.h_o(self.h))
        self.h = self.h.detach()
        return torch.stack(outs, dim=1)


@pytest.mark.parametrize("shift", [0, 1])
def test_a_state_the_model_carries_from_call_to_call_is_put_back_before_each_probe_forward(shift):
    """Carried over, the state from the probe's previous forward moved every output between two
    forwards of one batch: the healthy model read as pairing outputs with other samples' targets
    (an error), and its unshifted targets went unseen. The state starts as ``0``, not a tensor."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 12, (8, 17), generator=g)
    model = StatefulRNNLM()
    result = causality(model, (ids[:, :16], ids[:, shift : shift + 16]), flat_cross_entropy)
    if shift:
        assert result.status == "passed" and not result.batch_next_fraction, result.message
    else:
        assert result.status == "failed" and result.unshifted, result.message
    assert model.h == 0  # the user's model untouched


def markov_corpus(length: int = 2400, seed: int = 0) -> torch.Tensor:
    """A token stream with structure along it: each token is followed by one of two successors."""
    g = torch.Generator().manual_seed(seed)
    tokens, choices = [0], torch.randint(0, 2, (length,), generator=g)
    for pick in choices[1:].tolist():
        v = tokens[-1]
        tokens.append((3 * v + 1) % VOCAB if pick else (5 * v + 2) % VOCAB)
    return torch.tensor(tokens)


@pytest.mark.parametrize("time_major", [False, True])
def test_text_that_runs_across_the_batch_instead_of_along_each_sequence_is_a_reshape(time_major):
    """yunjey's get_data as ids.view(-1, batch_size).t() for ids.view(batch_size, -1) (and the PyTorch
    example's batchify without its .t()): each row holds every batch_size-th token, and the text runs
    down the batch. The targets are still the next inputs along time, so nothing else looks wrong;
    adjacent tokens tell each other far more across the batch than along time."""
    corpus, bsz, steps = markov_corpus(), 20, 30
    right = corpus.view(bsz, -1)  # (batch, time): each row a stretch of the text
    wrong = corpus.view(-1, bsz).t()  # each row every 20th token
    outcomes = {}
    for name, ids in (("right", right), ("wrong", wrong)):
        x, y = ids[:, :steps], ids[:, 1 : steps + 1]
        batch = (x.t().contiguous(), y.t().contiguous()) if time_major else (x, y)
        outcomes[name] = causality(LSTMLM(time_major=time_major), batch, flat_cross_entropy)
    assert outcomes["right"].status == "passed" and not outcomes["right"].text_across_batch, outcomes["right"].message
    broken = outcomes["wrong"]
    assert broken.status == "failed" and broken.text_across_batch, broken.message
    assert broken.batch_information > 3 * max(broken.time_information, 0.0)
    # random text (no structure along either axis) says nothing
    assert not causality(LSTMLM(), lm_batch(), flat_cross_entropy).text_across_batch


def test_sequences_on_one_template_tell_their_position_across_the_batch_which_is_no_text():
    """mamba_minimal's copying task: a start token, 4 random tokens, a separator, the same 4 again. Adjacent
    samples share the start and the separator at their positions, so across the batch tokens tell each other
    their position; another sample at the same position tells as much. Its healthy run drew NNDX622 as an
    error before the baseline paired each token with another sample's at the same position."""
    g = torch.Generator().manual_seed(5)
    content = torch.randint(2, 10, (32, 4), generator=g)
    start, sep = torch.zeros(32, 1, dtype=torch.long), torch.ones(32, 1, dtype=torch.long)
    tokens = torch.cat([start, content, sep, content], dim=1)
    result = causality(LSTMLM(), (tokens[:, :-1], tokens[:, 1:]), flat_cross_entropy)
    assert not result.text_across_batch, result.message


def test_text_across_the_batch_is_named_wrong_reshape():
    corpus = markov_corpus().view(-1, 20).t()
    report = nndx.probe(LSTMLM(), (corpus[:, :30], corpus[:, 1:31]), flat_cross_entropy, probes=["causality"],
                        progress=False)  # fmt: skip
    findings = nndx.diagnose(report).findings
    assert [(f.rule_id, f.code.value, f.severity) for f in findings][:1] == [("NNDX622", "WRONG_RESHAPE", "error")]


def test_the_information_between_adjacent_tokens_counts_only_the_pairs_seen():
    """A BPE vocabulary: 60,000 distinct ids in one batch. A (vocabulary x vocabulary) table of
    counts would take 29 GB; the pairs seen are 40,000."""
    from nndx.collector.probes.causality import _adjacent_information

    tokens = torch.randperm(60_000).view(3, 20_000)
    along, across = _adjacent_information(tokens, time_axis=1)
    assert abs(along) < 0.1 and abs(across) < 0.1  # all-distinct ids: no pair says more than chance does
