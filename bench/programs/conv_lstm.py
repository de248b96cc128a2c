"""Port of ndrplz's ConvLSTM_pytorch: a stacked ConvLSTM trained for next-frame prediction on
moving squares.

Source: github.com/ndrplz/ConvLSTM_pytorch, ``convlstm.py`` and ``README.md`` at commit
9f662ba24b0a38e82cf0f5208c7f4859deb85ffe (the repository's HEAD; MIT, Copyright (c) 2017
Andrea Palazzi). Written anew from the facts of those files; no code copied. The repository
is the module alone (its README's TODO lists "add example usage on a toy problem"), so the
next-frame program around it is the one its users write: the README's constructor call
(``batch_first=True``, ``bias=True``, ``return_all_layers=False``), the last layer's
per-step outputs through a 1x1 convolution and a sigmoid to the next frame, MSE, Adam.

Kept: ``ConvLSTMCell`` = one ``Conv2d`` over ``torch.cat([x, h_cur], dim=1)`` to ``4 *
hidden_dim`` channels with "same" padding (``kernel_size // 2``), split into ``i, f, o, g``
(sigmoid, sigmoid, sigmoid, tanh), ``c_next = f * c_cur + i * g``, ``h_next = o *
tanh(c_next)``; ``init_hidden`` zeros of (batch, hidden, H, W) on the weights' device;
``ConvLSTM``: the kernel-size check, ``_extend_for_multilayer`` of ``hidden_dim`` and
``kernel_size``, one cell per layer (the first layer's input ``input_dim`` channels, the
others' the previous layer's hidden channels), ``forward``: ``(t, b, c, h, w) -> (b, t, c, h,
w)`` by ``permute(1, 0, 2, 3, 4)`` unless ``batch_first``, hidden states initialised per
call from the batch size and image size (``hidden_state`` must be ``None``: stateful is
``NotImplementedError``), each layer unrolled over ``seq_len = input.size(1)`` with its
outputs stacked on ``dim=1`` as the next layer's input, ``layer_output_list`` and
``last_state_list`` (only the last layer's unless ``return_all_layers``).
Shrunk: 16x16 single-channel frames of one or two 4x4 squares moving at a constant velocity
and bouncing off the walls (a Moving-MNIST stand-in), sequences of 8 frames (7 in, each
step predicting the next); two layers of 8 hidden channels with 3x3 kernels (the README's
example: three layers of 64/64/128); 256 training sequences, batch 16, 12 epochs, Adam at
lr 1e-2 (at 1e-3 the shrunk run still predicts blank frames when it ends); 128 held-out
sequences.
Measure only (not in the program): the held-out MSE of the prediction of the last frame
(from the seven before it), as a ratio to the copy-last-frame baseline's MSE (below 1: the
model beats copying; 1: it learned to copy).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(frames in, next frames as targets) with ``criterion``, the optimizer and the data splits;
``nndx.Monitor(model, optimizer)`` around the epochs with every batch's loss logged and
each epoch's held-out loss logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "conv_lstm"
SOURCE = Source("ndrplz/ConvLSTM_pytorch", "convlstm.py", "9f662ba24b0a38e82cf0f5208c7f4859deb85ffe", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the README's ConvLSTM (batch_first=True) predicting the next frame"),
        Variant(
            "batch_first_omitted",
            "ConvLSTM(...) built without batch_first=True (the default is False) and fed (B, T, C, H, W): the "
            "batch is unrolled as time and the time steps are the batch, and the (T, B, ...) outputs are viewed "
            "back as (B, T, ...), so each prediction is scored against another sequence's frame",
            (C.WRONG_RESHAPE, C.LABELS_MISALIGNED),
            ("https://github.com/ywchao/image-play/issues/2",
             "https://github.com/ndrplz/ConvLSTM_pytorch/pull/22",
             "https://github.com/kamo-naoyuki/pytorch_convolutional_rnn/issues/1",
             "https://github.com/automan000/Convolutional_LSTM_PyTorch/issues/13"),
            Measure("mse_vs_copy", "held-out last-frame MSE / copy-last-frame MSE at least 0.15 above the healthy "
                    "run's: 0.78 against 0.55 on seed 0 (the train loss stays at 0.083 against 0.058)",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
        Variant(
            "target_not_shifted",
            "the targets sliced as frames[:, :-1] (the input frames themselves) instead of frames[:, 1:]: the "
            "model is trained to reproduce the frame it has just seen, not to predict the next one",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/coxlab/prednet/issues/30",
             "https://github.com/thuml/predrnn-pytorch/issues/16",
             "https://github.com/coxlab/prednet/issues/57"),
            Measure("mse_vs_copy", "held-out last-frame MSE / copy-last-frame MSE at least 0.15 above the healthy "
                    "run's: 0.93 against 0.55 on seed 0 (while its own train loss falls to 0.002)",
                    lambda healthy, buggy: not buggy < healthy + 0.15),
        ),
    )
}

SIZE, FRAMES, SQUARE = 16, 8, 4
N_TRAIN, N_VAL, BATCH, EPOCHS, LR = 256, 128, 16, 12, 1e-2
HIDDEN, LAYERS = 8, 2


# --------------------------------------------------------------------------- the data


def moving_squares(n: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, FRAMES, 1, SIZE, SIZE) in {0, 1}: one or two squares, constant velocity, bouncing."""
    out = np.zeros((n, FRAMES, 1, SIZE, SIZE), dtype=np.float32)
    for k in range(n):
        for _ in range(rng.integers(1, 3)):
            pos = rng.integers(0, SIZE - SQUARE + 1, size=2)
            vel = rng.choice([-2, -1, 1, 2], size=2)
            for t in range(FRAMES):
                out[k, t, 0, pos[0] : pos[0] + SQUARE, pos[1] : pos[1] + SQUARE] = 1.0
                for d in range(2):
                    nxt = pos[d] + vel[d]
                    if nxt < 0 or nxt > SIZE - SQUARE:
                        vel[d] = -vel[d]
                        nxt = pos[d] + vel[d]
                    pos[d] = nxt
    return torch.from_numpy(out)


# --------------------------------------------------------------------------- convlstm.py


class ConvLSTMCell(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, kernel_size: tuple[int, int], bias: bool) -> None:
        super().__init__()
        self.input_dim, self.hidden_dim = input_dim, hidden_dim
        self.kernel_size = kernel_size
        self.padding = kernel_size[0] // 2, kernel_size[1] // 2
        self.bias = bias
        self.conv = nn.Conv2d(self.input_dim + self.hidden_dim, 4 * self.hidden_dim, self.kernel_size,
                              padding=self.padding, bias=self.bias)  # fmt: skip

    def forward(self, input_tensor: torch.Tensor, cur_state):
        h_cur, c_cur = cur_state
        gates = self.conv(torch.cat([input_tensor, h_cur], dim=1))  # along the channels
        cc_i, cc_f, cc_o, cc_g = torch.split(gates, self.hidden_dim, dim=1)
        i, f, o, g = torch.sigmoid(cc_i), torch.sigmoid(cc_f), torch.sigmoid(cc_o), torch.tanh(cc_g)
        c_next = f * c_cur + i * g
        return o * torch.tanh(c_next), c_next

    def init_hidden(self, batch_size: int, image_size: tuple[int, int]):
        height, width = image_size
        device = self.conv.weight.device
        return (torch.zeros(batch_size, self.hidden_dim, height, width, device=device),
                torch.zeros(batch_size, self.hidden_dim, height, width, device=device))  # fmt: skip


class ConvLSTM(nn.Module):
    """Input (B, T, C, H, W) when batch_first, else (T, B, C, H, W); returns (layer_output_list,
    last_state_list), each the last layer's only unless return_all_layers."""

    def __init__(self, input_dim: int, hidden_dim, kernel_size, num_layers: int, batch_first: bool = False,
                 bias: bool = True, return_all_layers: bool = False) -> None:  # fmt: skip
        super().__init__()
        self._check_kernel_size_consistency(kernel_size)
        kernel_size = self._extend_for_multilayer(kernel_size, num_layers)
        hidden_dim = self._extend_for_multilayer(hidden_dim, num_layers)
        if not len(kernel_size) == len(hidden_dim) == num_layers:
            raise ValueError("Inconsistent list length.")
        self.input_dim, self.hidden_dim, self.kernel_size = input_dim, hidden_dim, kernel_size
        self.num_layers, self.batch_first, self.bias = num_layers, batch_first, bias
        self.return_all_layers = return_all_layers
        self.cell_list = nn.ModuleList([
            ConvLSTMCell(self.input_dim if i == 0 else self.hidden_dim[i - 1], self.hidden_dim[i],
                         self.kernel_size[i], self.bias)
            for i in range(self.num_layers)
        ])  # fmt: skip

    def forward(self, input_tensor: torch.Tensor, hidden_state=None):
        if not self.batch_first:
            input_tensor = input_tensor.permute(1, 0, 2, 3, 4)  # (t, b, ...) -> (b, t, ...)
        b, _, _, h, w = input_tensor.size()
        if hidden_state is not None:
            raise NotImplementedError()  # stateful: not implemented
        hidden_state = self._init_hidden(batch_size=b, image_size=(h, w))

        layer_output_list, last_state_list = [], []
        seq_len = input_tensor.size(1)
        cur_layer_input = input_tensor
        for layer_idx in range(self.num_layers):
            h_t, c_t = hidden_state[layer_idx]
            output_inner = []
            for t in range(seq_len):
                h_t, c_t = self.cell_list[layer_idx](cur_layer_input[:, t, :, :, :], [h_t, c_t])
                output_inner.append(h_t)
            layer_output = torch.stack(output_inner, dim=1)
            cur_layer_input = layer_output
            layer_output_list.append(layer_output)
            last_state_list.append([h_t, c_t])
        if not self.return_all_layers:
            layer_output_list, last_state_list = layer_output_list[-1:], last_state_list[-1:]
        return layer_output_list, last_state_list

    def _init_hidden(self, batch_size: int, image_size: tuple[int, int]):
        return [self.cell_list[i].init_hidden(batch_size, image_size) for i in range(self.num_layers)]

    @staticmethod
    def _check_kernel_size_consistency(kernel_size) -> None:
        if not (isinstance(kernel_size, tuple)
                or (isinstance(kernel_size, list) and all(isinstance(e, tuple) for e in kernel_size))):  # fmt: skip
            raise ValueError("`kernel_size` must be tuple or list of tuples")

    @staticmethod
    def _extend_for_multilayer(param, num_layers: int):
        return param if isinstance(param, list) else [param] * num_layers


# --------------------------------------------------------------------------- the next-frame program


class NextFrame(nn.Module):
    """ConvLSTM, then the last layer's output at every step through a 1x1 conv + sigmoid."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.convlstm = ConvLSTM(input_dim=1, hidden_dim=HIDDEN, kernel_size=(3, 3), num_layers=LAYERS,
                                 batch_first=batch_first, bias=True, return_all_layers=False)  # fmt: skip
        self.head = nn.Conv2d(HIDDEN, 1, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c, h, w = x.shape
        layer_output_list, _ = self.convlstm(x)
        out = layer_output_list[0]
        frames = torch.sigmoid(self.head(out.reshape(b * t, HIDDEN, h, w)))
        return frames.view(b, t, c, h, w)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_seq, val_seq = moving_squares(N_TRAIN, rng), moving_squares(N_VAL, rng)

    def split(seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = seq[:, :-1]
        targets = seq[:, :-1] if variant == "target_not_shifted" else seq[:, 1:]
        return inputs, targets

    x_train, y_train = split(train_seq)
    x_val, y_val = split(val_seq)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=BATCH,
                                         shuffle=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip

    model = NextFrame(batch_first=variant != "batch_first_omitted")
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    first_batch = (x_train[:BATCH], y_train[:BATCH])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=(x_train, y_train, x_val, y_val))
    mon = nx.monitor(model, optimizer, every=5)

    train_loss = val_loss = float("nan")
    for _epoch in range(EPOCHS):
        model.train()
        total = 0.0
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            total += loss.item()
        train_loss = total / len(loader)
        model.eval()
        with torch.no_grad():
            val_loss = criterion(model(x_val), y_val).item()
        mon.log(val_loss, split="val")

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=(x_train, y_train, x_val, y_val))

    # measure only: the last frame predicted from the seven before it, against copying the seventh
    with torch.no_grad():
        pred_last = model(val_seq[:, :-1])[:, -1]
    truth, last_seen = val_seq[:, -1], val_seq[:, -2]
    model_mse = float(((pred_last - truth) ** 2).mean())
    copy_mse = float(((last_seen - truth) ** 2).mean())
    return {"mse_vs_copy": model_mse / copy_mse, "heldout_last_mse": model_mse, "copy_last_mse": copy_mse,
            "train_loss": train_loss, "val_loss": val_loss}  # fmt: skip
