"""Port of suragnair/alpha-zero-general on TicTacToe: self-play with MCTS, a policy + value
network trained on the games' examples, the new network pitted against the previous one.

Source: github.com/suragnair/alpha-zero-general, ``Coach.py``, ``MCTS.py``, ``Arena.py``,
``main.py``, ``othello/pytorch/NNet.py`` and ``othello/pytorch/OthelloNNet.py`` (the PyTorch
network and its wrapper), ``tictactoe/TicTacToeGame.py``, ``tictactoe/TicTacToeLogic.py`` and
``tictactoe/keras/TicTacToeNNet.py`` (the 3x3 game and how its network adapts the Othello
one), at commit f1a78e0505c614205f8c60eaa82cd644a07a84b3 (MIT). Written anew from the facts
of those files; no code copied.

Kept: the game (``Board`` with its ``pieces``, legal moves = empty squares, ``is_win`` over
rows, columns and both diagonals; ``getActionSize`` n*n + 1 with the pass move,
``getGameEnded`` 1 / -1 / 0 and 1e-4 for a draw, ``getCanonicalForm`` = player * board, the
8 rotations/reflections of ``getSymmetries`` with the pass probability kept,
``stringRepresentation`` the board's bytes); ``MCTS`` (``Qsa``, ``Nsa``, ``Ns``, ``Ps``,
``Es``, ``Vs``; ``getActionProb`` with ``numMCTSSims`` searches and the visit counts to the
power 1/temp, temp 0 an argmax with random tie-break; ``search``: terminal values, a leaf
expanded with ``nnet.predict``, its prior masked by the valid moves and renormalised (the
all-masked workaround kept), the UCB ``Q + cpuct * P * sqrt(Ns) / (1 + Nsa)``, ``-v``
returned up the path); ``Coach`` (``executeEpisode`` with ``temp = int(episodeStep <
tempThreshold)``, every symmetry stored, the outcome ``r * (-1) ** (player != curPlayer)``;
``learn``: ``numIters`` iterations of ``numEps`` self-play games, each with a fresh MCTS, the
iteration's examples in a ``deque(maxlen=maxlenOfQueue)``, the last
``numItersForTrainExamplesHistory`` iterations kept and shuffled, the network saved,
``pnet`` loaded from it, ``nnet.train``, the new MCTS player pitted against the previous one
in ``Arena.playGames(arenaCompare)`` (each starting half the games) and rejected, the old
weights loaded back, unless it wins ``updateThreshold`` of the decisive games); the PyTorch
network (OthelloNNet's layers, as the TicTacToe network adapts them to a 3x3 board: three
padded 3x3 ``Conv2d`` + ``BatchNorm2d`` + ReLU and one unpadded, ``fc1`` + ``BatchNorm1d`` +
ReLU + dropout, ``fc2`` likewise, ``fc3`` to the action logits returned through
``F.log_softmax``, ``fc4`` to the value returned through ``tanh``); ``NNetWrapper`` (a new
``optim.Adam(self.nnet.parameters())`` at each ``train`` call, ``args.epochs`` epochs of
``int(len(examples) / batch_size)`` batches drawn with ``np.random.randint`` (with
replacement), ``self.nnet.train()`` each epoch, ``loss_pi = -sum(targets * outputs) / N``,
``loss_v = sum((targets - outputs.view(-1)) ** 2) / N``, their sum back-propagated;
``predict``: ``self.nnet.eval()``, ``torch.no_grad()``, ``exp`` of the policy output).
Shrunk: ``num_channels`` 32 instead of 512, ``fc1``/``fc2`` 64/32 wide instead of 1024/512;
``numIters`` 6, ``numEps`` 12, ``arenaCompare`` 6, ``epochs`` 6 (the TicTacToe README's
experiment: 3 iterations of 25 games, 10 epochs, 25 MCTS simulations, which is kept);
checkpoints and examples kept in memory instead of files; no logging, progress bars or
``pit.py``.
Measure only (not in the program): every position reachable in TicTacToe with the player to
move (its canonical form) solved by minimax; over the non-terminal ones, the final network's
``value_mse`` against the solved value (0 for a draw) and ``optimal_prior``, the mass of the
prior that MCTS gets from ``predict`` (masked and renormalised as ``search`` does) on the
optimal moves; and 20 games of the trained MCTS player (temp 0) against a perfect player,
each side starting half: ``losses_vs_perfect``.

nndx, as the author would add it: the optimizer is created anew in every
``NNetWrapper.train`` call, so the Monitor lives there: at the first call a preflight
``nndx.probe`` on its first batch ``(boards, (target_pis, target_vs))`` with the wrapper's
own ``loss_pi + loss_v`` as ``loss_fn`` and that call's optimizer; each call's epochs inside
``nndx.Monitor(nnet, optimizer)``, every batch's total loss logged; after each call its
Monitor's report is diagnosed, after the last one with ``nndx.probe(..., monitor=mon)`` on
the first batch (the findings the author reads are the union, as in the word2vec port).
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "alpha_zero"
SOURCE = Source("suragnair/alpha-zero-general", "Coach.py", "f1a78e0505c614205f8c60eaa82cd644a07a84b3", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "Coach + MCTS + the PyTorch NNet on TicTacToe, as published (shrunk)"),
        Variant(
            "policy_head_softmax",
            "the network's policy head returns F.softmax(pi) (the Keras network's softmax head) while loss_pi "
            "still takes its output for log-probabilities and predict still exponentiates it: the policy loss "
            "-sum(pi_target * p) is no cross-entropy, and MCTS gets exp(p), a nearly flat prior",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/suragnair/alpha-zero-general/issues/282",
             "https://github.com/suragnair/alpha-zero-general/issues/214",
             "https://github.com/suragnair/alpha-zero-general/issues/45"),
            Measure("optimal_prior", "the prior mass MCTS gets on optimal moves, over every reachable position, at "
                    "least 0.1 below the healthy run's: 0.61/0.58/0.60 against 0.76/0.69/0.83 healthy on seeds 0-2 "
                    "(an untrained network: 0.58)", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "value_loss_broadcast",
            "loss_v written without outputs.view(-1): (N,) targets minus (N, 1) values broadcast to (N, N), so each "
            "value is fitted to every target of the batch, i.e. to the batch mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/RLinf/RLinf/issues/1568",
             "https://github.com/thu-ml/tianshou/pull/155",
             "https://github.com/openai/spinningup/issues/339"),
            Measure("value_mse", "the value head's squared error against the solved values, over every reachable "
                    "position, at least 0.1 above the healthy run's: 0.67/0.72/0.70 against 0.38/0.47/0.28 healthy "
                    "on seeds 0-2 (an untrained network: 0.65)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
    )
}

# main.py's args, shrunk where the docstring says
args = {
    "numIters": 6,
    "numEps": 12,
    "tempThreshold": 15,
    "updateThreshold": 0.6,
    "maxlenOfQueue": 200000,
    "numMCTSSims": 25,
    "arenaCompare": 6,
    "cpuct": 1,
    "numItersForTrainExamplesHistory": 20,
}
# othello/pytorch/NNet.py's args, shrunk
nnet_args = {"lr": 0.001, "dropout": 0.3, "epochs": 6, "batch_size": 64, "num_channels": 32, "fc1": 64, "fc2": 32}
EPS = 1e-8


# --------------------------------------------------------------------------- tictactoe/TicTacToeLogic.py, TicTacToeGame.py


class Board:
    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.pieces = [[0] * n for _ in range(n)]

    def __getitem__(self, index: int):
        return self.pieces[index]

    def get_legal_moves(self, color: int) -> list[tuple[int, int]]:
        return [(x, y) for y in range(self.n) for x in range(self.n) if self[x][y] == 0]

    def has_legal_moves(self) -> bool:
        return any(self[x][y] == 0 for y in range(self.n) for x in range(self.n))

    def is_win(self, color: int) -> bool:
        n = self.n
        for y in range(n):
            if all(self[x][y] == color for x in range(n)):
                return True
        for x in range(n):
            if all(self[x][y] == color for y in range(n)):
                return True
        if all(self[d][d] == color for d in range(n)):
            return True
        return all(self[d][n - d - 1] == color for d in range(n))

    def execute_move(self, move: tuple[int, int], color: int) -> None:
        x, y = move
        assert self[x][y] == 0
        self[x][y] = color


class TicTacToeGame:
    def __init__(self, n: int = 3) -> None:
        self.n = n

    def getInitBoard(self) -> np.ndarray:
        return np.array(Board(self.n).pieces)

    def getBoardSize(self) -> tuple[int, int]:
        return (self.n, self.n)

    def getActionSize(self) -> int:
        return self.n * self.n + 1

    def getNextState(self, board: np.ndarray, player: int, action: int) -> tuple[np.ndarray, int]:
        if action == self.n * self.n:
            return (board, -player)
        b = Board(self.n)
        b.pieces = np.copy(board)
        b.execute_move((int(action / self.n), action % self.n), player)
        return (b.pieces, -player)

    def getValidMoves(self, board: np.ndarray, player: int) -> np.ndarray:
        valids = [0] * self.getActionSize()
        b = Board(self.n)
        b.pieces = np.copy(board)
        legal = b.get_legal_moves(player)
        if len(legal) == 0:
            valids[-1] = 1
            return np.array(valids)
        for x, y in legal:
            valids[self.n * x + y] = 1
        return np.array(valids)

    def getGameEnded(self, board: np.ndarray, player: int) -> float:
        b = Board(self.n)
        b.pieces = np.copy(board)
        if b.is_win(player):
            return 1
        if b.is_win(-player):
            return -1
        if b.has_legal_moves():
            return 0
        return 1e-4

    def getCanonicalForm(self, board: np.ndarray, player: int) -> np.ndarray:
        return player * board

    def getSymmetries(self, board: np.ndarray, pi: list[float]) -> list[tuple[np.ndarray, list[float]]]:
        assert len(pi) == self.n**2 + 1
        pi_board = np.reshape(pi[:-1], (self.n, self.n))
        syms = []
        for i in range(1, 5):
            for j in (True, False):
                new_b = np.rot90(board, i)
                new_pi = np.rot90(pi_board, i)
                if j:
                    new_b = np.fliplr(new_b)
                    new_pi = np.fliplr(new_pi)
                syms.append((new_b, list(new_pi.ravel()) + [pi[-1]]))
        return syms

    def stringRepresentation(self, board: np.ndarray) -> bytes:
        return board.tobytes()  # numpy's tostring(), removed in numpy 2


# --------------------------------------------------------------------------- othello/pytorch/OthelloNNet.py (3x3)


class TicTacToeNNet(nn.Module):
    def __init__(self, game: TicTacToeGame, args: dict, softmax_head: bool = False) -> None:
        self.board_x, self.board_y = game.getBoardSize()
        self.action_size = game.getActionSize()
        self.args = args
        self.softmax_head = softmax_head
        super().__init__()
        c = args["num_channels"]
        self.conv1 = nn.Conv2d(1, c, 3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, stride=1, padding=1)
        self.conv3 = nn.Conv2d(c, c, 3, stride=1, padding=1)
        self.conv4 = nn.Conv2d(c, c, 3, stride=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.bn2 = nn.BatchNorm2d(c)
        self.bn3 = nn.BatchNorm2d(c)
        self.bn4 = nn.BatchNorm2d(c)
        self.fc1 = nn.Linear(c * (self.board_x - 2) * (self.board_y - 2), args["fc1"])
        self.fc_bn1 = nn.BatchNorm1d(args["fc1"])
        self.fc2 = nn.Linear(args["fc1"], args["fc2"])
        self.fc_bn2 = nn.BatchNorm1d(args["fc2"])
        self.fc3 = nn.Linear(args["fc2"], self.action_size)
        self.fc4 = nn.Linear(args["fc2"], 1)

    def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.args["num_channels"]
        s = s.view(-1, 1, self.board_x, self.board_y)
        s = F.relu(self.bn1(self.conv1(s)))
        s = F.relu(self.bn2(self.conv2(s)))
        s = F.relu(self.bn3(self.conv3(s)))
        s = F.relu(self.bn4(self.conv4(s)))
        s = s.view(-1, c * (self.board_x - 2) * (self.board_y - 2))
        s = F.dropout(F.relu(self.fc_bn1(self.fc1(s))), p=self.args["dropout"], training=self.training)
        s = F.dropout(F.relu(self.fc_bn2(self.fc2(s))), p=self.args["dropout"], training=self.training)
        pi = self.fc3(s)
        v = self.fc4(s)
        if self.softmax_head:  # the bug: the Keras network's softmax head
            return F.softmax(pi, dim=1), torch.tanh(v)
        return F.log_softmax(pi, dim=1), torch.tanh(v)


# --------------------------------------------------------------------------- othello/pytorch/NNet.py


class NNetWrapper:
    def __init__(self, game: TicTacToeGame, variant: str = "healthy", nx: Nndx | None = None) -> None:
        self.variant = variant
        self.nnet = TicTacToeNNet(game, nnet_args, softmax_head=variant == "policy_head_softmax")
        self.board_x, self.board_y = game.getBoardSize()
        self.action_size = game.getActionSize()
        self.nx = nx
        self.train_calls = 0
        self.losses: list[tuple[float, float]] = []
        self.probe_batch = None

    def loss_fn(self, output: tuple[torch.Tensor, torch.Tensor], targets: tuple[torch.Tensor, torch.Tensor]):
        """The author's glue for nndx: the wrapper's own total loss as loss_fn(output, target)."""
        out_pi, out_v = output
        target_pis, target_vs = targets
        return self.loss_pi(target_pis, out_pi) + self.loss_v(target_vs, out_v)

    def train(self, examples: list, last: bool = False) -> None:
        optimizer = optim.Adam(self.nnet.parameters())
        nx = self.nx
        mon = None
        self.train_calls += 1
        for epoch in range(nnet_args["epochs"]):
            self.nnet.train()
            batch_count = int(len(examples) / nnet_args["batch_size"])
            for _ in range(batch_count):
                sample_ids = np.random.randint(len(examples), size=nnet_args["batch_size"])
                boards, pis, vs = list(zip(*[examples[i] for i in sample_ids]))
                boards = torch.FloatTensor(np.array(boards).astype(np.float64))
                target_pis = torch.FloatTensor(np.array(pis))
                target_vs = torch.FloatTensor(np.array(vs).astype(np.float64))
                if nx is not None and mon is None:  # the author's nndx, at this call's first batch
                    if self.probe_batch is None:
                        self.probe_batch = (boards, (target_pis, target_vs))
                        nx.preflight(self.nnet, self.probe_batch, self.loss_fn, optimizer=optimizer)
                    mon = nx.monitor(self.nnet, optimizer, every=10)

                out_pi, out_v = self.nnet(boards)
                l_pi = self.loss_pi(target_pis, out_pi)
                l_v = self.loss_v(target_vs, out_v)
                total_loss = l_pi + l_v
                self.losses.append((l_pi.item(), l_v.item()))

                optimizer.zero_grad()
                total_loss.backward()
                optimizer.step()
                if mon is not None:
                    nx.timed(lambda: mon.log(total_loss))
        if nx is not None and mon is not None:
            if last:
                nx.finish(mon, self.nnet, self.probe_batch, self.loss_fn, optimizer=optimizer)
            else:
                nx.finish(mon)

    def predict(self, board: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        board = torch.FloatTensor(board.astype(np.float64))
        board = board.view(1, self.board_x, self.board_y)
        self.nnet.eval()
        with torch.no_grad():
            pi, v = self.nnet(board)
        return torch.exp(pi).data.numpy()[0], v.data.numpy()[0]

    def loss_pi(self, targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        return -torch.sum(targets * outputs) / targets.size()[0]

    def loss_v(self, targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        if self.variant == "value_loss_broadcast":  # the bug: (N,) - (N, 1) broadcasts to (N, N)
            return torch.sum((targets - outputs) ** 2) / targets.size()[0]
        return torch.sum((targets - outputs.view(-1)) ** 2) / targets.size()[0]

    def save_checkpoint(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.nnet.state_dict().items()}

    def load_checkpoint(self, state: dict[str, torch.Tensor]) -> None:
        self.nnet.load_state_dict(state)


# --------------------------------------------------------------------------- MCTS.py


class MCTS:
    def __init__(self, game: TicTacToeGame, nnet: NNetWrapper, args: dict) -> None:
        self.game, self.nnet, self.args = game, nnet, args
        self.Qsa: dict = {}
        self.Nsa: dict = {}
        self.Ns: dict = {}
        self.Ps: dict = {}
        self.Es: dict = {}
        self.Vs: dict = {}

    def getActionProb(self, canonicalBoard: np.ndarray, temp: float = 1) -> list[float]:
        for _ in range(self.args["numMCTSSims"]):
            self.search(canonicalBoard)
        s = self.game.stringRepresentation(canonicalBoard)
        counts = [self.Nsa.get((s, a), 0) for a in range(self.game.getActionSize())]
        if temp == 0:
            best_as = np.array(np.argwhere(counts == np.max(counts))).flatten()
            best_a = np.random.choice(best_as)
            probs = [0] * len(counts)
            probs[best_a] = 1
            return probs
        counts = [x ** (1.0 / temp) for x in counts]
        counts_sum = float(sum(counts))
        return [x / counts_sum for x in counts]

    def search(self, canonicalBoard: np.ndarray) -> float:
        s = self.game.stringRepresentation(canonicalBoard)
        if s not in self.Es:
            self.Es[s] = self.game.getGameEnded(canonicalBoard, 1)
        if self.Es[s] != 0:
            return -self.Es[s]
        if s not in self.Ps:
            self.Ps[s], v = self.nnet.predict(canonicalBoard)
            valids = self.game.getValidMoves(canonicalBoard, 1)
            self.Ps[s] = self.Ps[s] * valids
            sum_ps = np.sum(self.Ps[s])
            if sum_ps > 0:
                self.Ps[s] /= sum_ps
            else:
                self.Ps[s] = self.Ps[s] + valids
                self.Ps[s] /= np.sum(self.Ps[s])
            self.Vs[s] = valids
            self.Ns[s] = 0
            return -v
        valids = self.Vs[s]
        cur_best = -float("inf")
        best_act = -1
        for a in range(self.game.getActionSize()):
            if valids[a]:
                if (s, a) in self.Qsa:
                    u = self.Qsa[(s, a)] + self.args["cpuct"] * self.Ps[s][a] * math.sqrt(self.Ns[s]) / (
                        1 + self.Nsa[(s, a)])  # fmt: skip
                else:
                    u = self.args["cpuct"] * self.Ps[s][a] * math.sqrt(self.Ns[s] + EPS)
                if u > cur_best:
                    cur_best = u
                    best_act = a
        a = best_act
        next_s, next_player = self.game.getNextState(canonicalBoard, 1, a)
        next_s = self.game.getCanonicalForm(next_s, next_player)
        v = self.search(next_s)
        if (s, a) in self.Qsa:
            self.Qsa[(s, a)] = (self.Nsa[(s, a)] * self.Qsa[(s, a)] + v) / (self.Nsa[(s, a)] + 1)
            self.Nsa[(s, a)] += 1
        else:
            self.Qsa[(s, a)] = v
            self.Nsa[(s, a)] = 1
        self.Ns[s] += 1
        return -v


# --------------------------------------------------------------------------- Arena.py


class Arena:
    def __init__(self, player1, player2, game: TicTacToeGame) -> None:
        self.player1, self.player2, self.game = player1, player2, game

    def playGame(self) -> float:
        players = [self.player2, None, self.player1]
        cur_player = 1
        board = self.game.getInitBoard()
        while self.game.getGameEnded(board, cur_player) == 0:
            action = players[cur_player + 1](self.game.getCanonicalForm(board, cur_player))
            valids = self.game.getValidMoves(self.game.getCanonicalForm(board, cur_player), 1)
            assert valids[action] > 0
            board, cur_player = self.game.getNextState(board, cur_player, action)
        return cur_player * self.game.getGameEnded(board, cur_player)

    def playGames(self, num: int) -> tuple[int, int, int]:
        num = int(num / 2)
        one_won = two_won = draws = 0
        for _ in range(num):
            result = self.playGame()
            if result == 1:
                one_won += 1
            elif result == -1:
                two_won += 1
            else:
                draws += 1
        self.player1, self.player2 = self.player2, self.player1
        for _ in range(num):
            result = self.playGame()
            if result == -1:
                one_won += 1
            elif result == 1:
                two_won += 1
            else:
                draws += 1
        return one_won, two_won, draws


# --------------------------------------------------------------------------- Coach.py


class Coach:
    def __init__(self, game: TicTacToeGame, nnet: NNetWrapper, args: dict) -> None:
        self.game = game
        self.nnet = nnet
        self.pnet = NNetWrapper(game, nnet.variant)  # the competitor network
        self.args = args
        self.mcts = MCTS(self.game, self.nnet, self.args)
        self.trainExamplesHistory: list = []
        self.accepted = 0

    def executeEpisode(self) -> list:
        trainExamples = []
        board = self.game.getInitBoard()
        self.curPlayer = 1
        episodeStep = 0
        while True:
            episodeStep += 1
            canonicalBoard = self.game.getCanonicalForm(board, self.curPlayer)
            temp = int(episodeStep < self.args["tempThreshold"])
            pi = self.mcts.getActionProb(canonicalBoard, temp=temp)
            for b, p in self.game.getSymmetries(canonicalBoard, pi):
                trainExamples.append([b, self.curPlayer, p, None])
            action = np.random.choice(len(pi), p=pi)
            board, self.curPlayer = self.game.getNextState(board, self.curPlayer, action)
            r = self.game.getGameEnded(board, self.curPlayer)
            if r != 0:
                return [(x[0], x[2], r * ((-1) ** (x[1] != self.curPlayer))) for x in trainExamples]

    def learn(self) -> None:
        for i in range(1, self.args["numIters"] + 1):
            iterationTrainExamples: deque = deque([], maxlen=self.args["maxlenOfQueue"])
            for _ in range(self.args["numEps"]):
                self.mcts = MCTS(self.game, self.nnet, self.args)  # reset search tree
                iterationTrainExamples += self.executeEpisode()
            self.trainExamplesHistory.append(iterationTrainExamples)
            if len(self.trainExamplesHistory) > self.args["numItersForTrainExamplesHistory"]:
                self.trainExamplesHistory.pop(0)

            trainExamples = []
            for e in self.trainExamplesHistory:
                trainExamples.extend(e)
            random.shuffle(trainExamples)

            temp = self.nnet.save_checkpoint()
            self.pnet.load_checkpoint(temp)
            pmcts = MCTS(self.game, self.pnet, self.args)

            self.nnet.train(trainExamples, last=i == self.args["numIters"])
            nmcts = MCTS(self.game, self.nnet, self.args)

            arena = Arena(lambda x: np.argmax(pmcts.getActionProb(x, temp=0)),
                          lambda x: np.argmax(nmcts.getActionProb(x, temp=0)), self.game)  # fmt: skip
            pwins, nwins, draws = arena.playGames(self.args["arenaCompare"])
            if pwins + nwins == 0 or float(nwins) / (pwins + nwins) < self.args["updateThreshold"]:
                self.nnet.load_checkpoint(temp)  # REJECTING NEW MODEL
            else:
                self.accepted += 1  # ACCEPTING NEW MODEL (best.pth.tar)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    g = TicTacToeGame(3)
    nnet = NNetWrapper(g, variant, nx)
    c = Coach(g, nnet, args)
    c.learn()

    # measure only
    value_mse, optimal_prior = judge(nnet)
    losses = play_perfect(g, nnet, seed)
    late = nnet.losses[-50:]
    return {
        "value_mse": value_mse,
        "optimal_prior": optimal_prior,
        "losses_vs_perfect": float(losses),
        "accepted": float(c.accepted),
        "late_loss_pi": float(np.mean([p for p, _ in late])),
        "late_loss_v": float(np.mean([v for _, v in late])),
    }


# --------------------------------------------------------------------------- measure only


@functools.lru_cache(maxsize=1)
def solved() -> dict[bytes, tuple[np.ndarray, float, tuple[int, ...]]]:
    """Every reachable non-terminal canonical position: (board, minimax value for the player
    to move, optimal actions)."""
    g = TicTacToeGame(3)
    table: dict[bytes, tuple[np.ndarray, float, tuple[int, ...]]] = {}

    def value(board: np.ndarray) -> float:  # canonical: the player to move is +1
        key = board.tobytes()
        if key in table:
            return table[key][1]
        ended = g.getGameEnded(board, 1)
        if ended != 0:
            return round(ended)  # 1e-4 (a draw) -> 0
        best, scores = -2.0, {}
        for a in np.flatnonzero(g.getValidMoves(board, 1)[:-1]):
            nxt, player = g.getNextState(board, 1, int(a))
            scores[int(a)] = -value(g.getCanonicalForm(nxt, player))
            best = max(best, scores[int(a)])
        table[key] = (board, best, tuple(a for a, s in scores.items() if s == best))
        return best

    value(g.getInitBoard())
    return table


@torch.no_grad()
def judge(nnet: NNetWrapper) -> tuple[float, float]:
    g = TicTacToeGame(3)
    rows = list(solved().values())
    boards = torch.FloatTensor(np.array([b for b, _, _ in rows]).astype(np.float64))
    nnet.nnet.eval()
    pi, v = nnet.nnet(boards)
    priors = torch.exp(pi).numpy()  # as predict() hands them to MCTS
    errors, masses = [], []
    for (board, value, best), prior, vv in zip(rows, priors, v.view(-1).numpy()):
        p = prior * g.getValidMoves(board, 1)
        p = p / p.sum() if p.sum() > 0 else g.getValidMoves(board, 1) / g.getValidMoves(board, 1).sum()
        masses.append(float(p[list(best)].sum()))
        errors.append((float(vv) - value) ** 2)
    return float(np.mean(errors)), float(np.mean(masses))


def play_perfect(g: TicTacToeGame, nnet: NNetWrapper, seed: int, games: int = 20) -> int:
    """Games of the trained MCTS player (temp 0) against a minimax player (random among the
    optimal moves); the trained player's losses."""
    table = solved()
    rng = np.random.default_rng(seed + 99)
    with torch.random.fork_rng():
        state = np.random.get_state()
        np.random.seed(seed + 98)
        mcts = MCTS(g, nnet, args)

        def perfect(board: np.ndarray) -> int:
            return int(rng.choice(table[board.tobytes()][2]))

        def trained(board: np.ndarray) -> int:
            return int(np.argmax(mcts.getActionProb(board, temp=0)))

        one, two, _ = Arena(trained, perfect, g).playGames(games)
        np.random.set_state(state)
    return two
