"""The debugging tables as data: symptom → likely cause → first thing to try.

``MASTER_TABLE`` is the general debugging table for training failures; ``PYTORCH_BUGS`` lists
the PyTorch mistakes that crash nothing (or crash with a cryptic message). Each row names
the rules that reach it; tests/rules/test_table.py proves, row by row, that a report
showing the row's symptom fires one of those rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableRow:
    symptom: str
    likely_cause: str
    first_try: str
    rule_ids: tuple[str, ...]


MASTER_TABLE: tuple[TableRow, ...] = (
    TableRow(
        "Loss is NaN or Inf",
        "Learning rate too high; log of 0; division by zero; overflow; NaN in the data",
        "Lower the LR, clamp/add eps before log and division, clip gradients, check the data for NaN",
        ("NNDX101", "NNDX110", "NNDX102", "NNDX501", "NNDX605", "NNDX606", "NNDX607", "NNDX709", "NNDX710", "NNDX711"),
    ),
    TableRow(
        "Loss not decreasing",
        "LR far too low (or too high), dead ReLUs, optimizer not updating the model, bugs in the data",
        "Run the LR range test, check the activations for dead units, check the data and labels",
        ("NNDX103", "NNDX206", "NNDX603", "NNDX201", "NNDX303"),
    ),
    TableRow(
        "Loss stuck at -log(1/num_classes)",
        "The model predicts the uniform distribution: output layer or gradient flow broken",
        "Check the output layer and the gradients reaching it",
        ("NNDX106", "NNDX402"),
    ),
    TableRow(
        "Train loss falls while validation loss rises",
        "Overfitting",
        "Regularise (weight decay, dropout, augmentation), stop early, get more data",
        ("NNDX107",),
    ),
    TableRow(
        "Train and validation loss both high",
        "Underfitting: model too small or too constrained, or no non-linearity",
        "Bigger model, train longer, less regularisation; check that it can overfit one batch",
        ("NNDX108", "NNDX403", "NNDX401", "NNDX601"),
    ),
    TableRow(
        "Train and validation accuracy at chance",
        "Nothing learned, or labels that do not belong to their inputs",
        "Check the label pipeline and run the label-alignment probe",
        ("NNDX109", "NNDX610"),
    ),
    TableRow(
        "Loss oscillating or diverging",
        "Learning rate too high, or batch too small",
        "Lower the LR (10x), increase the batch size",
        ("NNDX104", "NNDX205", "NNDX602", "NNDX311"),
    ),
    TableRow(
        "Loss decreases, then plateaus",
        "Constant learning rate where a decay would help",
        "Add an LR schedule (step, cosine, ReduceLROnPlateau)",
        ("NNDX105",),
    ),
    TableRow(
        "Vanishing gradients",
        "Saturating activations, deep stack without normalisation, poor init",
        "ReLU-family activations, Kaiming/Xavier init, batch-norm, residual connections",
        ("NNDX203", "NNDX202"),
    ),
    TableRow(
        "Exploding gradients",
        "LR too high, poor init, no normalisation",
        "Clip the gradient norm, lower the LR, fix the init",
        ("NNDX204", "NNDX608", "NNDX207"),
    ),
    TableRow(
        "Dead neurons",
        "Large negative biases, LR too high, poor init",
        "LeakyReLU, a lower LR, Kaiming init with zero biases",
        ("NNDX201", "NNDX208"),
    ),
)

PYTORCH_BUGS: tuple[TableRow, ...] = (
    TableRow(
        "Forgot optimizer.zero_grad()",
        "Gradients add up across steps",
        "Call optimizer.zero_grad() once per optimizer step",
        ("NNDX301",),
    ),
    TableRow(
        "Forgot model.eval() for evaluation",
        "Dropout and batch-norm stay in training behaviour",
        "model.eval() before evaluating, model.train() after",
        ("NNDX306", "NNDX609"),
    ),
    TableRow(
        "Softmax before CrossEntropyLoss",
        "The loss applies log_softmax again on probabilities",
        "Give CrossEntropyLoss raw logits",
        ("NNDX314",),
    ),
    TableRow(
        "Wrong loss for the task (MSE for classification)",
        "The loss does not match outputs or targets",
        "CrossEntropyLoss on logits for classes; BCEWithLogitsLoss for binary",
        ("NNDX315", "NNDX708"),
    ),
    TableRow(
        "Output [N, 1] against target [N]",
        "Broadcasting in an element-wise loss",
        "Make shapes equal (squeeze/unsqueeze)",
        ("NNDX312", "NNDX705"),
    ),
    TableRow(
        "Float labels to CrossEntropyLoss (Long expected)",
        "Labels of the wrong dtype or encoding",
        "y.long() class indices for CrossEntropyLoss, y.float() for BCE",
        ("NNDX313", "NNDX703"),
    ),
    TableRow(
        "view() where permute() was meant",
        "Axes reinterpreted instead of reordered",
        "Use permute to reorder axes; print shapes through the forward",
        ("NNDX706",),
    ),
    TableRow(
        "Training data not shuffled",
        "Batches ordered by class",
        "DataLoader(..., shuffle=True)",
        ("NNDX508",),
    ),
    TableRow(
        "In-place operation breaks autograd",
        "A tensor saved for backward was overwritten",
        "Use the out-of-place op or clone first",
        ("NNDX702",),
    ),
    TableRow(
        "Tensors on different devices",
        "Model and batch (or target) not moved together",
        "Move model and every batch to the same device",
        ("NNDX701",),
    ),
    TableRow(
        "detach()/no_grad() cuts the graph",
        "Parameters get no gradient",
        "Remove the detach/no_grad between parameters and loss",
        ("NNDX304", "NNDX707"),
    ),
    TableRow(
        "Loss tensor accumulated across steps (total += loss)",
        "The autograd graph is kept alive; memory grows or backward runs twice",
        "Accumulate loss.item(); detach carried state",
        ("NNDX704",),
    ),
    TableRow(
        "Optimizer built over other parameters",
        "optimizer.step() never touches the trained model",
        "Build the optimizer from the model you train, after moving it",
        ("NNDX303",),
    ),
    TableRow(
        "Scheduler stepped per batch instead of per epoch",
        "The learning rate decays to ~0 within the first epoch",
        "scheduler.step() once per epoch (or size the schedule in batches)",
        ("NNDX307",),
    ),
    TableRow(
        "Accumulated loss not divided by the number of micro-batches",
        "The effective learning rate is k times larger",
        "loss = loss / accumulation_steps before backward",
        ("NNDX302",),
    ),
    TableRow(
        "Language-model loss near zero",
        "The target is visible in the input: targets not shifted by one, or no causal mask",
        "targets = tokens[:, 1:] for inputs tokens[:, :-1]; mask attention above the diagonal",
        ("NNDX613", "NNDX614"),
    ),
)
