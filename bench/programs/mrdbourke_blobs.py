"""Port of mrdbourke/pytorch-deep-learning's ``02_pytorch_classification.ipynb``, the multi-class
part: four Gaussian blobs from scikit-learn's ``make_blobs``, a ``BlobModel`` (a stack of
``nn.Linear`` layers in an ``nn.Sequential``), ``nn.CrossEntropyLoss`` and plain SGD at lr 0.1,
full-batch, with the notebook's train/test loop and its ``accuracy_fn``.

Source: github.com/mrdbourke/pytorch-deep-learning, ``02_pytorch_classification.ipynb`` (section
8, "Putting things together by building a multi-class PyTorch model", and ``accuracy_fn`` from
section 3) at commit baa27b691617461c173ecf3439793cd8cde74e13 (MIT, Copyright (c) 2021 Daniel
Bourke). Written anew from the facts of that notebook; no code copied.

Kept: ``NUM_CLASSES = 4``, ``NUM_FEATURES = 2``, ``RANDOM_SEED = 42``; ``make_blobs(n_samples=1000,
n_features=2, centers=4, cluster_std=1.5, random_state=42)``; ``torch.from_numpy(...).type(
torch.float)`` features and ``.type(torch.LongTensor)`` labels; ``train_test_split(...,
test_size=0.2, random_state=42)``; ``BlobModel(input_features, output_features,
hidden_units=8)``: ``linear_layer_stack = nn.Sequential(Linear(2, 8), ReLU(), Linear(8, 8),
ReLU(), Linear(8, 4))``; ``loss_fn = nn.CrossEntropyLoss()``; ``torch.optim.SGD(
model_4.parameters(), lr=0.1)``; ``torch.manual_seed(42)`` before the fit; 100 epochs, each:
``model_4.train()``, ``y_logits = model_4(X_blob_train)``, ``y_pred = torch.softmax(y_logits,
dim=1).argmax(dim=1)``, ``loss = loss_fn(y_logits, y_blob_train)``, ``acc = accuracy_fn(...)``,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``; then ``model_4.eval()``
and under ``torch.inference_mode()`` the test logits, ``torch.softmax(test_logits,
dim=1).argmax(dim=1)``, the test loss and ``accuracy_fn``; the final predictions on the test set
the same way. ``accuracy_fn``: ``torch.eq(y_true, y_pred).sum().item() / len(y_pred) * 100``.
Changed: the notebook publishes the two ``nn.ReLU()`` lines commented out, with the invitation
to uncomment them ("does our dataset require non-linear layers?"); this port has them
uncommented (a Linear-ReLU stack), as a reader who accepts the invitation runs it. The model is
built after ``torch.manual_seed(42 + seed)`` (the notebook builds it unseeded in its own cell).
Shrunk: nothing (the notebook already runs in a second on a CPU); no plots, no torchmetrics.
Measure only (not in the program): ``test_nll``, the negative log-likelihood of the test labels
under the probabilities the model itself outputs (``torch.softmax`` of the logits; in the
softmax-layer bug, the model's own Softmax output), besides the notebook's final test loss and
test accuracy.

nndx, as the author would add it: the training is full-batch, so a preflight ``nndx.probe`` on
``(X_blob_train, y_blob_train)`` with ``loss_fn``, the optimizer and the four splits as
``data``; ``nndx.Monitor(model_4, optimizer, every=10)`` around the epoch loop, each epoch's
training loss logged with its accuracy and the test loss as ``split="val"`` with the test
accuracy (where the notebook prints them); after the loop ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from sklearn.datasets import make_blobs
from sklearn.model_selection import train_test_split
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "mrdbourke_blobs"
SOURCE = Source("mrdbourke/pytorch-deep-learning", "02_pytorch_classification.ipynb",
                "baa27b691617461c173ecf3439793cd8cde74e13", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's multi-class model with its ReLUs uncommented, trained as published"),
        Variant(
            "softmax_output_layer",
            "an nn.Softmax(dim=1) appended to the BlobModel's nn.Sequential so that the model 'outputs "
            "probabilities', while the loss stays nn.CrossEntropyLoss, which applies log-softmax itself: the "
            "loss sees softmax(softmax(logits)), its gradients shrink and training stalls",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/MicrosoftDocs/ml-basics/issues/48",
             "https://github.com/lansinuote/Huggingface_Toturials/issues/6",
             "https://github.com/DSKSD/DeepNLP-models-Pytorch/issues/2"),
            Measure("test_nll", "NLL of the model's own output probabilities on the test set at least 2x the "
                    "healthy run's: 0.084 against 0.0245 on seed 0 (test accuracy 99.5 in both; the notebook's "
                    "test loss 0.80 against 0.0245)", lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "step 3 of the loop, optimizer.zero_grad(), left out: every backward adds to the gradients of all "
            "the epochs before, so each SGD step follows the running sum of the past gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/wenet-e2e/wekws/pull/73",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7"),
            Measure("test_loss", "final test loss at least 1.5x the healthy run's (or not finite): 3.37 against "
                    "0.0245 on seed 0 (test accuracy 20.5 against 99.5)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

NUM_CLASSES = 4
NUM_FEATURES = 2
RANDOM_SEED = 42
EPOCHS = 100


def accuracy_fn(y_true: torch.Tensor, y_pred: torch.Tensor) -> float:
    correct = torch.eq(y_true, y_pred).sum().item()
    acc = (correct / len(y_pred)) * 100
    return acc


class BlobModel(nn.Module):
    def __init__(self, input_features: int, output_features: int, hidden_units: int = 8,
                 softmax_output: bool = False) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = [
            nn.Linear(in_features=input_features, out_features=hidden_units),
            nn.ReLU(),
            nn.Linear(in_features=hidden_units, out_features=hidden_units),
            nn.ReLU(),
            nn.Linear(in_features=hidden_units, out_features=output_features),
        ]
        if softmax_output:  # the bug: the model "returns probabilities"
            layers.append(nn.Softmax(dim=1))
        self.linear_layer_stack = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_layer_stack(x)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    # 1. Create multi-class data
    X_blob, y_blob = make_blobs(n_samples=1000, n_features=NUM_FEATURES, centers=NUM_CLASSES, cluster_std=1.5,
                                random_state=RANDOM_SEED + seed)  # fmt: skip
    # 2. Turn data into tensors
    X_blob = torch.from_numpy(X_blob).type(torch.float)
    y_blob = torch.from_numpy(y_blob).type(torch.LongTensor)
    # 3. Split into train and test sets
    X_blob_train, X_blob_test, y_blob_train, y_blob_test = train_test_split(
        X_blob, y_blob, test_size=0.2, random_state=RANDOM_SEED + seed)

    torch.manual_seed(42 + seed)
    model_4 = BlobModel(input_features=NUM_FEATURES, output_features=NUM_CLASSES, hidden_units=8,
                        softmax_output=variant == "softmax_output_layer")  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model_4.parameters(), lr=0.1)

    splits = (X_blob_train, y_blob_train, X_blob_test, y_blob_test)
    nx.preflight(model_4, (X_blob_train, y_blob_train), loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model_4, optimizer, every=10)

    torch.manual_seed(42 + seed)
    epochs = EPOCHS
    first_loss = float("nan")
    for epoch in range(epochs):
        ### Training
        model_4.train()
        # 1. Forward pass
        y_logits = model_4(X_blob_train)
        y_pred = torch.softmax(y_logits, dim=1).argmax(dim=1)
        # 2. Calculate loss and accuracy
        loss = loss_fn(y_logits, y_blob_train)
        acc = accuracy_fn(y_true=y_blob_train, y_pred=y_pred)
        # 3. Optimizer zero grad
        if variant != "no_zero_grad":
            optimizer.zero_grad()
        # 4. Loss backwards
        loss.backward()
        # 5. Optimizer step
        optimizer.step()
        nx.timed(lambda: mon.log(loss, accuracy=acc))  # noqa: B023
        if epoch == 0:
            first_loss = loss.item()

        ### Testing
        model_4.eval()
        with torch.inference_mode():
            # 1. Forward pass
            test_logits = model_4(X_blob_test)
            test_pred = torch.softmax(test_logits, dim=1).argmax(dim=1)
            # 2. Calculate test loss and accuracy
            test_loss = loss_fn(test_logits, y_blob_test)
            test_acc = accuracy_fn(y_true=y_blob_test, y_pred=test_pred)
        if epoch % 10 == 0:  # where the notebook prints
            nx.timed(lambda: mon.log(test_loss.item(), split="val", accuracy=test_acc))  # noqa: B023

    nx.finish(mon, model_4, (X_blob_train, y_blob_train), loss_fn, optimizer=optimizer, data=splits)

    # Make predictions
    model_4.eval()
    with torch.inference_mode():
        y_logits = model_4(X_blob_test)
    y_pred_probs = torch.softmax(y_logits, dim=1)
    y_preds = y_pred_probs.argmax(dim=1)
    # measure only: the NLL of the probabilities the model itself outputs (its Softmax layer's in the bug)
    model_probs = y_logits if variant == "softmax_output_layer" else y_pred_probs
    test_nll = -model_probs.gather(1, y_blob_test[:, None]).clamp_min(1e-12).log().mean().item()
    return {"test_nll": test_nll, "test_loss": test_loss.item(), "test_acc": accuracy_fn(y_true=y_blob_test, y_pred=y_preds),
            "train_loss": loss.item(), "train_acc": acc, "first_train_loss": first_loss}  # fmt: skip
