"""Port of pytorch/tutorials' "Deep Learning with PyTorch" (NLP tutorial): a logistic-regression
bag-of-words classifier tells Spanish sentences from English ones.

Source: github.com/pytorch/tutorials, ``beginner_source/nlp/deep_learning_tutorial.py``
(``BoWClassifier``, ``make_bow_vector``, ``make_target``, the training loop) at commit
016d0cc077f60c82b8497d4c7f92051ce40cafee (BSD-3-Clause, Robert Guthrie / PyTorch contributors;
later versions drop ``autograd.Variable`` and wrap the test passes in ``torch.no_grad()``,
the model and loop unchanged). Written anew from the facts of that file; no code copied.

Kept: ``torch.manual_seed(1)``; ``word_to_ix`` built over the words of the train and the test
sentences, in order of first appearance; ``BoWClassifier(num_labels, vocab_size)`` = one
``nn.Linear(vocab_size, num_labels)`` whose output goes through ``F.log_softmax(..., dim=1)``;
``make_bow_vector`` (a ``torch.zeros(len(word_to_ix))`` count vector filled word by word with
``+= 1``, returned as ``view(1, -1)``); ``make_target`` (``torch.LongTensor([label_to_ix[label]])``);
``label_to_ix = {"SPANISH": 0, "ENGLISH": 1}``; ``nn.NLLLoss()``; ``optim.SGD(model.parameters(),
lr=0.1)``; 100 epochs, each a pass over the sentences in their stored order, one sentence a
step: ``model.zero_grad()``, the BoW vector and target, ``log_probs = model(bow_vec)``, the
loss, ``backward``, ``optimizer.step()``; the test sentences run through the model after
training.
Replaced: the tutorial's four training sentences and two test sentences by 48 training and 16
test sentences written for this port, Spanish and English alternating as in the tutorial
(short everyday sentences sharing function words within each language, a few loanwords and
names in both).
Measure only (not in the program): the NLL of the test sentences (mean of ``-log p(label)``
over the classes of the logits ``model.linear`` gives, for every variant) and their accuracy;
the norm of the trained weight matrix; the mean training loss of the first and last epoch as
the program computes it.

nndx, as the author would add it (the README's quick start and Monitor loop): the probe needs
a batch, so the author stacks the training sentences' BoW vectors and targets into ``(X, y)``
(``make_bow_vector`` rows, ``make_target`` values) and the test sentences likewise; a
preflight ``nndx.probe(model, (X, y), loss_function, optimizer=optimizer, data=(X, y, X_test,
y_test))``; ``nndx.Monitor(model, optimizer, every=10)`` around the epochs, every step's loss
logged after ``optimizer.step()``; after training ``nndx.probe(..., monitor=mon)`` with the
same arguments and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bow_classifier"
SOURCE = Source("pytorch/tutorials", "beginner_source/nlp/deep_learning_tutorial.py",
                "016d0cc077f60c82b8497d4c7f92051ce40cafee", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (48 training / 16 test sentences of this port's, 100 epochs)"),
        Variant(
            "log_softmax_over_batch",
            "BoWClassifier.forward normalises over the wrong axis, F.log_softmax(self.linear(bow_vec), dim=0): "
            "each step's input is one sentence of shape (1, vocab), so the log-softmax over the batch axis is 0 "
            "for both labels, the NLL is exactly 0 and no gradient reaches the weights",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/MicrosoftDocs/pytorchfundamentals/issues/4",
             "https://github.com/fxia22/pointnet.pytorch/issues/27",
             "https://github.com/torch/nn/issues/1089"),
            Measure("test_acc", "test accuracy at least 25 points below the healthy run's: 56.25 against 100.0 "
                    "healthy on seed 0 (every epoch's loss 0.0)",
                    lambda healthy, buggy: buggy < healthy - 25.0),
        ),
        Variant(
            "zero_grad_dropped",
            "the loop's model.zero_grad() (the tutorial's Step 1) is left out: every sentence's gradient is "
            "added to all the earlier ones, so each SGD step moves the weights by the sum of every gradient so "
            "far and the weights run away",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/wenet-e2e/wekws/pull/73"),
            Measure("weight_norm", "norm of the trained weight matrix at least 10x the healthy run's: 3302 against "
                    "7.27 healthy on seed 0 (test accuracy 100.0 in both)",
                    lambda healthy, buggy: not buggy < 10.0 * healthy),
        ),
    )
}

EPOCHS = 100
LR = 0.1

# (sentence, label), Spanish and English alternating as in the tutorial's data
DATA_TEXT = [
    ("me gusta comer en la cafeteria", "SPANISH"),
    ("Give it to me", "ENGLISH"),
    ("No creo que sea una buena idea", "SPANISH"),
    ("No it is not a good idea to get lost at sea", "ENGLISH"),
    ("el perro come en la casa", "SPANISH"),
    ("the dog eats in the house", "ENGLISH"),
    ("mi hermana vive cerca del mar", "SPANISH"),
    ("my sister lives near the sea", "ENGLISH"),
    ("hoy hace mucho calor en la ciudad", "SPANISH"),
    ("it is very hot in the city today", "ENGLISH"),
    ("quiero un cafe con leche por favor", "SPANISH"),
    ("I want a coffee with milk please", "ENGLISH"),
    ("los ninos juegan en el parque", "SPANISH"),
    ("the children play in the park", "ENGLISH"),
    ("donde esta la estacion de tren", "SPANISH"),
    ("where is the train station", "ENGLISH"),
    ("mañana vamos a la playa con Maria", "SPANISH"),
    ("tomorrow we go to the beach with Maria", "ENGLISH"),
    ("no tengo tiempo para leer el libro", "SPANISH"),
    ("I do not have time to read the book", "ENGLISH"),
    ("la comida de mi madre es la mejor", "SPANISH"),
    ("my mother's food is the best", "ENGLISH"),
    ("el tren llega tarde otra vez", "SPANISH"),
    ("the train is late again", "ENGLISH"),
    ("me gusta la musica y el cine", "SPANISH"),
    ("I like music and the cinema", "ENGLISH"),
    ("ellos trabajan en una oficina grande", "SPANISH"),
    ("they work in a big office", "ENGLISH"),
    ("que hora es ahora", "SPANISH"),
    ("what time is it now", "ENGLISH"),
    ("mi amigo Carlos tiene un gato negro", "SPANISH"),
    ("my friend Carlos has a black cat", "ENGLISH"),
    ("vamos a comer pizza esta noche", "SPANISH"),
    ("let us eat pizza tonight", "ENGLISH"),
    ("el agua del rio esta fria", "SPANISH"),
    ("the water of the river is cold", "ENGLISH"),
    ("no quiero ir a la escuela", "SPANISH"),
    ("I do not want to go to school", "ENGLISH"),
    ("la casa es pequeña pero bonita", "SPANISH"),
    ("the house is small but pretty", "ENGLISH"),
    ("hablo un poco de ingles", "SPANISH"),
    ("I speak a little Spanish", "ENGLISH"),
    ("el libro esta en la mesa", "SPANISH"),
    ("the book is on the table", "ENGLISH"),
    ("creo que va a llover mañana", "SPANISH"),
    ("I think it will rain tomorrow", "ENGLISH"),
    ("mi padre compra pan cada dia", "SPANISH"),
    ("my father buys bread every day", "ENGLISH"),
]

TEST_TEXT = [
    ("Yo creo que si", "SPANISH"),
    ("it is lost on me", "ENGLISH"),
    ("el gato come en la mesa", "SPANISH"),
    ("the cat eats on the table", "ENGLISH"),
    ("mi madre vive en la ciudad", "SPANISH"),
    ("my mother lives in the city", "ENGLISH"),
    ("no tengo un perro", "SPANISH"),
    ("I do not have a dog", "ENGLISH"),
    ("los ninos van a la playa", "SPANISH"),
    ("the children go to the beach", "ENGLISH"),
    ("quiero leer un libro esta noche", "SPANISH"),
    ("I want to read a book tonight", "ENGLISH"),
    ("el agua esta fria hoy", "SPANISH"),
    ("the water is cold today", "ENGLISH"),
    ("donde esta mi cafe", "SPANISH"),
    ("where is my coffee", "ENGLISH"),
]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    softmax_dim = 0 if variant == "log_softmax_over_batch" else 1
    skip_zero_grad = variant == "zero_grad_dropped"
    torch.manual_seed(1 + seed)

    data = [(s.split(), label) for s, label in DATA_TEXT]
    test_data = [(s.split(), label) for s, label in TEST_TEXT]

    word_to_ix: dict[str, int] = {}
    for sent, _ in data + test_data:
        for word in sent:
            if word not in word_to_ix:
                word_to_ix[word] = len(word_to_ix)
    vocab_size = len(word_to_ix)
    num_labels = 2

    class BoWClassifier(nn.Module):
        def __init__(self, num_labels, vocab_size):
            super().__init__()
            self.linear = nn.Linear(vocab_size, num_labels)

        def forward(self, bow_vec):
            return F.log_softmax(self.linear(bow_vec), dim=softmax_dim)

    def make_bow_vector(sentence, word_to_ix):
        vec = torch.zeros(len(word_to_ix))
        for word in sentence:
            vec[word_to_ix[word]] += 1
        return vec.view(1, -1)

    def make_target(label, label_to_ix):
        return torch.LongTensor([label_to_ix[label]])

    model = BoWClassifier(num_labels, vocab_size)
    label_to_ix = {"SPANISH": 0, "ENGLISH": 1}

    with torch.no_grad():  # the tutorial's before-training look at the test sentences
        for instance, _ in test_data:
            model(make_bow_vector(instance, word_to_ix))

    loss_function = nn.NLLLoss()
    optimizer = optim.SGD(model.parameters(), lr=LR)

    # nndx: the sentences stacked as the README's (x, y) batch, and the splits for its data checks
    x_train = torch.cat([make_bow_vector(s, word_to_ix) for s, _ in data])
    y_train = torch.cat([make_target(label, label_to_ix) for _, label in data])
    x_test = torch.cat([make_bow_vector(s, word_to_ix) for s, _ in test_data])
    y_test = torch.cat([make_target(label, label_to_ix) for _, label in test_data])
    splits = (x_train, y_train, x_test, y_test)
    nx.preflight(model, (x_train, y_train), loss_function, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses = []
    for _ in range(EPOCHS):
        total = 0.0
        for instance, label in data:
            if not skip_zero_grad:
                model.zero_grad()
            bow_vec = make_bow_vector(instance, word_to_ix)
            target = make_target(label, label_to_ix)
            log_probs = model(bow_vec)
            loss = loss_function(log_probs, target)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            total += loss.item()
        epoch_losses.append(total / len(data))

    nx.finish(mon, model, (x_train, y_train), loss_function, optimizer=optimizer, data=splits)

    # the tutorial's after-training pass over the test sentences, scored
    nll, correct = 0.0, 0
    with torch.no_grad():
        for instance, label in test_data:
            bow_vec = make_bow_vector(instance, word_to_ix)
            model(bow_vec)
            logp = F.log_softmax(model.linear(bow_vec), dim=1)[0]
            target = label_to_ix[label]
            nll -= float(logp[target])
            correct += int(int(logp.argmax()) == target)
    weight_norm = float(model.linear.weight.detach().norm())
    return {"test_nll": nll / len(test_data), "test_acc": 100.0 * correct / len(test_data),
            "final_epoch_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0],
            "weight_norm": weight_norm if math.isfinite(weight_norm) else float("nan")}  # fmt: skip
