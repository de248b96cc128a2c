"""The autograd graph kept alive across steps: a recurrent state carried from batch to
batch without ``.detach()`` (with ``backward(retain_graph=True)`` to silence the error)
makes every step's graph reach back through all the steps before it — memory and step
time grow until the run dies.

On recorded steps, a bounded walk from the model's outputs counts the autograd nodes
reachable from them and tags each new node with the step (``node.metadata``, which lives
and dies with the node and changes nothing autograd computes). A node found with an
earlier step's tag was kept alive from that step. Parameters' gradient accumulators are
left out: they are shared by every graph that uses the parameter, healthy or not.

A graph can also be kept alive without the next graph reaching it: ``total_loss +=
loss`` holds every step's graph in a chain no model output leads to. So each recorded
step's output nodes also carry a token object in their metadata, of which the watcher
keeps only a weak reference: the token lives exactly as long as that graph. Tokens of
recorded steps before the previous one that are still alive count as graphs kept. Whether
such a graph still holds its saved tensors (the activations) is read at the end of its step:
a backward pass frees them, so a list of loss tensors appended after ``backward()`` keeps
only the graphs' structure, while outputs kept from forwards that no backward followed keep
their activations too.

And a graph can be kept on the model itself, where no output leads: d2l's batch norm from
scratch reassigns its moving statistics each step from the batch's mean, and without
``.data`` each one holds its step's graph chained to the one before. At the end of each
recorded step the same walk starts from the tensors the model keeps beside its parameters
(buffers, plain attributes): nodes tagged at an earlier step there are a graph kept.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, NamedTuple

import torch
from torch import nn

from nndx.collector._common import iter_tensors, kept_tensors
from nndx.collector.watch.base import History, StepContext, Watcher, recorded_steps
from nndx.report import GraphPoint

_TAG = "nndx_step"
_ALIVE = "nndx_alive"


class _Token:
    """Lives as long as the graph whose node metadata holds it; ``freed``: whether a backward
    pass freed that graph's saved tensors by the end of its step (None: not known)."""

    freed: bool | None = None


class _HeldNodes(list):
    """The autograd nodes held to a step's end. A deep copy of a watched model reaches the
    watchers through its hooks, and autograd nodes cannot be copied: a copy holds none."""

    def __deepcopy__(self, memo: dict) -> _HeldNodes:
        return _HeldNodes()


class GraphRecord(NamedTuple):
    step: int
    nodes: int
    earlier_nodes: int
    truncated: bool
    older_graphs_alive: int = 0
    older_graphs_holding: int | None = None
    stored_nodes: int = 0
    stored_earlier_nodes: int = 0
    stored_holder: str | None = None


class GraphSize(Watcher):
    """Per recorded step, the largest graph behind one forward's outputs (several
    forwards in a step — a GAN's — are not added up) and its nodes from earlier steps."""

    name = "graph"
    MAX_NODES = 10_000  # bounds a walk's cost (python, per node), paid on recorded steps only
    # forwards of a recorded step whose graphs are held to the step's end (a GAN's three); a loop of
    # forwards in one step (validation with grad enabled) must not have its graphs kept alive by nndx
    HELD_FORWARDS = 4

    def __init__(self, capacity: int) -> None:
        self.history = History(capacity)
        self._current: GraphRecord | None = None
        self._tokens: deque[tuple[int, weakref.ref]] = deque(maxlen=64)  # (step, token) of recorded graphs
        self._this_step = _HeldNodes()  # (token, output nodes), held to the step's end to read what backward freed

    def on_forward_end(self, ctx: StepContext, module: nn.Module, args: tuple, output: Any) -> None:
        if not ctx.recording or not torch.is_grad_enabled():
            return
        roots = [t.grad_fn for t in iter_tensors(output) if t.grad_fn is not None]
        if not roots:
            return
        token = _Token()
        for root in roots:
            root.metadata.setdefault(_ALIVE, token)
        self._tokens.append((ctx.step, weakref.ref(token)))
        if len(self._this_step) < self.HELD_FORWARDS:
            self._this_step.append((token, roots))
        record = GraphRecord(ctx.step, *self.walk(roots, ctx.step), *self._older_alive(ctx.step))
        current = self._current
        if current is None or current.step != ctx.step:
            self._current = record
        else:
            self._current = GraphRecord(ctx.step, max(current.nodes, record.nodes),
                                        max(current.earlier_nodes, record.earlier_nodes),
                                        current.truncated or record.truncated, record.older_graphs_alive,
                                        record.older_graphs_holding)  # fmt: skip

    def _older_alive(self, step: int) -> tuple[int, int | None]:
        """Recorded steps before the previous recorded one whose graph is still alive (the
        previous one's may still be held by the user's last-batch variables), and how many of
        those still hold their saved tensors (None when that is not known for one of them)."""
        steps = sorted({s for s, _ in self._tokens if s < step})
        older = set(steps[:-1])
        alive: dict[int, list[_Token]] = {}
        for s, ref in self._tokens:
            token = ref()
            if s in older and token is not None:
                alive.setdefault(s, []).append(token)
        if any(token.freed is None for tokens in alive.values() for token in tokens):
            return len(alive), None
        return len(alive), sum(1 for tokens in alive.values() if not all(token.freed for token in tokens))

    def walk(self, roots: list[Any], step: int) -> tuple[int, int, bool]:
        """(nodes reached, nodes tagged at an earlier step, walk truncated)."""
        seen: dict[int, Any] = {}  # id -> node: holding the nodes keeps their ids unique
        stack, earlier = list(roots), 0
        while stack and len(seen) < self.MAX_NODES:
            node = stack.pop()
            if node is None or id(node) in seen or type(node).__name__ == "AccumulateGrad":
                continue
            seen[id(node)] = node
            tag = node.metadata.setdefault(_TAG, step)
            earlier += tag < step
            stack.extend(child for child, _ in node.next_functions)
        return len(seen), earlier, bool(stack)

    def on_step_end(self, ctx: StepContext) -> None:
        for token, roots in self._this_step:
            token.freed = saved_tensors_freed(roots)
        self._this_step = _HeldNodes()
        current = self._current if self._current is not None and self._current.step == ctx.step else None
        if ctx.recording:
            kept = [(name, t.grad_fn) for name, t in kept_tensors(ctx.watched.root) if t.grad_fn is not None]
            if kept:
                walks = [(name, self.walk([node], ctx.step)) for name, node in kept]
                holder = next((name for name, (_, earlier, _) in walks if earlier), kept[0][0])
                current = (current or GraphRecord(ctx.step, 0, 0, False))._replace(
                    stored_nodes=sum(w[0] for _, w in walks), stored_earlier_nodes=sum(w[1] for _, w in walks),
                    stored_holder=holder)
        if current is not None:
            self.history.append(current)
        self._current = None

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"graph_nodes_history": recorded_steps(self.history, _points, None)}}


def _points(record: GraphRecord) -> list[GraphPoint]:
    return [GraphPoint(step=record.step, nodes=record.nodes, earlier_nodes=record.earlier_nodes, truncated=record.truncated,
                       older_graphs_alive=record.older_graphs_alive, older_graphs_holding=record.older_graphs_holding,
                       stored_nodes=record.stored_nodes,
                       stored_earlier_nodes=record.stored_earlier_nodes, stored_holder=record.stored_holder)]


def saved_tensors_freed(roots: list[Any], limit: int = 32) -> bool | None:
    """Whether a backward pass freed the saved tensors of the graph below ``roots`` (reading
    one then raises); None when the first ``limit`` nodes save no tensor."""
    seen, stack = 0, list(roots)
    while stack and seen < limit:
        node = stack.pop()
        if node is None:
            continue
        seen += 1
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:
                return True
            if isinstance(value, torch.Tensor):
                return False
        stack.extend(child for child, _ in node.next_functions)
    return None
