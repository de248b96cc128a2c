"""Port of salesforce/awd-lstm-lm: the AWD-LSTM language model (weight-dropped LSTM, NT-ASGD).

Source: github.com/salesforce/awd-lstm-lm, ``main.py``, ``model.py``, ``weight_drop.py``,
``embed_regularize.py``, ``locked_dropout.py``, ``utils.py`` and ``splitcross.py`` at commit
1d466ec5875675ca6b6f0caacbb741240a29da9e (BSD-3-Clause, Copyright (c) 2017 Salesforce).
Written anew from the facts of those files; no code copied.

Kept: ``RNNModel`` (``--model LSTM``, ``tied``): ``nn.Embedding`` read through
``embedded_dropout`` (whole rows of the embedding dropped with ``dropoute``, rescaled by
``1/(1-p)``), ``LockedDropout`` (one mask per sequence, shared over time) on the input
(``dropouti``), between layers (``dropouth``) and on the output (``dropout``); ``nlayers``
single-layer ``nn.LSTM``s, the last one ``emsize`` wide so the decoder can be tied to the
encoder; each wrapped in ``WeightDrop`` (``weight_hh_l0`` deleted from the LSTM's
parameters, kept as ``weight_hh_l0_raw``, and set back each forward as
``F.dropout(raw, wdrop, training)``; ``flatten_parameters`` replaced by a no-op); uniform
(-0.1, 0.1) init of encoder/decoder, decoder bias 0; ``forward(..., return_h=True)`` giving
the raw and the dropped per-layer outputs. One change current PyTorch needs: in eval mode
``F.dropout`` returns ``raw`` itself, a Parameter, which ``nn.LSTM`` then registers and
the next training forward fails on (issue #79); the eval weight is ``raw.clone()`` (fastai's
form). ``SplitCrossEntropyLoss`` with no splits (the
vocabulary is under 75,000): log-softmax of ``linear(hidden, decoder.weight,
decoder.bias)``, mean NLL. ``main.py``'s ``train()``: per batch a random BPTT length
(``bptt`` with p 0.95 else ``bptt/2``, then ``max(5, int(N(bptt, 5)))``), the learning
rate scaled by ``seq_len/bptt`` for that step and restored after, ``model.train()``,
``repackage_hidden``, ``zero_grad``, ``raw_loss`` plus activation regularisation
(``alpha * dropped_h[-1].pow(2).mean()``) plus temporal activation regularisation (``beta *
(h[-1][1:] - h[-1][:-1]).pow(2).mean()``), ``clip_grad_norm_(params, clip)``, ``step``.
The epoch loop: SGD(lr, weight_decay=wdecay); when ``'t0'`` is in the param group (ASGD),
evaluation with the averaged weights ``optimizer.state[p]['ax']`` swapped in and back;
otherwise plain evaluation, and the NT-ASGD switch to ``ASGD(model.parameters(), lr, t0=0,
lambd=0., weight_decay=wdecay)`` when the validation loss is worse than the best before the
last ``nonmono`` epochs; the best model saved on validation, reloaded for the test
(``test_batch_size`` 1). Defaults kept: lr 30, clip 0.25, dropout 0.4/0.3/0.65/0.1, wdrop
0.5, alpha 2, beta 1, wdecay 1.2e-6, eval batch 10, test batch 1.
Shrunk: a 48-word synthetic Markov-chain corpus (6,000 train / 1,200 valid / 1,200 test
tokens) instead of Penn Treebank; emsize 32 and nhid 64 instead of 400 and 1150; 2 layers
instead of 3 (a 3-layer stack this narrow stays on the unigram plateau, loss 3.6, for the
whole shrunk run); batch 20 instead of 80, bptt 20 instead of 70; 12 epochs instead of 8000 and ``nonmono`` 2 instead
of 5 (so the NT-ASGD switch can happen within the run); the saved model kept in memory, not
``torch.save``; the eval loop's swap of the averaged weights skips parameters that have no
``'ax'`` (the guard users added, issue #86; no effect on the healthy run).
Measure only (not in the program): the test loss against correctly shifted targets, and
the relative change of the weight-dropped ``weight_hh_l0_raw`` matrices from their init.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training chunk
(the loss: the split criterion on the model's tied decoder); ``nndx.Monitor(model,
optimizer)`` around the loop with each batch's ``raw_loss`` (what the script prints)
logged and each validation loss logged as ``split="val"``; the optimizer is replaced at the
NT-ASGD switch, so that Monitor is closed and diagnosed there and a new one attached to the
ASGD optimizer; after training ``nndx.probe(..., monitor=mon)`` on the first chunk.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "awd_lstm"
SOURCE = Source("salesforce/awd-lstm-lm", "main.py", "1d466ec5875675ca6b6f0caacbb741240a29da9e", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (LSTM, SGD then NT-ASGD)"),
        Variant(
            "targets_not_shifted",
            "get_batch returns target = source[i:i+seq_len] instead of source[i+1:i+1+seq_len]: each position "
            "is trained (and validated) to predict the token it is given",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/songlab-cal/tape/issues/32",
             "https://github.com/huggingface/transformers/issues/3711",
             "https://github.com/flairNLP/flair/issues/44"),
            Measure("true_test_loss", "test loss against the correctly shifted next tokens at least 0.5 nats above "
                    "the healthy run's", lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "weight_drop_detached",
            "WeightDrop sets the dropped matrix back as nn.Parameter(F.dropout(raw)) (the common fix for 'cannot "
            "assign torch.FloatTensor as parameter weight_hh_l0'): a fresh leaf each forward, so the "
            "weight_hh_l0_raw matrices never receive a gradient and stay at their init",
            (C.DETACHED_GRAPH,),
            ("https://github.com/fastai/fastai2/pull/427", "https://github.com/fastai/fastai/issues/2591",
             "https://github.com/salesforce/awd-lstm-lm/issues/86"),
            Measure("hh_raw_change", "relative change of the weight_hh_l0_raw matrices from init under a tenth of "
                    "the healthy run's", lambda healthy, buggy: buggy < 0.1 * healthy),
        ),
    )
}

EMSIZE, NHID, NLAYERS = 32, 64, 2
LR, CLIP, EPOCHS, BATCH_SIZE, BPTT = 30.0, 0.25, 12, 20, 20
DROPOUT, DROPOUTH, DROPOUTI, DROPOUTE, WDROP = 0.4, 0.3, 0.65, 0.1, 0.5
ALPHA, BETA, WDECAY, NONMONO = 2.0, 1.0, 1.2e-6, 2
EVAL_BATCH_SIZE, TEST_BATCH_SIZE = 10, 1
TRAIN_TOKENS, VALID_TOKENS, TEST_TOKENS = 6000, 1200, 1200


# --------------------------------------------------------------------------- weight_drop.py


class WeightDrop(nn.Module):
    def __init__(self, module: nn.Module, weights: list[str], dropout: float = 0.0, as_parameter: bool = False) -> None:
        super().__init__()
        self.module, self.weights, self.dropout = module, weights, dropout
        self.as_parameter = as_parameter  # the bug: re-wrap the dropped weight in a new Parameter
        if isinstance(self.module, nn.RNNBase):
            self.module.flatten_parameters = self._no_flatten
        for name_w in self.weights:
            w = getattr(self.module, name_w)
            del self.module._parameters[name_w]
            self.module.register_parameter(name_w + "_raw", nn.Parameter(w.data))

    @staticmethod
    def _no_flatten(*args, **kwargs) -> None:
        return None

    def _setweights(self) -> None:
        for name_w in self.weights:
            raw_w = getattr(self.module, name_w + "_raw")
            w = F.dropout(raw_w, p=self.dropout, training=self.training)
            if not self.training:  # F.dropout returns the Parameter itself in eval (issue #79): fastai's clone()
                w = w.clone()
            setattr(self.module, name_w, nn.Parameter(w) if self.as_parameter else w)

    def forward(self, *args):
        self._setweights()
        return self.module.forward(*args)


# --------------------------------------------------------------------------- embed_regularize.py, locked_dropout.py


def embedded_dropout(embed: nn.Embedding, words: torch.Tensor, dropout: float = 0.1) -> torch.Tensor:
    if dropout:
        mask = embed.weight.new_empty((embed.weight.size(0), 1)).bernoulli_(1 - dropout).expand_as(embed.weight) / (1 - dropout)
        weight = mask * embed.weight
    else:
        weight = embed.weight
    padding_idx = -1 if embed.padding_idx is None else embed.padding_idx
    return F.embedding(words, weight, padding_idx, embed.max_norm, embed.norm_type, embed.scale_grad_by_freq, embed.sparse)


class LockedDropout(nn.Module):
    def forward(self, x: torch.Tensor, dropout: float = 0.5) -> torch.Tensor:
        if not self.training or not dropout:
            return x
        mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - dropout) / (1 - dropout)
        return mask.expand_as(x) * x


# --------------------------------------------------------------------------- model.py


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout=0.5, dropouth=0.5, dropouti=0.5,
                 dropoute=0.1, wdrop=0.0, tie_weights=False, weight_as_parameter=False) -> None:  # fmt: skip
        super().__init__()
        self.lockdrop = LockedDropout()
        self.encoder = nn.Embedding(ntoken, ninp)
        rnns = [nn.LSTM(ninp if l == 0 else nhid, nhid if l != nlayers - 1 else (ninp if tie_weights else nhid), 1, dropout=0)
                for l in range(nlayers)]  # fmt: skip
        if wdrop:
            rnns = [WeightDrop(rnn, ["weight_hh_l0"], dropout=wdrop, as_parameter=weight_as_parameter) for rnn in rnns]
        self.rnns = nn.ModuleList(rnns)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.ninp, self.nhid, self.nlayers, self.tie_weights = ninp, nhid, nlayers, tie_weights
        self.dropout, self.dropouti, self.dropouth, self.dropoute = dropout, dropouti, dropouth, dropoute

    def init_weights(self) -> None:
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.fill_(0)
        self.decoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, input: torch.Tensor, hidden, return_h: bool = False):
        emb = embedded_dropout(self.encoder, input, dropout=self.dropoute if self.training else 0)
        raw_output = self.lockdrop(emb, self.dropouti)
        new_hidden, raw_outputs, outputs = [], [], []
        for l, rnn in enumerate(self.rnns):
            raw_output, new_h = rnn(raw_output, hidden[l])
            new_hidden.append(new_h)
            raw_outputs.append(raw_output)
            if l != self.nlayers - 1:
                raw_output = self.lockdrop(raw_output, self.dropouth)
                outputs.append(raw_output)
        output = self.lockdrop(raw_output, self.dropout)
        outputs.append(output)
        result = output.view(output.size(0) * output.size(1), output.size(2))
        if return_h:
            return result, new_hidden, raw_outputs, outputs
        return result, new_hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters()).data
        sizes = [self.nhid if l != self.nlayers - 1 else (self.ninp if self.tie_weights else self.nhid) for l in range(self.nlayers)]
        return [(weight.new_zeros(1, bsz, s), weight.new_zeros(1, bsz, s)) for s in sizes]


# --------------------------------------------------------------------------- splitcross.py (no splits), utils.py


class SplitCrossEntropyLoss(nn.Module):
    """With ``splits == []`` (vocabularies under 75,000 words) the head is the whole
    vocabulary: a full softmax over ``linear(hiddens, weight, bias)``, mean NLL."""

    def forward(self, weight: torch.Tensor, bias: torch.Tensor, hiddens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logprob = F.log_softmax(F.linear(hiddens, weight, bias=bias), dim=-1)
        return -logprob.gather(1, targets.view(-1, 1)).squeeze(1).mean()


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def batchify(tokens: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = tokens.size(0) // bsz
    return tokens.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, seq_len: int | None = None, shift: int = 1):
    seq_len = min(seq_len if seq_len else BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + shift : i + shift + seq_len].reshape(-1)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(1111 + seed)
    torch.manual_seed(1111 + seed)
    corpus = data.word_tokens(TRAIN_TOKENS + VALID_TOKENS + TEST_TOKENS, seed=seed)
    ntokens = int(corpus.max()) + 1
    train_data = batchify(corpus[:TRAIN_TOKENS], BATCH_SIZE)
    val_data = batchify(corpus[TRAIN_TOKENS : TRAIN_TOKENS + VALID_TOKENS], EVAL_BATCH_SIZE)
    test_data = batchify(corpus[TRAIN_TOKENS + VALID_TOKENS :], TEST_BATCH_SIZE)
    shift = 0 if variant == "targets_not_shifted" else 1

    model = RNNModel(ntokens, EMSIZE, NHID, NLAYERS, DROPOUT, DROPOUTH, DROPOUTI, DROPOUTE, WDROP, tie_weights=True,
                     weight_as_parameter=variant == "weight_drop_detached")  # fmt: skip
    criterion = SplitCrossEntropyLoss()
    params = list(model.parameters()) + list(criterion.parameters())
    raw_init = [rnn.module.weight_hh_l0_raw.detach().clone() for rnn in model.rnns]

    def loss_fn(output, targets: torch.Tensor) -> torch.Tensor:
        return criterion(model.decoder.weight, model.decoder.bias, output[0], targets)

    first, first_targets = get_batch(train_data, 0, shift=shift)
    probe_batch = ((first, model.init_hidden(BATCH_SIZE)), first_targets)

    def evaluate(data_source: torch.Tensor, batch_size: int = 10, eval_shift: int = shift) -> float:
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(batch_size)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, BPTT):
                x, targets = get_batch(data_source, i, shift=eval_shift)
                output, hidden = model(x, hidden)
                total_loss += len(x) * criterion(model.decoder.weight, model.decoder.bias, output, targets).item()
                hidden = repackage_hidden(hidden)
        return total_loss / len(data_source)

    optimizer = torch.optim.SGD(params, lr=LR, weight_decay=WDECAY)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    def train_epoch() -> list[float]:
        losses = []
        hidden = model.init_hidden(BATCH_SIZE)
        i = 0
        while i < train_data.size(0) - 1 - 1:
            bptt = BPTT if np.random.random() < 0.95 else BPTT / 2.0
            seq_len = max(5, int(np.random.normal(bptt, 5)))
            lr2 = optimizer.param_groups[0]["lr"]
            optimizer.param_groups[0]["lr"] = lr2 * seq_len / BPTT
            model.train()
            x, targets = get_batch(train_data, i, seq_len=seq_len, shift=shift)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden, rnn_hs, dropped_rnn_hs = model(x, hidden, return_h=True)
            raw_loss = criterion(model.decoder.weight, model.decoder.bias, output, targets)
            loss = raw_loss
            if ALPHA:
                loss = loss + sum(ALPHA * h.pow(2).mean() for h in dropped_rnn_hs[-1:])
            if BETA:
                loss = loss + sum(BETA * (h[1:] - h[:-1]).pow(2).mean() for h in rnn_hs[-1:])
            loss.backward()
            if CLIP:
                torch.nn.utils.clip_grad_norm_(params, CLIP)
            optimizer.step()
            mon.log(raw_loss)
            losses.append(raw_loss.item())
            optimizer.param_groups[0]["lr"] = lr2
            i += seq_len
        return losses

    best_val_loss: list[float] = []
    stored_loss, saved = 1e8, None
    switched_at, train_losses, val_loss = 0.0, [], float("nan")
    for epoch in range(1, EPOCHS + 1):
        train_losses += train_epoch()
        if "t0" in optimizer.param_groups[0]:
            tmp = {}
            for prm in model.parameters():
                if "ax" in optimizer.state.get(prm, {}):
                    tmp[prm] = prm.data.clone()
                    prm.data = optimizer.state[prm]["ax"].clone()
            val_loss = evaluate(val_data, EVAL_BATCH_SIZE)
            if val_loss < stored_loss:
                saved, stored_loss = copy.deepcopy(model.state_dict()), val_loss
            for prm, value in tmp.items():
                prm.data = value.clone()
        else:
            val_loss = evaluate(val_data, EVAL_BATCH_SIZE)
            if val_loss < stored_loss:
                saved, stored_loss = copy.deepcopy(model.state_dict()), val_loss
            if len(best_val_loss) > NONMONO and val_loss > min(best_val_loss[:-NONMONO]):
                nx.finish(mon)  # the SGD phase's Monitor
                optimizer = torch.optim.ASGD(model.parameters(), lr=LR, t0=0, lambd=0.0, weight_decay=WDECAY)
                mon = nx.monitor(model, optimizer, every=5)
                switched_at = float(epoch)
            best_val_loss.append(val_loss)
        mon.log(val_loss, split="val")

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    if saved is not None:
        model.load_state_dict(saved, strict=False)
    test_loss = evaluate(test_data, TEST_BATCH_SIZE)
    true_test_loss = evaluate(test_data, TEST_BATCH_SIZE, eval_shift=1)  # measure only
    hh_change = float(np.mean([((rnn.module.weight_hh_l0_raw.detach() - w0).norm() / w0.norm()).item()
                               for rnn, w0 in zip(model.rnns, raw_init)]))  # fmt: skip
    return {
        "val_loss": val_loss,
        "test_loss": test_loss,
        "true_test_loss": true_test_loss,
        "final_train_loss": float(np.mean(train_losses[-10:])),
        "hh_raw_change": hh_change,
        "asgd_switch_epoch": switched_at,
    }
