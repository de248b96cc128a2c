"""Error rules (NNDX7xx): a recorded exception is evidence of its cause.

Each rule matches patterns (regular expressions over the lower-cased message) of
PyTorch's own error messages in the
exceptions the probes caught (``report.errors``) and in the messages of probes that
ended with status ``error``. The phrases come from torch 2.x messages; a rule cites the
first message it matched. The training loop's own exception is there too when it raised
inside ``with Monitor(...)`` (source ``training``): an in-place error naming a tensor of
a trainable parameter's shape after an optimizer step is read as GRAPH_RETAINED (the
step changed the parameter while an earlier step's graph still needed it).
"""

from __future__ import annotations

import re

from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport
from nndx.rules._series import loss_curve, train_curve
from nndx.rules.engine import Hit, Rule, add_rule

def recorded_errors(report: DiagnosticReport) -> list[tuple[str, str, str]]:
    """(source, type, message) of every recorded exception, probe errors included."""
    found = [(e.source, e.type, e.message) for e in report.errors]
    if report.probes is not None:
        for name, result in report.probes.results().items():
            if result.status == "error" and result.message:
                found.append((name, "ProbeError", result.message))
    return found


# (id, code, title, phrases, why, fix)
ERROR_TABLE: tuple[tuple[str, C, str, tuple[str, ...], str, str], ...] = (
    (
        "NNDX701",
        C.DEVICE_MISMATCH,
        "Tensors on different devices",
        (
            "expected all tensors to be on the same device",
            "expected cuda",
            "expected object of device type",
            "found at least two devices",
            "is not on the expected device",
            "should be the same or input should be a mkldnn tensor",
            r"input type \(torch\.floattensor\) and weight type \(torch\.cuda",
            r"input type \(torch\.cuda",
        ),
        "The model's parameters and the batch (or the loss's target) live on different devices.",
        "Move the model once (model.to(device)) and every batch and target in the loop "
        "(x, y = x.to(device), y.to(device)); build the optimizer after moving the model.",
    ),
    (
        "NNDX702",
        C.INPLACE_AUTOGRAD,
        "An in-place operation broke autograd",
        ("modified by an inplace operation", "leaf variable that requires grad is being used in an in-place"),
        "An in-place op (x += ..., relu_(), x[idx] = ...) overwrote a tensor autograd saved for the backward.",
        "Replace the in-place op with its out-of-place form (x = x + ..., F.relu(x), torch.where) or "
        "clone before modifying; nn.ReLU(inplace=True) after a layer that saves its output is a common "
        "culprit.",
    ),
    (
        "NNDX703",
        C.LABEL_DTYPE,
        "Labels of the wrong dtype or encoding (error)",
        (
            "expected scalar type long",
            "expected target dtype to be long",
            "expected floating point type for target",
            "can't be cast to the desired output type long",
            r"target -?\d+ is out of bounds",
            "0d or 1d target tensor expected",
            "expected scalar type float but found",
            "found dtype long but expected float",
        ),
        "The loss got labels of a dtype or encoding it does not accept: float class indices, one-hot long "
        "targets, labels numbered 1..C instead of 0..C-1.",
        "CrossEntropyLoss: y.long() class indices in [0, C) of shape [N]; BCE losses: y.float() of the "
        "output's shape.",
    ),
    (
        "NNDX704",
        C.GRAPH_RETAINED,
        "Backward through a graph a second time",
        ("trying to backward through the graph a second time",),
        "A graph is reused across steps: a loss accumulated as a tensor (total += loss, not loss.item()), "
        "a hidden state carried between batches without .detach(), or retain_graph misuse.",
        "Accumulate running losses with loss.item(); detach recurrent state between batches; call backward "
        "once per forward.",
    ),
    (
        "NNDX705",
        C.SHAPE_BROADCAST,
        "Output and target shapes do not match (error)",
        (
            "must be the same as input size",
            "using a target size",
            "to match target batch_size",
            "must match the size of tensor",
        ),
        "The output and target shapes differ in the loss; some pairs error, others broadcast silently.",
        "Make output and target shapes equal (squeeze/unsqueeze/view_as) and check the batch dimension.",
    ),
    (
        "NNDX706",
        C.WRONG_RESHAPE,
        "A reshape does not fit the tensor",
        (
            "shapes cannot be multiplied",
            "is invalid for input of size",
            "view size is not compatible",
            r"expected input\[",
        ),
        "A view/reshape/flatten produced the wrong layout (view where permute was meant, a wrong flatten "
        "size), so a layer receives features it was not built for.",
        "Print shapes through the forward; use permute for reordering axes and reshape/flatten(1) for "
        "flattening; size the first Linear from a dummy forward.",
    ),
    (
        "NNDX707",
        C.DETACHED_GRAPH,
        "The loss is not connected to any parameter",
        ("does not require grad and does not have a grad_fn",),
        "The loss was computed from tensors cut from the graph (.detach(), .item(), .numpy(), torch.no_grad, "
        "a tensor rebuilt with torch.tensor(...)).",
        "Compute the loss from the model's outputs with differentiable ops only; remove the detach/no_grad.",
    ),
    (
        "NNDX708",
        C.WRONG_LOSS,
        "BCELoss given values outside [0, 1]",
        ("all elements of input should be between 0 and 1",),
        "BCELoss expects probabilities but received logits.",
        "Use BCEWithLogitsLoss on the logits (numerically safer) or apply sigmoid first.",
    ),
    (
        "NNDX709",
        C.LOG_OF_ZERO,
        "Anomaly detection: a log returned NaN",
        ("'logbackward", "'log1pbackward", "'log2backward", "'log10backward"),
        "torch.autograd.detect_anomaly traced the NaN to a log: the log of 0 or a negative number.",
        "Clamp before log (p.clamp_min(1e-12)) or work in log space.",
    ),
    (
        "NNDX710",
        C.DIVISION_BY_ZERO,
        "Anomaly detection: a division returned NaN",
        ("'divbackward", "'reciprocalbackward", "'rsqrtbackward", "'sqrtbackward"),
        "torch.autograd.detect_anomaly traced the NaN to a division or root of 0.",
        "Add eps to denominators and inside sqrt.",
    ),
    (
        "NNDX711",
        C.NUMERICAL_OVERFLOW,
        "Anomaly detection: an exp/pow overflowed",
        ("'expbackward", "'powbackward", "'softmaxbackward"),
        "torch.autograd.detect_anomaly traced the NaN to an exp or power that overflowed.",
        "Subtract the max before exp; use torch.softmax/log_softmax.",
    ),
)


# Errors that are the direct consequence of a finding another rule makes: every
# parameter frozen makes backward fail with "does not require grad";
# A target index out of bounds is what CrossEntropyLoss over a single output unit gives.
ERROR_EXPLAINED_BY: dict[str, tuple[C, ...]] = {
    "NNDX707": (C.FROZEN_PARAMETERS,),
    "NNDX703": (C.WRONG_OUTPUT_ACTIVATION,),
}


# "[torch.FloatTensor [8, 8]], which is output 0 of AsStrided, is at version 2; expected
# version 1": the tensor autograd
# needed unchanged, by its shape
_VERSIONED_TENSOR = re.compile(r"\[torch\.\w+ \[([0-9, ]*)\]\][^;]*? is at version")


def _matcher(phrases: tuple[str, ...]):
    def check(report: DiagnosticReport) -> Hit | None:
        for source, type_, message in recorded_errors(report):
            text = message.lower()
            if any(re.search(pattern, text) for pattern in phrases):
                first_line = message.strip().splitlines()[0] if message.strip() else message
                evidence = {"source": source, "error_type": type_, "message": first_line[:500]}
                parameter = _stepped_parameter(report, source, message)
                if parameter is not None and "modified by an inplace operation" in text:
                    # optimizer.step() updates parameters in place: an earlier step's graph that
                    # still needs their old values was kept across the step
                    return Hit(
                        symptom=f"{type_} in the training loop: parameter {parameter} was updated in place by "
                        "the optimizer while an earlier step's graph still needed it (a graph kept across steps)",
                        evidence=evidence | {"parameter": parameter},
                        score=3.0,
                        code=C.GRAPH_RETAINED,
                    )
                trained = _loop_trained(report) if source != "training" else 0
                return Hit(symptom=f"{type_} in {source}: {first_line[:200]}" + (
                    f"; the loop's own {trained} steps ran with finite losses: what was handed to nndx.probe (the "
                    "batch, the loss on the model's raw output) is not what the loop computes" if trained else ""),
                    evidence=evidence, severity="info" if trained else None, score=1.0 if trained else 3.0)
        return None

    return check


# a loop the Monitor saw step this often, every logged train loss finite, did not raise what a probe raised
TRAINED_STEPS = 10


def _loop_trained(report: DiagnosticReport) -> int:
    """The loop's optimizer steps when the Monitor saw it train (at least TRAINED_STEPS, as many finite
    logged train losses): an exception only a probe raised is then the probe's call (a batch or a loss
    that differ from the loop's: BCELoss on a discriminator's raw (N, 1, 1, 1) output the loop reshapes
    first), not the training's. 0 otherwise."""
    points, steps = train_curve(report), report.loop.steps if report.loop is not None else 0
    if steps < TRAINED_STEPS or len(points) < TRAINED_STEPS or len(loss_curve(report).values) < len(points):
        return 0  # a curve's values are the finite ones
    return steps


def _stepped_parameter(report: DiagnosticReport, source: str, message: str) -> str | None:
    """The trainable parameter whose shape is that of the tensor an in-place error names,
    when the training loop raised it after at least one optimizer step."""
    match = _VERSIONED_TENSOR.search(message)
    if source != "training" or match is None or report.loop is None or report.loop.steps < 1:
        return None
    shape = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
    return next((p.name for p in report.parameters if p.requires_grad and list(p.shape) == shape), None)


def _register() -> None:
    for rule_id, code, title, phrases, why, fix in ERROR_TABLE:
        add_rule(
            Rule(
                id=rule_id,
                code=code,
                severity="error",
                title=title,
                detects="A recorded exception (report.errors, or a probe that ended in error) whose message "
                "matches one of these patterns: " + "; ".join(f"/{p}/" for p in phrases) + ". Info when a probe "
                f"raised it while the Monitor saw the loop take {TRAINED_STEPS} steps or more with finite train "
                "losses: the loop did not raise it, so what was handed to nndx.probe differs from what it computes.",
                why=why,
                fix=fix,
                family="errors",
                check=_matcher(phrases),
                explained_by=ERROR_EXPLAINED_BY.get(rule_id, ()),
            )
        )


_register()
