"""Port of timbmg/Sentence-VAE (Bowman et al.'s "Generating Sentences from a Continuous
Space": a GRU encoder to a Gaussian posterior, a GRU decoder started from the sampled ``z``,
token NLL plus an annealed KL term).

Source: github.com/timbmg/Sentence-VAE, ``model.py`` and ``train.py`` (with the data
layout of ``ptb.py``) at commit 4e2c7009ff36677c40d0b252400f68a5ea114078 (no licence file in
the repository). Written anew from the facts of those files; no code copied.

Kept: ``SentenceVAE``: ``nn.Embedding``, ``embedding_dropout`` (``nn.Dropout``), a one-layer
unidirectional ``nn.GRU`` encoder and decoder (``batch_first``), ``hidden2mean``,
``hidden2logv``, ``latent2hidden``, ``outputs2vocab``; ``forward(input_sequence, length)``
sorting the batch by length (descending), ``pack_padded_sequence`` into the encoder, the
last hidden state squeezed, ``std = exp(0.5 * logv)``, ``z = randn * std + mean`` (also in
eval mode, as published), ``latent2hidden(z)`` as the decoder's initial state, word dropout
(each decoder input token but ``<sos>``/``<pad>`` replaced by ``<unk>`` with probability
``word_dropout``, applied whether or not the model is training, as published), embedding
dropout, the packed decoder, ``pad_packed_sequence``, the batch put back in its order,
``log_softmax`` of ``outputs2vocab``; returns ``(logp, mean, logv, z)``. ``ptb.py``'s
layout: input ``<sos> w1 .. wn``, target ``w1 .. wn <eos>``, both padded with ``<pad>`` to
``max_sequence_length``, ``length = n + 1``. ``train.py``: ``kl_anneal_function``
(logistic ``1 / (1 + exp(-k (step - x0)))``, the default, or linear), ``NLLLoss(
ignore_index=pad_idx, reduction="sum")`` over the targets cut to the batch's longest
length, ``KL = -0.5 * sum(1 + logv - mean^2 - exp(logv))``, ``loss = (NLL + KL_weight *
KL) / batch_size``; ``Adam(lr=0.001)``; per epoch a ``train`` split (shuffled,
``model.train()``, ``zero_grad``/``backward``/``step``, ``step += 1``) and a ``valid``
split (unshuffled, ``model.eval()``, no step), the per-split ELBO tracker and its epoch
mean, the valid split's ``z`` collected; ``batch_size`` 32, ``latent_size`` 16,
``embedding_dropout`` 0.5, ``rnn_type`` gru.
Shrunk: sentences from a small generated grammar (a sentence's "topic" picks the nouns,
verbs and adjectives it draws from; 4 to 9 words; 44 words + 4 specials; 1,200 train / 300
valid) instead of the Penn Treebank; ``max_sequence_length`` 11 instead of 60;
``embedding_size`` 32 and ``hidden_size`` 64 instead of 300 and 256; 12 epochs instead of
10; the logistic schedule's ``k`` 0.017 and ``x0`` 230 instead of 0.0025 and 2,500 (456
steps in all, not ~13,000); ``word_dropout`` 0.25 (a command-line option, default 0; the
README's runs use it); no tensorboard, checkpoints or JSON dumps (kept in memory).
Measure only (not in the program): the valid split's last-epoch mean NLL and KL per
sentence as the program's tracker computes them, and the reconstruction token accuracy
(teacher-forced argmax of the decoder from the posterior mean, eval mode, no word
dropout) on the valid sentences, always scored against the true (shifted) targets.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first 32 training
sentences (inputs ``(input, length)``, the model's call; target the padded target) with the
program's loss as a function of ``(logp, mean, logv, z)`` and the target (its KL weight the
current step's), and the optimizer; ``nndx.Monitor(model, optimizer)`` around the epochs,
every train batch's loss logged, each valid batch's loss logged with ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn.utils.rnn as rnn_utils
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sentence_vae"
SOURCE = Source("timbmg/Sentence-VAE", "train.py", "4e2c7009ff36677c40d0b252400f68a5ea114078",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (gru, logistic annealing, word dropout 0.25)"),
        Variant(
            "target_not_shifted",
            "the dataset's target built from the padded input (<sos> w1 .. wn) instead of (w1 .. wn <eos>): each "
            "decoder step is scored on the token it was just fed, so the decoder learns to copy its input",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/KempnerInstitute/KempnerForge/issues/154",
             "https://github.com/huggingface/transformers/issues/2033",
             "https://github.com/huggingface/transformers/issues/3711"),
            Measure("rec_acc", "reconstruction token accuracy on the valid sentences (against the true next "
                    "tokens) at least 0.15 below the healthy run's", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "kl_term_dropped",
            "loss = NLL_loss / batch_size: the KL_weight * KL_loss term computed and printed but left out of the "
            "objective, so the posterior is never pulled to the prior (an auto-encoder, not a VAE)",
            (C.WRONG_LOSS,),
            ("https://github.com/Lightning-Universe/lightning-bolts/issues/328",
             "https://github.com/h3lio5/linguistic-style-transfer-pytorch/issues/2",
             "https://github.com/hpcaitech/Open-Sora/issues/876"),
            Measure("valid_kl", "the valid split's KL per sentence 2x the healthy run's plus 2 nats or more",
                    lambda healthy, buggy: not buggy < 2.0 * healthy + 2.0),
        ),
    )
}

ARGS = {"max_sequence_length": 11, "epochs": 12, "batch_size": 32, "learning_rate": 0.001, "embedding_size": 32,
        "hidden_size": 64, "latent_size": 16, "word_dropout": 0.25, "embedding_dropout": 0.5,
        "anneal_function": "logistic", "k": 0.017, "x0": 230, "print_every": 10}  # fmt: skip
SPECIALS = ["<pad>", "<unk>", "<sos>", "<eos>"]
N_TRAIN, N_VALID, TOPICS = 1200, 300, 4


# --------------------------------------------------------------------------- ptb.py stand-in


def sentences(n: int, rng: np.random.Generator) -> list[list[str]]:
    """DET (ADJ) NOUN VERB DET (ADJ) NOUN (PREP DET NOUN): the topic picks the content words."""
    dets, preps = ["the", "a", "every", "some"], ["in", "near", "with", "under"]
    out = []
    for _ in range(n):
        t = rng.integers(TOPICS)
        nouns = [f"n{t}_{i}" for i in range(4)]
        verbs = [f"v{t}_{i}" for i in range(2)]
        adjs = [f"j{t}_{i}" for i in range(3)]
        words = [rng.choice(dets)]
        if rng.random() < 0.5:
            words.append(rng.choice(adjs))
        words += [rng.choice(nouns), rng.choice(verbs), rng.choice(dets)]
        if rng.random() < 0.5:
            words.append(rng.choice(adjs))
        words.append(rng.choice(nouns))
        if rng.random() < 0.3:
            words += [rng.choice(preps), rng.choice(dets), rng.choice(nouns)]
        out.append([str(w) for w in words])
    return out


class PTB(Dataset):
    """``ptb.py``'s items: input ``<sos> + words``, target ``words + <eos>``, padded, and the length."""

    def __init__(self, lines: list[list[str]], w2i: dict[str, int], max_sequence_length: int,
                 unshifted: bool = False) -> None:  # fmt: skip
        self.w2i, self.unshifted = w2i, unshifted
        self.data = []
        for words in lines:
            inp = ["<sos>"] + words
            inp = inp[:max_sequence_length]
            target = words[: max_sequence_length - 1] + ["<eos>"]
            if self.unshifted:
                target = list(inp)
            length = len(inp)
            inp += ["<pad>"] * (max_sequence_length - length)
            target += ["<pad>"] * (max_sequence_length - length)
            self.data.append({"input": np.asarray([w2i.get(w, w2i["<unk>"]) for w in inp]),
                              "target": np.asarray([w2i.get(w, w2i["<unk>"]) for w in target]),
                              "length": length})  # fmt: skip

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int) -> dict:
        return self.data[idx]


# --------------------------------------------------------------------------- model.py


class SentenceVAE(nn.Module):
    def __init__(self, vocab_size: int, embedding_size: int, hidden_size: int, word_dropout: float,
                 embedding_dropout: float, latent_size: int, sos_idx: int, eos_idx: int, pad_idx: int, unk_idx: int,
                 max_sequence_length: int) -> None:  # fmt: skip
        super().__init__()
        self.max_sequence_length = max_sequence_length
        self.sos_idx, self.eos_idx, self.pad_idx, self.unk_idx = sos_idx, eos_idx, pad_idx, unk_idx
        self.latent_size, self.hidden_size = latent_size, hidden_size
        self.embedding = nn.Embedding(vocab_size, embedding_size)
        self.word_dropout_rate = word_dropout
        self.embedding_dropout = nn.Dropout(p=embedding_dropout)
        self.encoder_rnn = nn.GRU(embedding_size, hidden_size, num_layers=1, batch_first=True)
        self.decoder_rnn = nn.GRU(embedding_size, hidden_size, num_layers=1, batch_first=True)
        self.hidden2mean = nn.Linear(hidden_size, latent_size)
        self.hidden2logv = nn.Linear(hidden_size, latent_size)
        self.latent2hidden = nn.Linear(latent_size, hidden_size)
        self.outputs2vocab = nn.Linear(hidden_size, vocab_size)

    def forward(self, input_sequence: torch.Tensor, length: torch.Tensor, use_mean: bool = False):
        batch_size = input_sequence.size(0)
        sorted_lengths, sorted_idx = torch.sort(length, descending=True)
        input_sequence = input_sequence[sorted_idx]

        # encoder
        input_embedding = self.embedding(input_sequence)
        packed = rnn_utils.pack_padded_sequence(input_embedding, sorted_lengths.tolist(), batch_first=True)
        _, hidden = self.encoder_rnn(packed)
        hidden = hidden.squeeze()

        # reparameterisation
        mean = self.hidden2mean(hidden)
        logv = self.hidden2logv(hidden)
        std = torch.exp(0.5 * logv)
        z = mean if use_mean else torch.randn([batch_size, self.latent_size]) * std + mean

        # decoder
        hidden = self.latent2hidden(z).unsqueeze(0)
        if self.word_dropout_rate > 0 and not use_mean:
            prob = torch.rand(input_sequence.size())
            prob[(input_sequence - self.sos_idx) * (input_sequence - self.pad_idx) == 0] = 1
            decoder_input_sequence = input_sequence.clone()
            decoder_input_sequence[prob < self.word_dropout_rate] = self.unk_idx
            input_embedding = self.embedding(decoder_input_sequence)
        input_embedding = self.embedding_dropout(input_embedding)
        packed = rnn_utils.pack_padded_sequence(input_embedding, sorted_lengths.tolist(), batch_first=True)
        outputs, _ = self.decoder_rnn(packed, hidden)

        padded_outputs = rnn_utils.pad_packed_sequence(outputs, batch_first=True)[0].contiguous()
        _, reversed_idx = torch.sort(sorted_idx)
        padded_outputs = padded_outputs[reversed_idx]
        b, s, _ = padded_outputs.size()
        logp = nn.functional.log_softmax(self.outputs2vocab(padded_outputs.view(-1, padded_outputs.size(2))), dim=-1)
        logp = logp.view(b, s, self.embedding.num_embeddings)
        return logp, mean, logv, z


# --------------------------------------------------------------------------- train.py


def kl_anneal_function(anneal_function: str, step: int, k: float, x0: int) -> float:
    if anneal_function == "logistic":
        return float(1 / (1 + np.exp(-k * (step - x0))))
    return min(1, step / x0)


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    return {"input": torch.as_tensor(np.stack([i["input"] for i in items])),
            "target": torch.as_tensor(np.stack([i["target"] for i in items])),
            "length": torch.as_tensor([i["length"] for i in items])}  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_lines, valid_lines = sentences(N_TRAIN, rng), sentences(N_VALID, rng)
    words = sorted({w for line in train_lines for w in line})
    w2i = {w: i for i, w in enumerate(SPECIALS + words)}
    unshifted = variant == "target_not_shifted"
    datasets = {"train": PTB(train_lines, w2i, args["max_sequence_length"], unshifted),
                "valid": PTB(valid_lines, w2i, args["max_sequence_length"], unshifted)}  # fmt: skip
    pad_idx = w2i["<pad>"]

    model = SentenceVAE(vocab_size=len(w2i), embedding_size=args["embedding_size"], hidden_size=args["hidden_size"],
                        word_dropout=args["word_dropout"], embedding_dropout=args["embedding_dropout"],
                        latent_size=args["latent_size"], sos_idx=w2i["<sos>"], eos_idx=w2i["<eos>"], pad_idx=pad_idx,
                        unk_idx=w2i["<unk>"], max_sequence_length=args["max_sequence_length"])  # fmt: skip

    NLL = torch.nn.NLLLoss(ignore_index=pad_idx, reduction="sum")

    def loss_fn(logp, target, length, mean, logv, anneal_function, step, k, x0):
        target = target[:, : torch.max(length).item()].contiguous().view(-1)
        logp = logp.view(-1, logp.size(2))
        NLL_loss = NLL(logp, target)
        KL_loss = -0.5 * torch.sum(1 + logv - mean.pow(2) - logv.exp())
        KL_weight = kl_anneal_function(anneal_function, step, k, x0)
        return NLL_loss, KL_loss, KL_weight

    def objective(NLL_loss, KL_loss, KL_weight, batch_size):
        if variant == "kl_term_dropped":
            return NLL_loss / batch_size
        return (NLL_loss + KL_weight * KL_loss) / batch_size

    optimizer = torch.optim.Adam(model.parameters(), lr=args["learning_rate"])
    state = {"step": 0}

    def vae_loss(output, target):  # the program's loss on the model's output, for nndx
        logp, mean, logv, _ = output
        length = (target != pad_idx).sum(1)
        nll, kl, w = loss_fn(logp, target, length, mean, logv, args["anneal_function"], state["step"], args["k"],
                             args["x0"])  # fmt: skip
        return objective(nll, kl, w, target.size(0))

    first = collate([datasets["train"][i] for i in range(args["batch_size"])])
    probe_batch = ((first["input"], first["length"]), first["target"])
    nx.preflight(model, probe_batch, vae_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    printed: list[str] = []
    epoch_elbo: dict[str, float] = {}
    last_valid: dict[str, float] = {}
    for epoch in range(args["epochs"]):
        for split in ("train", "valid"):
            data_loader = DataLoader(dataset=datasets[split], batch_size=args["batch_size"],
                                     shuffle=split == "train", collate_fn=collate,
                                     generator=torch.Generator().manual_seed(seed * 1000 + epoch))  # fmt: skip
            tracker = defaultdict(list)
            if split == "train":
                model.train()
            else:
                model.eval()
            for iteration, batch in enumerate(data_loader):
                batch_size = batch["input"].size(0)
                logp, mean, logv, z = model(batch["input"], batch["length"])
                NLL_loss, KL_loss, KL_weight = loss_fn(logp, batch["target"], batch["length"], mean, logv,
                                                       args["anneal_function"], state["step"], args["k"], args["x0"])  # fmt: skip
                loss = objective(NLL_loss, KL_loss, KL_weight, batch_size)
                if split == "train":
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    state["step"] += 1
                    nx.timed(lambda: mon.log(loss))
                else:
                    nx.timed(lambda: mon.log(loss.item(), split="val"))
                tracker["ELBO"].append(loss.item())
                tracker["NLL"].append(NLL_loss.item() / batch_size)
                tracker["KL"].append(KL_loss.item() / batch_size)
                if iteration % args["print_every"] == 0 or iteration + 1 == len(data_loader):
                    printed.append("%s Batch %04d/%i, Loss %9.4f, NLL-Loss %9.4f, KL-Loss %9.4f, KL-Weight %6.3f" % (
                        split.upper(), iteration, len(data_loader) - 1, loss.item(), NLL_loss.item() / batch_size,
                        KL_loss.item() / batch_size, KL_weight))  # fmt: skip
                if split == "valid":
                    tracker["z"].append(z.detach())
            epoch_elbo[split] = float(np.mean(tracker["ELBO"]))
            if split == "valid":
                last_valid = {"nll": float(np.mean(tracker["NLL"])), "kl": float(np.mean(tracker["KL"]))}

    nx.finish(mon, model, probe_batch, vae_loss, optimizer=optimizer)

    # measure only: reconstruction accuracy from the posterior mean
    valid = collate(PTB(valid_lines, w2i, args["max_sequence_length"]).data)  # the true targets
    model.eval()
    with torch.no_grad():
        logp, _, _, _ = model(valid["input"], valid["length"], use_mean=True)
        target = valid["target"][:, : logp.size(1)]
        mask = target != pad_idx
        rec_acc = float(((logp.argmax(-1) == target) & mask).sum() / mask.sum())
    return {"valid_nll": last_valid["nll"], "valid_kl": last_valid["kl"], "valid_elbo": epoch_elbo["valid"],
            "train_elbo": epoch_elbo["train"], "rec_acc": rec_acc}  # fmt: skip
