"""Port of uvipen/Hierarchical-attention-networks-pytorch: Yang et al.'s Hierarchical
Attention Network for document classification.

Source: github.com/uvipen/Hierarchical-attention-networks-pytorch, ``train.py``,
``src/hierarchical_att_model.py``, ``src/word_att_model.py``, ``src/sent_att_model.py``,
``src/utils.py`` and ``src/dataset.py`` at commit b1ea9e0b7bc294364f213e42507a6fe9d502a044
(no licence file in the repository). Written anew from the facts of those files; no code
copied.

Kept: ``WordAttNet``: a frozen lookup table (``nn.Embedding.from_pretrained`` of the
word vectors with a zero row 0 for unknown / padding words, every index shifted by one),
``nn.GRU(embed, hidden, bidirectional=True)`` over ``(words, batch)``, ``word_weight``
(2H x 2H), ``word_bias`` (1 x 2H) and ``context_weight`` (2H x 1) parameters, the two
weights drawn from N(0, 0.05); ``matrix_mul`` (a ``torch.mm`` per time step, the bias
added, ``tanh``, stacked and ``squeeze``d: the tanh is applied to the context scores too),
the scores permuted to ``(batch, words)`` and ``F.softmax`` over the words (the implicit
dim of a 2-d input), ``element_wise_mul`` (each step's output times its weight, summed
over the steps) giving a ``(1, batch, 2H)`` sentence vector, and the GRU's last hidden
state returned. ``SentAttNet``: the same over the sentence vectors with a
``nn.GRU(2H_word, H_sent, bidirectional=True)``, then ``fc`` Linear to the classes.
``HierAttNet``: the document ``(batch, sentences, words)`` permuted to sentences first,
each sentence ``(words, batch)`` through ``WordAttNet`` with the word hidden state carried
from one sentence to the next, the sentence vectors concatenated and passed to
``SentAttNet``; ``_init_hidden_state(batch)`` zeroes both hidden states (called before
every training batch and with the batch's size before every test batch). ``train``:
``torch.manual_seed(123)``, ``DataLoader(batch_size, shuffle=True, drop_last=True)`` for
training and ``shuffle=False, drop_last=False`` for test, ``nn.CrossEntropyLoss``,
``SGD(lr=0.1, momentum=0.9)`` over the parameters that require grad, per batch
``zero_grad``, ``_init_hidden_state``, forward, loss, ``backward``, ``step`` and the batch
accuracy; after every epoch (``test_interval`` 1) the test loss (each batch's mean loss
times its size, summed, divided by the set size) and accuracy, the model kept when the
test loss improves (``torch.save``: here a copy in memory), early stopping after
``es_patience`` 5 epochs without improvement. ``MyDataset``: documents padded / cut to
``max_length_sentences`` x ``max_length_word`` with -1, then +1, as int64.
Shrunk: a generated 4-class corpus instead of a csv + NLTK tokenising + GloVe (see
``corpus``: each document has 3-5 sentences of 4-7 filler words, one or two of them
carrying one of the 5 key words of the document's class; the "pretrained" vectors are
random 16-d vectors, N(0, 1), for the 220 words); 640 training and 256 test documents;
the padded shape 5 x 8 (the source takes the 80th percentile lengths; here the maxima);
word and sentence hidden sizes 16 instead of 50; batch 32 instead of 128; 15 epochs
instead of 100; no tensorboard, no log file.
``word_bias``/``sent_bias`` are ``torch.Tensor`` left uninitialised in the source (and so
whatever memory held): zero here.
Measure only (not in the program): the last epoch's test accuracy, and the best.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(after ``_init_hidden_state()``) with ``nn.CrossEntropyLoss()`` and the optimizer;
``nndx.Monitor(model, optimizer, loss_fn=criterion)`` around the epochs, the loss called
as ``mon.loss_fn``, each batch's loss logged with its accuracy and each test evaluation
logged as ``split="val"`` with its accuracy; after training (hidden state re-initialised
for the batch size) ``nndx.probe(..., monitor=mon)`` on the first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "han"
SOURCE = Source("uvipen/Hierarchical-attention-networks-pytorch", "train.py",
                "b1ea9e0b7bc294364f213e42507a6fe9d502a044",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: hidden 16, batch 32, 5 x 8 documents, 15 epochs)"),
        Variant(
            "word_attention_softmax_over_batch",
            "WordAttNet's attention softmax taken over dim 0 of the (batch, words) scores: each word's weight is "
            "normalised across the documents of the batch instead of across the sentence's words",
            (C.WRONG_RESHAPE,),
            ("https://github.com/pandeykartikey/Hierarchical-Attention-Network/issues/5",
             "https://github.com/PetrochukM/PyTorch-NLP/issues/2",
             "https://github.com/DEEP-PolyU/KEQA_WSDM19/issues/2",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52"),
            Measure("test_acc", "last test accuracy at least 0.1 below the healthy run's: 0.32 against 0.80 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the batch loop: every step applies the sum of all gradients so far, "
            "on top of SGD's momentum 0.9",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20",
             "https://github.com/meta-pytorch/opacus/issues/194",
             "https://github.com/IDEA-Research/DN-DETR/issues/19"),
            Measure("test_acc", "last test accuracy at least 0.1 below the healthy run's: 0.23 (chance; the "
                    "loss grows to ~1e3) against 0.80 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

OPT = {"batch_size": 32, "num_epoches": 15, "lr": 0.1, "momentum": 0.9, "word_hidden_size": 16,
       "sent_hidden_size": 16, "es_min_delta": 0.0, "es_patience": 5, "test_interval": 1}  # fmt: skip
N_CLASSES, N_TRAIN, N_TEST = 4, 640, 256
N_FILLER, KEYS_PER_CLASS, EMBED = 200, 5, 16
MAX_SENT, MAX_WORD = 5, 8


# --------------------------------------------------------------------------- the data (csv + GloVe stand-in)


def corpus(seed: int) -> tuple[list[tuple[int, list[list[str]]]], list[tuple[int, list[list[str]]]], list[str],
                                np.ndarray]:  # fmt: skip
    """(train docs, test docs, the word list of the "pretrained" vectors, the vectors).
    A document: 3-5 sentences of 4-7 filler words; one or two sentences carry a key word
    of the document's class (5 per class) at a random place."""
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(N_FILLER)]
    keys = [[f"c{c}k{i}" for i in range(KEYS_PER_CLASS)] for c in range(N_CLASSES)]
    words = filler + [k for ks in keys for k in ks]
    vectors = rng.normal(0.0, 1.0, size=(len(words), EMBED))

    def document(label: int) -> list[list[str]]:
        sents = [[filler[int(i)] for i in rng.integers(0, N_FILLER, size=int(rng.integers(4, MAX_WORD)))]
                 for _ in range(int(rng.integers(3, MAX_SENT + 1)))]  # fmt: skip
        for s in rng.choice(len(sents), size=int(rng.integers(1, 3)), replace=False):
            sents[s].insert(int(rng.integers(0, len(sents[s]) + 1)), keys[label][int(rng.integers(0, KEYS_PER_CLASS))])
        return sents

    def split(n: int) -> list[tuple[int, list[list[str]]]]:
        return [(int(label), document(int(label))) for label in rng.integers(0, N_CLASSES, size=n)]

    return split(N_TRAIN), split(N_TEST), words, vectors


class MyDataset(Dataset):
    def __init__(self, docs: list[tuple[int, list[list[str]]]], dictionary: list[str],
                 max_length_sentences: int, max_length_word: int) -> None:  # fmt: skip
        self.labels = [label for label, _ in docs]
        self.texts = [sents for _, sents in docs]
        self.index = {w: i for i, w in enumerate(dictionary)}  # the source's dict.index(word)
        self.max_length_sentences, self.max_length_word = max_length_sentences, max_length_word
        self.num_classes = len(set(self.labels))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        encode = [[self.index.get(w, -1) for w in sent] for sent in self.texts[index]]
        for sent in encode:
            sent.extend([-1] * (self.max_length_word - len(sent)))
        encode.extend([[-1] * self.max_length_word for _ in range(self.max_length_sentences - len(encode))])
        encode = [sent[: self.max_length_word] for sent in encode][: self.max_length_sentences]
        document = np.stack(encode, axis=0) + 1
        return document.astype(np.int64), self.labels[index]


# --------------------------------------------------------------------------- src/utils.py


def matrix_mul(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    feature_list = []
    for feature in inp:
        feature = torch.mm(feature, weight)
        if isinstance(bias, nn.Parameter):
            feature = feature + bias.expand(feature.size()[0], bias.size()[1])
        feature_list.append(torch.tanh(feature).unsqueeze(0))
    return torch.cat(feature_list, 0).squeeze()


def element_wise_mul(input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
    feature_list = []
    for feature_1, feature_2 in zip(input1, input2):
        feature_2 = feature_2.unsqueeze(1).expand_as(feature_1)
        feature_list.append((feature_1 * feature_2).unsqueeze(0))
    return torch.sum(torch.cat(feature_list, 0), 0).unsqueeze(0)


# --------------------------------------------------------------------------- src/*_att_model.py


class WordAttNet(nn.Module):
    def __init__(self, vectors: np.ndarray, hidden_size: int = 50, softmax_dim: int = 1) -> None:
        super().__init__()
        table = torch.from_numpy(np.concatenate([np.zeros((1, vectors.shape[1])), vectors], axis=0).astype(np.float64))
        dict_len, embed_size = table.shape
        self.word_weight = nn.Parameter(torch.Tensor(2 * hidden_size, 2 * hidden_size))
        self.word_bias = nn.Parameter(torch.zeros(1, 2 * hidden_size))  # uninitialised in the source
        self.context_weight = nn.Parameter(torch.Tensor(2 * hidden_size, 1))
        self.lookup = nn.Embedding(num_embeddings=dict_len, embedding_dim=embed_size).from_pretrained(table)
        self.gru = nn.GRU(embed_size, hidden_size, bidirectional=True)
        self.softmax_dim = softmax_dim
        self._create_weights(mean=0.0, std=0.05)

    def _create_weights(self, mean: float = 0.0, std: float = 0.05) -> None:
        self.word_weight.data.normal_(mean, std)
        self.context_weight.data.normal_(mean, std)

    def forward(self, inp: torch.Tensor, hidden_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.lookup(inp)
        f_output, h_output = self.gru(output.float(), hidden_state)
        output = matrix_mul(f_output, self.word_weight, self.word_bias)
        output = matrix_mul(output, self.context_weight).permute(1, 0)  # (batch, words)
        output = F.softmax(output, dim=self.softmax_dim)
        output = element_wise_mul(f_output, output.permute(1, 0))
        return output, h_output


class SentAttNet(nn.Module):
    def __init__(self, sent_hidden_size: int = 50, word_hidden_size: int = 50, num_classes: int = 14) -> None:
        super().__init__()
        self.sent_weight = nn.Parameter(torch.Tensor(2 * sent_hidden_size, 2 * sent_hidden_size))
        self.sent_bias = nn.Parameter(torch.zeros(1, 2 * sent_hidden_size))  # uninitialised in the source
        self.context_weight = nn.Parameter(torch.Tensor(2 * sent_hidden_size, 1))
        self.gru = nn.GRU(2 * word_hidden_size, sent_hidden_size, bidirectional=True)
        self.fc = nn.Linear(2 * sent_hidden_size, num_classes)
        self._create_weights(mean=0.0, std=0.05)

    def _create_weights(self, mean: float = 0.0, std: float = 0.05) -> None:
        self.sent_weight.data.normal_(mean, std)
        self.context_weight.data.normal_(mean, std)

    def forward(self, inp: torch.Tensor, hidden_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f_output, h_output = self.gru(inp, hidden_state)
        output = matrix_mul(f_output, self.sent_weight, self.sent_bias)
        output = matrix_mul(output, self.context_weight).permute(1, 0)  # (batch, sentences)
        output = F.softmax(output, dim=1)
        output = element_wise_mul(f_output, output.permute(1, 0)).squeeze(0)
        return self.fc(output), h_output


class HierAttNet(nn.Module):
    def __init__(self, word_hidden_size: int, sent_hidden_size: int, batch_size: int, num_classes: int,
                 vectors: np.ndarray, max_sent_length: int, max_word_length: int,
                 word_softmax_dim: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.batch_size = batch_size
        self.word_hidden_size, self.sent_hidden_size = word_hidden_size, sent_hidden_size
        self.max_sent_length, self.max_word_length = max_sent_length, max_word_length
        self.word_att_net = WordAttNet(vectors, word_hidden_size, softmax_dim=word_softmax_dim)
        self.sent_att_net = SentAttNet(sent_hidden_size, word_hidden_size, num_classes)
        self._init_hidden_state()

    def _init_hidden_state(self, last_batch_size: int | None = None) -> None:
        batch_size = last_batch_size if last_batch_size else self.batch_size
        self.word_hidden_state = torch.zeros(2, batch_size, self.word_hidden_size)
        self.sent_hidden_state = torch.zeros(2, batch_size, self.sent_hidden_size)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        output_list = []
        for sentence in inp.permute(1, 0, 2):
            output, self.word_hidden_state = self.word_att_net(sentence.permute(1, 0), self.word_hidden_state)
            output_list.append(output)
        output = torch.cat(output_list, 0)
        output, self.sent_hidden_state = self.sent_att_net(output, self.sent_hidden_state)
        return output


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    opt = dict(OPT)
    torch.manual_seed(123 + seed)
    train_docs, test_docs, words, vectors = corpus(seed)
    training_set = MyDataset(train_docs, words, MAX_SENT, MAX_WORD)
    test_set = MyDataset(test_docs, words, MAX_SENT, MAX_WORD)
    training_generator = DataLoader(training_set, batch_size=opt["batch_size"], shuffle=True, drop_last=True,
                                    generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_generator = DataLoader(test_set, batch_size=opt["batch_size"], shuffle=False, drop_last=False)

    model = HierAttNet(opt["word_hidden_size"], opt["sent_hidden_size"], opt["batch_size"], training_set.num_classes,
                       vectors, MAX_SENT, MAX_WORD,
                       word_softmax_dim=0 if variant == "word_attention_softmax_over_batch" else 1)  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=opt["lr"],
                                momentum=opt["momentum"])  # fmt: skip

    first = [training_set[i] for i in range(opt["batch_size"])]
    probe_batch = (torch.from_numpy(np.stack([d for d, _ in first])), torch.tensor([lab for _, lab in first]))
    model._init_hidden_state()
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    best_loss, best_epoch, best_state = 1e5, 0, None
    te_loss = te_acc = train_loss = float("nan")
    best_acc = 0.0
    model.train()
    for epoch in range(opt["num_epoches"]):
        for feature, label in training_generator:
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            model._init_hidden_state()
            predictions = model(feature)
            loss = mon.loss_fn(predictions, label)
            loss.backward()
            optimizer.step()
            accuracy = float((predictions.detach().argmax(-1) == label).float().mean())
            nx.timed(lambda: mon.log(loss, accuracy=accuracy))  # noqa: B023
            train_loss = loss.item()
        if epoch % opt["test_interval"] == 0:
            model.eval()
            loss_ls, te_label_ls, te_pred_ls = [], [], []
            for te_feature, te_label in test_generator:
                num_sample = len(te_label)
                with torch.no_grad():
                    model._init_hidden_state(num_sample)
                    te_predictions = model(te_feature)
                loss_ls.append(criterion(te_predictions, te_label) * num_sample)
                te_label_ls.extend(te_label.clone().cpu())
                te_pred_ls.append(te_predictions.clone().cpu())
            te_loss = float(sum(loss_ls) / len(test_set))
            te_pred = torch.cat(te_pred_ls, 0)
            te_acc = float((te_pred.argmax(-1).numpy() == np.array(te_label_ls)).mean())
            best_acc = max(best_acc, te_acc)
            nx.timed(lambda: mon.log(te_loss, split="val", accuracy=te_acc))  # noqa: B023
            model.train()
            if te_loss + opt["es_min_delta"] < best_loss:
                best_loss, best_epoch = te_loss, epoch
                best_state = copy.deepcopy(model.state_dict())
            if epoch - best_epoch > opt["es_patience"] > 0:
                break

    model._init_hidden_state()
    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    del best_state
    return {"test_acc": te_acc, "best_test_acc": best_acc, "test_loss": te_loss, "train_loss": train_loss}
