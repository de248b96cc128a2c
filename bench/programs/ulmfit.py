"""Port of fastai's ULMFiT recipe: an AWD-LSTM language model trained on unlabeled text, its
encoder moved into a concat-pooling classifier fine-tuned with discriminative learning
rates, one-cycle schedules and gradual unfreezing, written out in plain PyTorch.

Source: github.com/fastai/fastai, ``fastai/text/models/awdlstm.py``,
``fastai/text/models/core.py`` and ``fastai/text/learner.py`` (the IMDB/ULMFiT recipe of
the text tutorial) at commit 13bf45874516a78068c671d0f1e0618a888457ed (Apache-2.0,
Copyright fast.ai). Written anew from the facts of those files; no code copied.

Kept: ``AWD_LSTM`` (an ``nn.Embedding`` with ``padding_idx``, init uniform(-0.1, 0.1), under
``EmbeddingDropout``; ``RNNDropout`` (one mask per sequence) on the input and between the
layers; ``n_layers`` single-layer ``nn.LSTM``s, ``batch_first``, the last one back to the
embedding size, each under ``WeightDropout`` of its ``weight_hh_l0``; the hidden state kept
across calls, detached, reset on a new batch size or by ``reset``); ``LinearDecoder`` (tied
to the embedding, ``output_p`` dropout); ``get_language_model``'s and
``get_text_classifier``'s configs (``awd_lstm_lm_config``/``awd_lstm_clas_config``
dropouts times ``drop_mult``); ``SentenceEncoder`` (reset, then the padded batch) and
``masked_concat_pool`` ([last hidden, max pool, mean pool] over the non-pad positions);
``PoolingLinearClassifier`` (two ``LinBnDrop``s: BatchNorm1d, Dropout, bias-free Linear,
ReLU between, ``lin_ftrs`` [50], ``ps`` [output_p, 0.1]); ``RNNRegularizer`` (AR alpha 2 on
the last layer's dropped output, TAR beta 1 on its raw output) for both learners;
``awd_lstm_clas_split``'s five layer groups (embedding; each LSTM; the head);
``fit_one_cycle`` (LR: cosine from lr_max/25 up to lr_max over 25% of the steps, then cosine
down to lr_max/1e5; beta1 cosine 0.8 -> 0.7 -> 0.8) under Adam with decoupled weight decay
0.01 (fastai's ``true_wd``), betas (0.8, 0.99), eps 1e-5; ``slice(lr/2.6**4, lr)`` spread
geometrically over the groups; the tutorial's recipe: the LM (``fit_one_cycle``, then
``save_encoder``), ``load_encoder`` into the classifier, then ``freeze_to(-1)``,
``freeze_to(-2)``, ``freeze_to(-3)``, ``unfreeze()``, one one-cycle fit at each step with
lrs 2e-2, slice(1e-2/2.6**4, 1e-2), slice(5e-3/2.6**4, 5e-3), slice(1e-3/2.6**4, 1e-3);
cross-entropy; the LM batches as fastai's ``LMDataLoader`` (one stream cut into ``bs`` rows,
``seq_len`` windows, targets shifted by one); classifier batches padded at the front
(``pad_first``) with ``pad_idx`` 1 and shuffled each epoch.
Shrunk: the corpus is synthetic (see ``make_corpus``): a 72-word vocabulary whose
neutral words follow a sparse Markov grammar, with a "positive" and a "negative" cluster of
words sprinkled in; the label is which cluster appears more often. 3,000 unlabeled
documents for the LM (no WikiText-103 pretraining), 800 labeled train / 400 val documents
of 12-31 words; ``emb_sz`` 32, ``n_hid`` 64 (400, 1152), 3 layers; ``seq_len`` 20 (72) for
the LM and 32 for the classifier (so one ``SentenceEncoder`` chunk covers a document);
batch 32 (64); LM 3 epochs; the last unfrozen fit 2 epochs as in the tutorial; the LR
finder not run.
Measure only (not in the program): nothing; variants are measured by the classifier's
val accuracy (``learn.validate``'s metric).

nndx, as the author would add it: a preflight ``nndx.probe`` on the classifier's first
training batch (after ``load_encoder``) with the optimizer; ``nndx.Monitor(classifier,
optimizer)`` around the gradual-unfreezing fits with each batch's cross-entropy and
accuracy logged and each epoch's val loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The LM pretraining is left
unwatched (the author's question is the classifier).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ulmfit"
SOURCE = Source("fastai/fastai", "fastai/text/models/core.py", "13bf45874516a78068c671d0f1e0618a888457ed",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the recipe as published (LM, load_encoder, gradual unfreezing with discriminative lrs)"),
        Variant(
            "sorted_texts_unsorted_labels",
            "the training documents are sorted by length for padding-efficient batches (fastai's SortedDL) but "
            "the label list is left in the original order: each document is trained on another one's label",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/fastai/fastai/issues/975", "https://github.com/fastai/fastai/issues/1277",
             "https://github.com/fastai/fastai/issues/2182"),
            Measure("val_accuracy", "final val accuracy at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "eval_mode_forgotten",
            "the classifier's validate() (written out by hand instead of learn.validate) never calls model.eval(): "
            "the AWD-LSTM's embedding, input, hidden and weight dropouts and the head's dropout stay on and its "
            "BatchNorm1d layers use (and update) batch statistics while the val set is scored",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/SeanNaren/deepspeech.pytorch/pull/22", "https://github.com/sinhasam/vaal/issues/2",
             "https://github.com/giotto-ai/giotto-deep/issues/40"),
            Measure("val_loss", "final val loss 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

VOCAB, PAD, N_POS, N_NEG = 72, 1, 8, 8
LM_DOCS, TRAIN_DOCS, VAL_DOCS, MIN_LEN, MAX_LEN = 3000, 800, 400, 12, 30
EMB_SZ, N_HID, N_LAYERS = 32, 64, 3
LM_SEQ_LEN, CLAS_SEQ_LEN, BS, LM_EPOCHS, LM_LR = 20, 32, 32, 3, 1e-2
WD, BETAS, EPS, ALPHA, BETA = 0.01, (0.8, 0.99), 1e-5, 2.0, 1.0
# awd_lstm_lm_config / awd_lstm_clas_config dropouts (drop_mult: the tutorial's 0.3 for the LM, 0.5 clas)
LM_DROPS = {"output_p": 0.1, "hidden_p": 0.15, "input_p": 0.25, "embed_p": 0.02, "weight_p": 0.2}
CLAS_DROPS = {"output_p": 0.4, "hidden_p": 0.3, "input_p": 0.4, "embed_p": 0.05, "weight_p": 0.5}
LM_DROP_MULT, CLAS_DROP_MULT = 0.3, 0.5
# the tutorial's gradual unfreezing: (freeze_to, lr_max of the top group, epochs)
STAGES = ((-1, 2e-2, 1), (-2, 1e-2, 1), (-3, 5e-3, 1), (0, 1e-3, 2))


# --------------------------------------------------------------------------- the corpus


def make_corpus(seed: int):
    """Unlabeled LM documents and labeled (train, val) documents from one hidden grammar.

    Tokens 0 (unk) and 1 (pad) are special; 2..2+N_POS-1 the positive cluster, then N_NEG
    negative words, the rest neutral words chained by a sparse Markov grammar. Each
    document draws a rate of sentiment words and a leaning; a sentiment word comes from
    the cluster it leans to with probability 0.85 and is followed by one of three neutral
    words of its cluster (so a language model learns to tell the clusters apart), else the
    grammar's next neutral word is written. The label is 1 when
    positive words outnumber negative ones (ties are redrawn)."""
    rng = np.random.default_rng(seed + 11)
    pos = np.arange(2, 2 + N_POS)
    neg = np.arange(2 + N_POS, 2 + N_POS + N_NEG)
    neutral = np.arange(2 + N_POS + N_NEG, VOCAB)
    nxt = np.stack([rng.choice(len(neutral), size=3, replace=False) for _ in neutral])
    prob = rng.dirichlet(np.full(3, 0.6), size=len(neutral))
    follow = {True: np.arange(0, 3), False: np.arange(3, 6)}  # neutral words that follow each cluster

    def document() -> tuple[list[int], int]:
        while True:
            length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
            rate, lean = rng.uniform(0.1, 0.25), rng.random() < 0.5  # how opinionated, which way it leans
            state, doc, n_pos, n_neg = int(rng.integers(len(neutral))), [], 0, 0
            while len(doc) < length:  # at most MAX_LEN + 1 words
                if rng.random() < rate:
                    positive = (rng.random() < 0.85) == lean
                    doc.append(int(rng.choice(pos if positive else neg)))
                    n_pos, n_neg = n_pos + positive, n_neg + (not positive)
                    state = int(rng.choice(follow[positive]))  # the word a sentiment word takes after it
                    doc.append(int(neutral[state]))
                else:
                    state = int(nxt[state, rng.choice(3, p=prob[state])])
                    doc.append(int(neutral[state]))
            if n_pos != n_neg:
                return doc, int(n_pos > n_neg)

    lm_docs = [document()[0] for _ in range(LM_DOCS)]
    labeled = [document() for _ in range(TRAIN_DOCS + VAL_DOCS)]
    return lm_docs, labeled[:TRAIN_DOCS], labeled[TRAIN_DOCS:]


def pad_first(docs: list[list[int]], seq_len: int) -> torch.Tensor:
    out = torch.full((len(docs), seq_len), PAD, dtype=torch.long)
    for i, d in enumerate(docs):
        d = d[-seq_len:]
        out[i, seq_len - len(d) :] = torch.tensor(d)
    return out


# --------------------------------------------------------------------------- awdlstm.py


def dropout_mask(x: torch.Tensor, size: tuple[int, ...], p: float) -> torch.Tensor:
    return x.new_empty(*size).bernoulli_(1 - p).div_(1 - p)


class RNNDropout(nn.Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return x * dropout_mask(x.data, (x.size(0), 1, *x.shape[2:]), self.p)


class WeightDropout(nn.Module):
    """Drops ``weight_hh_l0`` (DropConnect) from a raw copy before every forward."""

    def __init__(self, module: nn.LSTM, weight_p: float, layer_names=("weight_hh_l0",)) -> None:
        super().__init__()
        self.module, self.weight_p, self.layer_names = module, weight_p, layer_names
        for name in layer_names:
            w = getattr(self.module, name)
            del self.module._parameters[name]
            self.register_parameter(f"{name}_raw", nn.Parameter(w.data))
            setattr(self.module, name, F.dropout(w.data, p=self.weight_p, training=False))
        self.module.flatten_parameters = lambda *a, **k: None

    def _setweights(self) -> None:
        for name in self.layer_names:
            raw = getattr(self, f"{name}_raw")
            w = F.dropout(raw, p=self.weight_p, training=self.training)
            setattr(self.module, name, w if self.training else w.clone())

    def forward(self, *args):
        self._setweights()
        return self.module(*args)


class EmbeddingDropout(nn.Module):
    """Drops whole rows of the embedding matrix (words), rescaled."""

    def __init__(self, emb: nn.Embedding, embed_p: float) -> None:
        super().__init__()
        self.emb, self.embed_p = emb, embed_p

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        if self.training and self.embed_p != 0:
            mask = dropout_mask(self.emb.weight.data, (self.emb.weight.size(0), 1), self.embed_p)
            masked = self.emb.weight * mask
        else:
            masked = self.emb.weight
        return F.embedding(words, masked, self.emb.padding_idx)


class AWD_LSTM(nn.Module):
    initrange = 0.1

    def __init__(self, vocab_sz: int, emb_sz: int, n_hid: int, n_layers: int, pad_token: int = 1, hidden_p=0.2,
                 input_p=0.6, embed_p=0.1, weight_p=0.5) -> None:  # fmt: skip
        super().__init__()
        self.emb_sz, self.n_hid, self.n_layers, self.bs = emb_sz, n_hid, n_layers, 1
        self.encoder = nn.Embedding(vocab_sz, emb_sz, padding_idx=pad_token)
        self.encoder_dp = EmbeddingDropout(self.encoder, embed_p)
        self.rnns = nn.ModuleList([
            WeightDropout(nn.LSTM(emb_sz if l == 0 else n_hid, emb_sz if l == n_layers - 1 else n_hid, 1,
                                  batch_first=True), weight_p)
            for l in range(n_layers)])  # fmt: skip
        self.encoder.weight.data.uniform_(-self.initrange, self.initrange)
        self.input_dp = RNNDropout(input_p)
        self.hidden_dps = nn.ModuleList([RNNDropout(hidden_p) for _ in range(n_layers)])
        self.reset()

    def forward(self, inp: torch.Tensor, from_embeds: bool = False) -> torch.Tensor:
        bs, sl = inp.shape[:2]
        if bs != self.bs:
            self.bs = bs
            self.reset()
        output = self.input_dp(self.encoder_dp(inp))
        new_hidden = []
        for l, (rnn, hid_dp) in enumerate(zip(self.rnns, self.hidden_dps)):
            output, new_h = rnn(output, self.hidden[l])
            new_hidden.append(new_h)
            if l != self.n_layers - 1:
                output = hid_dp(output)
        self.hidden = [(h.detach(), c.detach()) for h, c in new_hidden]
        return output

    def _one_hidden(self, l: int) -> torch.Tensor:
        nh = self.n_hid if l != self.n_layers - 1 else self.emb_sz
        return self.encoder.weight.new_zeros(1, self.bs, nh)

    def reset(self) -> None:
        self.hidden = [(self._one_hidden(l), self._one_hidden(l)) for l in range(self.n_layers)]


# --------------------------------------------------------------------------- core.py


class LinearDecoder(nn.Module):
    def __init__(self, n_out: int, n_hid: int, output_p: float, tie_encoder: nn.Embedding | None = None) -> None:
        super().__init__()
        self.decoder = nn.Linear(n_hid, n_out)
        self.decoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.zero_()
        self.output_dp = RNNDropout(output_p)
        if tie_encoder is not None:
            self.decoder.weight = tie_encoder.weight

    def forward(self, raw: torch.Tensor):
        dropped = self.output_dp(raw)
        return self.decoder(dropped), raw, dropped


class LanguageModel(nn.Module):
    """``SequentialRNN(AWD_LSTM, LinearDecoder)``."""

    def __init__(self, vocab_sz: int, drops: dict[str, float]) -> None:
        super().__init__()
        self.encoder = AWD_LSTM(vocab_sz, EMB_SZ, N_HID, N_LAYERS, PAD, hidden_p=drops["hidden_p"],
                                input_p=drops["input_p"], embed_p=drops["embed_p"], weight_p=drops["weight_p"])
        self.decoder = LinearDecoder(vocab_sz, EMB_SZ, drops["output_p"], tie_encoder=self.encoder.encoder)

    def reset(self) -> None:
        self.encoder.reset()

    def forward(self, x: torch.Tensor):
        return self.decoder(self.encoder(x))


def masked_concat_pool(output: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    lens = output.shape[1] - mask.long().sum(dim=1)
    avg_pool = output.masked_fill(mask[:, :, None], 0).sum(dim=1) / lens.to(output.dtype)[:, None]
    max_pool = output.masked_fill(mask[:, :, None], -float("inf")).max(dim=1)[0]
    return torch.cat([output[:, -1], max_pool, avg_pool], 1)  # pad_first: the last position is the last word


class LinBnDrop(nn.Sequential):
    def __init__(self, n_in: int, n_out: int, p: float, act: nn.Module | None) -> None:
        layers = [nn.BatchNorm1d(n_in), nn.Dropout(p), nn.Linear(n_in, n_out, bias=False)]
        if act is not None:
            layers.append(act)
        super().__init__(*layers)


class TextClassifier(nn.Module):
    """``SequentialRNN(SentenceEncoder(AWD_LSTM), PoolingLinearClassifier)``; returns the
    logits, the encoder's raw output and its output (for ``RNNRegularizer``)."""

    def __init__(self, vocab_sz: int, n_class: int, drops: dict[str, float]) -> None:
        super().__init__()
        self.encoder = AWD_LSTM(vocab_sz, EMB_SZ, N_HID, N_LAYERS, PAD, hidden_p=drops["hidden_p"],
                                input_p=drops["input_p"], embed_p=drops["embed_p"], weight_p=drops["weight_p"])
        self.head = nn.Sequential(LinBnDrop(3 * EMB_SZ, 50, drops["output_p"], nn.ReLU(inplace=True)),
                                  LinBnDrop(50, n_class, 0.1, None))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.encoder.reset()  # SentenceEncoder: one chunk (documents are shorter than seq_len)
        out = self.encoder(x)
        self.last_out = out
        return self.head(masked_concat_pool(out, x == PAD))

    def layer_groups(self) -> list[list[nn.Parameter]]:
        """``awd_lstm_clas_split``: the embedding; each LSTM; the head."""
        groups = [list(self.encoder.encoder.parameters())]
        groups += [list(rnn.parameters()) for rnn in self.encoder.rnns]
        groups.append(list(self.head.parameters()))
        return groups


# --------------------------------------------------------------------------- learner: one-cycle, freezing


def one_cycle(step: int, total: int, lr_max: float, pct_start: float = 0.25, div: float = 25.0,
              div_final: float = 1e5, moms=(0.8, 0.7, 0.8)) -> tuple[float, float]:  # fmt: skip
    """fastai's ``fit_one_cycle``: (lr multiple of lr_max, beta1) at ``step`` of ``total``."""

    def cos(start: float, end: float, pos: float) -> float:
        return start + (1 + math.cos(math.pi * (1 - pos))) * (end - start) / 2

    warm = pct_start * total
    if step < warm:
        pos = step / warm
        return cos(lr_max / div, lr_max, pos), cos(moms[0], moms[1], pos)
    pos = (step - warm) / max(total - warm, 1)
    return cos(lr_max, lr_max / div_final, pos), cos(moms[1], moms[2], pos)


def lr_slice(lr_max: float, n_groups: int) -> list[float]:
    """``slice(lr_max / 2.6**4, lr_max)`` over the groups (``even_mults``); a plain lr for all."""
    lo = lr_max / 2.6**4
    step = (lr_max / lo) ** (1 / (n_groups - 1))
    return [lo * step**i for i in range(n_groups)]


def freeze_to(groups: list[list[nn.Parameter]], n: int) -> None:
    """Groups before ``n`` frozen, from ``n`` on trainable (``n == 0``: ``unfreeze``)."""
    cut = n % len(groups) if n else 0
    for i, g in enumerate(groups):
        for p in g:
            p.requires_grad_(i >= cut)


def rnn_regularizer(loss: torch.Tensor, raw: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """``RNNRegularizer``: AR on the dropped output, TAR on the raw output's steps."""
    loss = loss + ALPHA * dropped.float().pow(2).mean()
    if raw.size(1) > 1:
        loss = loss + BETA * (raw[:, 1:] - raw[:, :-1]).float().pow(2).mean()
    return loss


# --------------------------------------------------------------------------- the recipe


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    lm_docs, train_docs, val_docs = make_corpus(seed)
    gen = torch.Generator().manual_seed(seed)

    # ---- the language model (language_model_learner(dls_lm, AWD_LSTM, drop_mult=0.3), fit_one_cycle)
    lm_drops = {k: v * LM_DROP_MULT for k, v in LM_DROPS.items()}
    lm = LanguageModel(VOCAB, lm_drops)
    stream = torch.tensor([t for d in lm_docs for t in d], dtype=torch.long)
    n_rows = len(stream) // BS
    rows = stream[: n_rows * BS].view(BS, n_rows)
    lm_opt = torch.optim.AdamW(lm.parameters(), lr=LM_LR, betas=BETAS, eps=EPS, weight_decay=WD)
    n_lm_batches = (n_rows - 1) // LM_SEQ_LEN
    total, step = LM_EPOCHS * n_lm_batches, 0
    lm_losses = []
    for _ in range(LM_EPOCHS):
        lm.train()
        lm.reset()
        for b in range(n_lm_batches):
            lr, mom = one_cycle(step, total, LM_LR)
            for g in lm_opt.param_groups:
                g["lr"], g["betas"] = lr, (mom, BETAS[1])
            x = rows[:, b * LM_SEQ_LEN : (b + 1) * LM_SEQ_LEN]
            y = rows[:, b * LM_SEQ_LEN + 1 : (b + 1) * LM_SEQ_LEN + 1]
            logits, raw, dropped = lm(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            lm_opt.zero_grad()
            rnn_regularizer(loss, raw, dropped).backward()
            lm_opt.step()
            lm_losses.append(loss.item())
            step += 1
    encoder_state = {k: v.clone() for k, v in lm.encoder.state_dict().items()}  # save_encoder

    # ---- the classifier (text_classifier_learner(dls_clas, AWD_LSTM, drop_mult=0.5), load_encoder)
    clas_drops = {k: v * CLAS_DROP_MULT for k, v in CLAS_DROPS.items()}
    model = TextClassifier(VOCAB, 2, clas_drops)
    model.encoder.load_state_dict(encoder_state)
    x_train = pad_first([d for d, _ in train_docs], CLAS_SEQ_LEN)
    y_train = torch.tensor([l for _, l in train_docs])
    x_val = pad_first([d for d, _ in val_docs], CLAS_SEQ_LEN)
    y_val = torch.tensor([l for _, l in val_docs])
    if variant == "sorted_texts_unsorted_labels":  # the texts reordered by length, the labels not
        lengths = (x_train != PAD).sum(1)
        x_train = x_train[torch.argsort(lengths, descending=True, stable=True)]

    groups = model.layer_groups()
    freeze_to(groups, -1)
    optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=STAGES[0][1], betas=BETAS, eps=EPS,
                                  weight_decay=WD)  # fastai's Optimizer: one param group per layer group
    criterion = nn.CrossEntropyLoss()

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return criterion(logits, target)

    first_batch = (x_train[:BS], y_train[:BS])
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=loss_fn)

    def validate() -> tuple[float, float]:
        if variant != "eval_mode_forgotten":
            model.eval()
        with torch.no_grad():
            logits = torch.cat([model(x_val[i : i + BS]) for i in range(0, len(y_val), BS)])
        loss = criterion(logits, y_val).item()
        acc = (logits.argmax(-1) == y_val).float().mean().item()
        mon.log(loss, split="val", accuracy=acc)
        return loss, acc

    n_batches = len(y_train) // BS
    val_loss = val_acc = train_loss = float("nan")
    for n, lr_max, epochs in STAGES:
        freeze_to(groups, n)
        lrs = [lr_max] * len(groups) if n == -1 else lr_slice(lr_max, len(groups))
        total, step = epochs * n_batches, 0
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(y_train), generator=gen)
            losses = []
            for b in range(n_batches):
                idx = order[b * BS : (b + 1) * BS]
                xb, yb = x_train[idx], y_train[idx]
                for g, group_lr in zip(optimizer.param_groups, lrs):
                    lr, mom = one_cycle(step, total, group_lr)
                    g["lr"], g["betas"] = lr, (mom, BETAS[1])
                logits = model(xb)
                loss = mon.loss_fn(logits, yb)
                out = model.last_out
                optimizer.zero_grad()
                rnn_regularizer(loss, out, out).backward()
                optimizer.step()
                acc = (logits.argmax(-1) == yb).float().mean().item()
                mon.log(loss, accuracy=acc)
                losses.append(loss.item())
                step += 1
            train_loss = float(np.mean(losses))
            val_loss, val_acc = validate()

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer)
    return {"val_accuracy": val_acc, "val_loss": val_loss, "train_loss": train_loss,
            "lm_loss": float(np.mean(lm_losses[-20:]))}  # fmt: skip
