"""Port of hyqneuron/pytorch-avitm: ProdLDA (AVITM, Srivastava and Sutton 2017), a VAE topic
model: a softplus MLP encoder to a logistic-normal posterior (mean and log-variance each through
a BatchNorm without scale), the Laplace approximation of a Dirichlet prior as a diagonal normal,
dropout on the topic proportions, a decoder softmax(BatchNorm(beta theta)) over the vocabulary,
the loss = reconstruction NLL + KL computed by the model itself, Adam with beta1 0.99.

Source: github.com/hyqneuron/pytorch-avitm, ``pytorch_model.py`` and ``pytorch_run.py`` at commit
d5a052d82fa144b863092b768be6d2b59f5cf087 (no licence stated: no LICENSE file in the repository;
its README says much of it follows akashgit/autoencoding_vi_for_topic_models). Written anew
from the facts of those files; no code copied.

Kept: ``ProdLDA`` = ``en1_fc`` (vocabulary -> en1 units) and ``en2_fc`` each through
``F.softplus``, ``en2_drop`` = ``Dropout(0.2)``, ``mean_fc`` and ``logvar_fc`` (-> topics) each
through a ``BatchNorm1d`` whose scale parameter is removed (``register_parameter('weight',
None)``), ``posterior_var = exp(logvar)``, ``z = mean + sqrt(var) * eps`` with eps drawn fresh
every forward, ``p = softmax(z)`` over the topics, ``p_drop`` = ``Dropout(0.2)``, ``decoder`` =
``Linear(topics, vocabulary)`` whose weight is initialised ``uniform_(0, init_mult)``, then
``decoder_bn`` (``BatchNorm1d`` without scale) and a softmax over the vocabulary; the prior as
constant buffers (mean 0, variance ``variance`` = 0.995, its log); ``forward(input,
compute_loss=True)`` returning ``(recon, loss)``; ``loss``: ``NL = -(input * log(recon +
1e-10)).sum(1)``, the KL of the paper's section 3.3 (``0.5 * ((var / prior_var + diff^2 /
prior_var + prior_logvar - logvar).sum(1) - num_topic)``), their sum averaged over the batch;
``pytorch_run.py``'s options (en1 = en2 = 100 units, batch 200, ``Adam(lr=0.002, betas=(0.99,
0.999))``, ``init_mult`` 1.0, variance 0.995), its ``train()`` (each epoch a fresh
``torch.randperm`` split into batches, ``model.train()``, forward with ``compute_loss=True``,
``zero_grad``, ``backward``, ``step``, the epoch's mean loss printed every 5 epochs, kept as a
record) and ``print_perp`` (``model.eval()``, the whole test set in one forward with
``avg_loss=False``, ``exp(mean(loss / word counts))``); documents with no words dropped when the
counts are built, as ``make_data`` does.
Shrunk: 20 Newsgroups (1,995 words, 11,258 documents) becomes a synthetic corpus drawn from
known topics (a vocabulary of 400 words, 12 topics, each a sparse Dirichlet(0.05) over the
words; each document's proportions from Dirichlet(0.2), its length 40-120 words, its counts
multinomial): 2,000 training and 500 held-out documents, made anew with numpy per seed; 12
topics instead of 50 (the true number); 150 epochs of 10 batches (1,500 steps) instead of 80 epochs
of 56 batches. The top-words printout, the
graph visualisation and CUDA are left out.

Measure only (not in the program): ``print_perp``'s approximate perplexity on the held-out
documents (the model's own posterior sample is drawn under a fixed seed so that the healthy and
buggy runs are compared on the same noise).

nndx, as the author would add it (as the other ports whose model computes its loss): a
preflight ``nndx.probe`` on the first 200 training documents, the batch ``((docs, True), None)``
(the model called with ``compute_loss=True``) and a loss function that returns the model's own
loss (``output[1]``), with the optimizer; ``nndx.Monitor(model, optimizer)`` around the epochs,
each step's loss logged; then ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "prodlda"
SOURCE = Source("hyqneuron/pytorch-avitm", "pytorch_model.py", "d5a052d82fa144b863092b768be6d2b59f5cf087",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

_PERP = Measure("test_perplexity", "held-out perplexity (print_perp) at least 5% above the healthy run's",
                lambda healthy, buggy: not buggy < 1.05 * healthy)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 400-word synthetic corpus, 12 topics, 150 epochs)"),
        Variant(
            "decoder_softmax_over_batch",
            "the decoder's implicit-dimension F.softmax (deprecated, warning) given dim=0 to silence the warning: "
            "the reconstruction is normalised over the documents of the batch instead of over the vocabulary, so "
            "recon is no word distribution and the NLL rewards telling documents apart, not predicting their words",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_RESHAPE),
            ("https://github.com/perone/euclidesdb/issues/2",
             "https://github.com/DeepReinforcementLearning/DeepReinforcementLearningInAction/issues/32",
             "https://github.com/Lackel/DPN/issues/1"),
            _PERP,
        ),
        Variant(
            "perplexity_in_train_mode",
            "print_perp without model.eval(): the held-out perplexity is computed with the dropout on the encoder "
            "and on theta still active and the BatchNorms normalising with the test batch's statistics",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/akashgit/autoencoding_vi_for_topic_models/issues/11",
             "https://github.com/sinhasam/vaal/issues/2",
             "https://github.com/ritheshkumar95/pytorch-vqvae/pull/12"),
            _PERP,
        ),
    )
}

# pytorch_run.py's options (num_topic, num_epoch and the corpus shrunk)
EN1_UNITS, EN2_UNITS, NUM_TOPIC, BATCH_SIZE = 100, 100, 12, 200
LEARNING_RATE, MOMENTUM, NUM_EPOCH, INIT_MULT, VARIANCE = 0.002, 0.99, 150, 1.0, 0.995
VOCAB, N_TRAIN, N_TEST, DOC_LEN = 400, 2000, 500, (40, 121)


# --------------------------------------------------------------------------- the corpus, drawn from known topics


def make_corpus(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bag-of-words count matrices (documents x VOCAB) drawn from NUM_TOPIC sparse topics."""
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(VOCAB, 0.05), size=NUM_TOPIC)  # (K, V)

    def docs(n: int) -> np.ndarray:
        theta = rng.dirichlet(np.full(NUM_TOPIC, 0.2), size=n)
        lengths = rng.integers(*DOC_LEN, size=n)
        word_probs = theta @ topics
        word_probs /= word_probs.sum(1, keepdims=True)
        return np.stack([rng.multinomial(length, p) for length, p in zip(lengths, word_probs)])

    return docs(N_TRAIN), docs(N_TEST)


# --------------------------------------------------------------------------- pytorch_model.py


class NetArch:
    def __init__(self, num_input: int) -> None:
        self.num_input, self.en1_units, self.en2_units = num_input, EN1_UNITS, EN2_UNITS
        self.num_topic, self.init_mult, self.variance = NUM_TOPIC, INIT_MULT, VARIANCE


class ProdLDA(nn.Module):
    def __init__(self, net_arch: NetArch, decoder_softmax_dim: int = 1) -> None:
        super().__init__()
        ac = net_arch
        self.net_arch = net_arch
        self.decoder_softmax_dim = decoder_softmax_dim  # 1 as published (the implicit dim of a 2-D input)
        # encoder
        self.en1_fc = nn.Linear(ac.num_input, ac.en1_units)
        self.en2_fc = nn.Linear(ac.en1_units, ac.en2_units)
        self.en2_drop = nn.Dropout(0.2)
        self.mean_fc = nn.Linear(ac.en2_units, ac.num_topic)
        self.mean_bn = nn.BatchNorm1d(ac.num_topic)
        self.logvar_fc = nn.Linear(ac.en2_units, ac.num_topic)
        self.logvar_bn = nn.BatchNorm1d(ac.num_topic)
        # z
        self.p_drop = nn.Dropout(0.2)
        # decoder
        self.decoder = nn.Linear(ac.num_topic, ac.num_input)
        self.decoder_bn = nn.BatchNorm1d(ac.num_input)
        # prior mean and variance as constant buffers
        prior_mean = torch.zeros(1, ac.num_topic)
        prior_var = torch.full((1, ac.num_topic), ac.variance)
        self.register_buffer("prior_mean", prior_mean)
        self.register_buffer("prior_var", prior_var)
        self.register_buffer("prior_logvar", prior_var.log())
        if ac.init_mult != 0:
            self.decoder.weight.data.uniform_(0, ac.init_mult)
        # remove BN's scale parameters
        self.logvar_bn.register_parameter("weight", None)
        self.mean_bn.register_parameter("weight", None)
        self.decoder_bn.register_parameter("weight", None)

    def forward(self, input: torch.Tensor, compute_loss: bool = False, avg_loss: bool = True):  # noqa: A002
        en1 = F.softplus(self.en1_fc(input))
        en2 = F.softplus(self.en2_fc(en1))
        en2 = self.en2_drop(en2)
        posterior_mean = self.mean_bn(self.mean_fc(en2))
        posterior_logvar = self.logvar_bn(self.logvar_fc(en2))
        posterior_var = posterior_logvar.exp()
        eps = torch.randn_like(posterior_mean)
        z = posterior_mean + posterior_var.sqrt() * eps  # reparameterization
        p = F.softmax(z, dim=1)  # mixture probability (the implicit dim of a 2-D input)
        p = self.p_drop(p)
        recon = F.softmax(self.decoder_bn(self.decoder(p)), dim=self.decoder_softmax_dim)
        if compute_loss:
            return recon, self.loss(input, recon, posterior_mean, posterior_logvar, posterior_var, avg_loss)
        return recon

    def loss(self, input, recon, posterior_mean, posterior_logvar, posterior_var, avg=True):  # noqa: A002
        NL = -(input * (recon + 1e-10).log()).sum(1)  # noqa: N806
        prior_mean = self.prior_mean.expand_as(posterior_mean)
        prior_var = self.prior_var.expand_as(posterior_mean)
        prior_logvar = self.prior_logvar.expand_as(posterior_mean)
        var_division = posterior_var / prior_var
        diff = posterior_mean - prior_mean
        diff_term = diff * diff / prior_var
        logvar_division = prior_logvar - posterior_logvar
        KLD = 0.5 * ((var_division + diff_term + logvar_division).sum(1) - self.net_arch.num_topic)  # noqa: N806
        loss = NL + KLD
        return loss.mean() if avg else loss


# --------------------------------------------------------------------------- pytorch_run.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data_tr, data_te = make_corpus(seed)
    data_tr = data_tr[data_tr.sum(1) != 0]  # make_data: documents with no words dropped
    data_te = data_te[data_te.sum(1) != 0]
    tensor_tr = torch.from_numpy(data_tr).float()
    tensor_te = torch.from_numpy(data_te).float()

    model = ProdLDA(NetArch(tensor_tr.shape[1]), decoder_softmax_dim=0 if variant == "decoder_softmax_over_batch" else 1)
    optimizer = torch.optim.Adam(model.parameters(), LEARNING_RATE, betas=(MOMENTUM, 0.999))

    probe_batch = ((tensor_tr[:BATCH_SIZE], True), None)

    def model_loss(output, _target):
        return output[1]

    nx.preflight(model, probe_batch, model_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    gen = torch.Generator().manual_seed(seed)
    for _epoch in range(NUM_EPOCH):
        all_indices = torch.randperm(tensor_tr.size(0), generator=gen).split(BATCH_SIZE)
        loss_epoch = 0.0
        model.train()
        for batch_indices in all_indices:
            input = tensor_tr[batch_indices]  # noqa: A001
            recon, loss = model(input, compute_loss=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            loss_epoch += loss.item()
        epoch_losses.append(loss_epoch / len(all_indices))  # printed every 5 epochs by the program

    nx.finish(mon, model, probe_batch, model_loss, optimizer=optimizer)

    # print_perp
    if variant != "perplexity_in_train_mode":
        model.eval()
    torch.manual_seed(1234)  # measure only: the same posterior noise for every variant
    with torch.no_grad():
        _recon, loss = model(tensor_te, compute_loss=True, avg_loss=False)
    counts = tensor_te.sum(1)
    avg = (loss / counts).mean().item()
    perplexity = math.exp(avg) if avg < 700 else float("inf")
    return {"test_perplexity": perplexity, "final_epoch_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0]}
