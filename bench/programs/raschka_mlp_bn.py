"""Port of Sebastian Raschka's deeplearning-models "Multilayer Perceptron with BatchNorm"
notebook: ``MultilayerPerceptron`` (784 -> Linear 128 -> BatchNorm1d -> ReLU -> Linear 256 ->
BatchNorm1d -> ReLU -> Linear 10; every Linear's weight re-drawn in place with
``.detach().normal_(0.0, 0.1)`` and its bias ``.detach().zero_()``; ``forward`` returns
``(logits, probas)`` with ``probas = F.softmax(logits, dim=1)``), ``torch.manual_seed(1)``,
plain SGD at lr 0.1, batch 64, ``F.cross_entropy(logits, targets)``, ``optimizer.zero_grad()``
before ``cost.backward()``, ``model.train()`` at the top of each epoch and
``compute_accuracy`` (``net.eval()``, ``torch.no_grad()``, argmax of ``probas``) after it.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/mlp/mlp-batchnorm.ipynb`` at commit
18e046926551378cd691fd871dda0f21dcd272ab (MIT licence, Copyright (c) 2019-2022 Sebastian
Raschka). Written anew from the facts of that notebook; no code copied.

Taken as the spare of this port's task: d2l's sigmoid LeNet (the first choice) needs about
1,700 SGD steps at lr 0.1 before it leaves its ln(10) plateau on the stand-in digits, 54-82 s
a run on this shared 2-core machine, beyond the 5-30 s a variant may take.

Shrunk / replaced: scikit-learn's 8x8 digits resized (bilinear) to 28x28 through ToTensor
(pixels in [0, 1], 784 features as the notebook's ``view(-1, 28*28)``) instead of MNIST: 1,437
train / 360 test images (23 batches an epoch instead of 938); 10 epochs as published; CPU.
Measure only (not in the program): the test accuracy the notebook prints at the end, and the
test cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_mlp_bn"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/mlp/mlp-batchnorm.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's BatchNorm MLP as published (digits resized to 28x28 for MNIST)"),
        Variant(
            "probas_into_cross_entropy",
            "cost = F.cross_entropy(probas, targets): the softmax output the model also returns is handed to "
            "F.cross_entropy, which applies log_softmax again (softmax twice)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/tensorflow/swift-models/pull/232",
             "https://github.com/thegregyang/LossUpAccUp/issues/1"),
            Measure("test_loss", "test cross-entropy of the logits at least 1.5x the healthy run's",
                    lambda healthy, buggy: buggy > 1.5 * healthy),
        ),
        Variant(
            "train_mode_not_restored",
            "model.train() left out of the epoch loop: compute_accuracy switches the net to eval() after the "
            "first epoch and it stays there, so from then on BatchNorm normalises the training batches with "
            "its running statistics and never updates them",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/nelson-liu/paraphrase-id-tensorflow/pull/52"),
            Measure("test_loss", "test cross-entropy at least 1.3x the healthy run's",
                    lambda healthy, buggy: buggy > 1.3 * healthy),
        ),
    )
}

RANDOM_SEED, LEARNING_RATE, NUM_EPOCHS, BATCH_SIZE = 1, 0.1, 10, 64
NUM_FEATURES, NUM_HIDDEN_1, NUM_HIDDEN_2, NUM_CLASSES = 784, 128, 256, 10


class MultilayerPerceptron(torch.nn.Module):
    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(num_features, NUM_HIDDEN_1)
        self.linear_1.weight.detach().normal_(0.0, 0.1)
        self.linear_1.bias.detach().zero_()
        self.linear_1_bn = torch.nn.BatchNorm1d(NUM_HIDDEN_1)
        self.linear_2 = torch.nn.Linear(NUM_HIDDEN_1, NUM_HIDDEN_2)
        self.linear_2.weight.detach().normal_(0.0, 0.1)
        self.linear_2.bias.detach().zero_()
        self.linear_2_bn = torch.nn.BatchNorm1d(NUM_HIDDEN_2)
        self.linear_out = torch.nn.Linear(NUM_HIDDEN_2, num_classes)
        self.linear_out.weight.detach().normal_(0.0, 0.1)
        self.linear_out.bias.detach().zero_()

    def forward(self, x):
        out = self.linear_1(x)
        out = self.linear_1_bn(out)  # batchnorm before the activation
        out = F.relu(out)
        out = self.linear_2(out)
        out = self.linear_2_bn(out)
        out = F.relu(out)
        logits = self.linear_out(out)
        probas = F.softmax(logits, dim=1)
        return logits, probas


def compute_accuracy(net, data_loader):
    net.eval()
    correct_pred, num_examples = 0, 0
    with torch.no_grad():
        for features, targets in data_loader:
            features = features.view(-1, 28 * 28)
            logits, probas = net(features)
            _, predicted_labels = torch.max(probas, 1)
            num_examples += targets.size(0)
            correct_pred += (predicted_labels == targets).sum()
        return correct_pred.float() / num_examples * 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
    train_dataset = torch.utils.data.TensorDataset(digits.upscaled(tr_x, 28), tr_y)
    test_dataset = torch.utils.data.TensorDataset(digits.upscaled(te_x, 28), te_y)
    torch.manual_seed(seed)  # the loader's shuffling
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=BATCH_SIZE, shuffle=False)

    torch.manual_seed(RANDOM_SEED + seed)
    model = MultilayerPerceptron(num_features=NUM_FEATURES, num_classes=NUM_CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    use_probas = variant == "probas_into_cross_entropy"

    def loss_fn(output, targets):  # the notebook's cost line, on the (logits, probas) the model returns
        logits, probas = output
        return F.cross_entropy(probas if use_probas else logits, targets)

    with torch.random.fork_rng():
        features0, targets0 = next(iter(train_loader))
    probe_batch = (features0.view(-1, 28 * 28), targets0)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    train_acc = float("nan")
    for epoch in range(NUM_EPOCHS):
        if variant != "train_mode_not_restored" or epoch == 0:  # a fresh model starts in train mode
            model.train()
        for _batch_idx, (features, targets) in enumerate(train_loader):
            features = features.view(-1, 28 * 28)
            logits, probas = model(features)
            cost = F.cross_entropy(probas if use_probas else logits, targets)
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(cost))  # noqa: B023 - the notebook prints the cost here
        train_acc = compute_accuracy(model, train_loader).item()
        nx.timed(lambda: mon.log(cost, accuracy=train_acc / 100))  # noqa: B023 - the epoch's accuracy line

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    test_acc = compute_accuracy(model, test_loader).item()
    with torch.no_grad():
        x_te, y_te = test_dataset.tensors
        test_loss = F.cross_entropy(model(x_te.view(-1, 28 * 28))[0], y_te).item()
    return {"test_acc": test_acc, "test_loss": test_loss, "train_acc": train_acc}
