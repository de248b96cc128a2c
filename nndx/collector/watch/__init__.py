"""The Monitor's watchers: one measured thing each (Cockpit's quantities), called by the
Monitor's clock with a :class:`StepContext`, keeping named records, and giving their
part of the report.

==========================  =====================================================
:class:`LoopCounts`         forwards, backward passes, gradient resets, coverage
:class:`LossHistory`        the losses logged with ``mon.log``
:class:`LearningRate`       each param group's LR, every step
:class:`EffectiveLearningRate` loops without an optimizer: the measured step size
:class:`GradientNorm`       global gradient norm, before and after clipping
:class:`MaskedGradients`    gradients of non-zero weights zeroed by hand before the step
:class:`ClipAfterStep`      gradients scaled down after the step (a clip placed after it)
:class:`RecurrentAxes`      the sizes each recurrent layer's time and batch axes took
:class:`FedInputs`          the range of another watched model's outputs fed in, beside the data
:class:`InputNorms`         the norm of each training input batch
:class:`LayerStatistics`    per-layer activation and gradient statistics
:class:`ParameterUpdates`   per-parameter norms and update/weight ratios
:class:`LossCalls`          what reached the wrapped ``mon.loss_fn``
:class:`Desync`             data-parallel replicas drifting apart
:class:`RunFacts`           the run and the model summary
:class:`GraphSize`          the autograd graph kept alive across steps
:class:`InitialState`       a copy of the parameters and buffers at attach time
:class:`UnchangedParameters` trainable parameters that never moved
==========================  =====================================================
"""

from nndx.collector.watch.base import (
    LIVE_RECORDED_STEPS,
    Deferred,
    ErrorGuard,
    History,
    StepContext,
    Watched,
    Watcher,
)
from nndx.collector.watch.clip_after_step import ClipAfterStep
from nndx.collector.watch.desync import Desync
from nndx.collector.watch.facts import RunFacts
from nndx.collector.watch.fed_inputs import FedInputs
from nndx.collector.watch.graph import GraphSize
from nndx.collector.watch.initial import InitialState, UnchangedParameters
from nndx.collector.watch.layers import LayerStatistics, ParameterUpdates
from nndx.collector.watch.loop import LoopCounts
from nndx.collector.watch.loss_calls import LossCalls
from nndx.collector.watch.masked import MaskedGradients
from nndx.collector.watch.recurrent import RecurrentAxes
from nndx.collector.watch.series import EffectiveLearningRate, GradientNorm, InputNorms, LearningRate, LossHistory

__all__ = [
    "LIVE_RECORDED_STEPS",
    "ClipAfterStep",
    "Deferred",
    "Desync",
    "EffectiveLearningRate",
    "ErrorGuard",
    "FedInputs",
    "GradientNorm",
    "GraphSize",
    "History",
    "InitialState",
    "InputNorms",
    "LayerStatistics",
    "LearningRate",
    "LossCalls",
    "LossHistory",
    "LoopCounts",
    "MaskedGradients",
    "ParameterUpdates",
    "RecurrentAxes",
    "RunFacts",
    "StepContext",
    "UnchangedParameters",
    "Watched",
    "Watcher",
]
