"""Port of ethanjperez/film: visual question answering with FiLM (a GRU question encoder that
emits per-block gamma/beta, a CNN whose residual blocks' BatchNorm output is modulated by them).

Source: github.com/ethanjperez/film, ``scripts/train_model.py``, ``vr/models/filmed_net.py``,
``vr/models/film_gen.py``, ``vr/models/layers.py`` and ``scripts/train/film.sh`` at
commit fe43ddf8a22b339dcca2efa07091ce9d498955cf (CC BY-NC 4.0, Copyright 2017-present,
Facebook, Inc. and Ethan Perez). Written anew from the facts of those files; no code copied.

Kept: ``FiLMGen`` as ``film.sh`` configures it (``encoder_type gru``, ``decoder_type
linear``, unidirectional, one layer, ``parameter_efficient``, ``gamma_option linear``,
``gamma_baseline 1``, no output BN): ``Embedding`` + ``GRU(batch_first)`` from a zero state,
the hidden state taken at the last non-NULL token of each question (``before_rnn`` /
``gather``), ``decoder_linear`` to ``num_modules x 2*module_dim`` reshaped ``(N, num_modules,
2*module_dim)``, 1 added to the gamma half; ``FiLMedNet``: ``coord_map`` (two channels of x/y
in [-1, 1]), the stem of ``build_stem`` (conv + ``BatchNorm2d`` + ReLU per layer, the
coordinates concatenated to its input when its stride is 1), ``num_modules`` = 4
``FiLMedResBlock``s (``condition_method bn-film``, ``module_input_proj 1``: ``input_proj`` 1x1 conv over the
features with the coordinates concatenated + ReLU, ``conv1`` 3x3, ``BatchNorm2d(affine=False)``,
FiLM ``gamma * x + beta``, ReLU, ``x + out``), each block's output the next block's input;
``build_classifier`` (coordinates concatenated, 1x1 ``proj`` conv + BN + ReLU, ``maxpoolfull``,
``Flatten``, ``Linear`` + ``BatchNorm1d`` + ReLU, ``Linear`` to the answers); ``init_modules``
(``kaiming_uniform`` on every Conv2d and Linear weight); ``train_model.py``: two Adam optimizers
(``learning_rate 3e-4``, ``weight_decay 1e-5``), one on the FiLM generator and one on the
FiLMed network, ``CrossEntropyLoss``; per batch ``programs_pred = program_generator(questions)``,
``scores = execution_engine(feats, programs_pred)``, both optimizers' ``zero_grad``,
``backward``, both ``step``s; the running loss averaged every ``record_loss_every``; every
``checkpoint_every`` iterations ``check_accuracy`` on train and val (both models ``eval()``,
argmax accuracy, back to ``train()``) keeping the best val accuracy and its states; a
shuffled train loader (``shuffle_train_data 1``) and an unshuffled val loader.
Shrunk: a synthetic CLEVR stand-in in the form ``film.sh`` trains on, pre-extracted feature
maps (``feature_dim`` 16x4x4 instead of ResNet-101's 1024x14x14): each scene has two or three
objects (one per shape: square, circle, triangle; one of four colours) on a 4x4 floor, and the
"extractor" is a fixed random projection of each cell's colour/shape one-hot plus noise, ReLU'd;
two question families ("is there a <colour> <shape>", yes/no; "what colour is the <shape>") as
START/END-delimited, NULL-padded token sequences, 13 answers kept in the vocabulary; one
question per scene, 20,000 train / 1,000 val; ``film.sh``'s stem (1 layer, 3x3, stride 1);
``module_dim`` 16 instead of 128, ``rnn_wordvec_dim`` 32 instead of 200, ``rnn_hidden_dim`` 64 instead of 4096,
``classifier_proj_dim`` 32 instead of 512, ``classifier_fc_dims`` 32 instead of 1024; 1,000
iterations instead of 20,000,000 and so ``learning_rate`` 2e-3 instead of 3e-4 (at 3e-4 the
shrunk run ends at the question prior); ``checkpoint_every`` 250 instead of 11,000,
``record_loss_every`` 100 kept; train accuracy checked on the first 1,000 train questions; no
checkpoint files; CPU.
Measure only: the program's own val accuracy (``check_accuracy`` on the val loader at the last
checkpoint) is the metric; the best val accuracy (the checkpoint's) is returned too.

nndx, as the author would add it: the two models are called one after the other on each
batch, so the author wraps them in one ``nn.Module`` (``FiLMVQA``: the generator and the
FiLMed network as children, ``forward(questions, feats)`` -> scores) that the loop itself
calls; a preflight ``nndx.probe(model, ((questions, feats), answers), loss_fn)`` on the first
training batch (no optimizer passed: there are two), ``nndx.Monitor(model, [pg_optimizer,
ee_optimizer], loss_fn=loss_fn)`` around the iterations with the loss computed as
``mon.loss_fn``, each batch's loss logged, each checkpoint's val loss and accuracy logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` on that first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "film"
SOURCE = Source("ethanjperez/film", "scripts/train_model.py", "fe43ddf8a22b339dcca2efa07091ce9d498955cf",
                "CC-BY-NC-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (film.sh's FiLM on pre-extracted features, shrunk)"),
        Variant(
            "pg_no_zero_grad",
            "pg_optimizer.zero_grad() left out of the loop (only ee_optimizer's is called): the FiLM generator's "
            "gradients are summed over every iteration and its Adam follows the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/tientrandinh/Revisiting-Reverse-Distillation/issues/12",
             "https://github.com/IDEA-Research/DN-DETR/issues/19", "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("val_acc", "final val accuracy at least 0.08 below the healthy run's: 0.62 against 0.79 on "
                    "seed 0", lambda healthy, buggy: not buggy > healthy - 0.08),
        ),
        Variant(
            "image_idx_misaligned",
            "the train loader fetches each question's image features by an index from another shuffle than the "
            "questions' and answers' (the image_idx lookup lost): every question is trained on some other scene",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/Cyanogenoid/pytorch-vqa/issues/13",
             "https://github.com/stanfordnlp/mac-network/issues/24",
             "https://github.com/LLaVA-VL/LLaVA-NeXT/issues/168"),
            Measure("val_acc", "final val accuracy at least 0.15 below the healthy run's: 0.45 against 0.79 on "
                    "seed 0 (the question prior alone)", lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

GRID, FEAT_DIM, NUM_OBJECTS = 4, 16, (2, 3)
COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("square", "circle", "triangle")
ANSWERS = ("yes", "no", *COLOURS, *SHAPES, "0", "1", "2", "3")
WORDS = ("is", "there", "a", "what", "colour", "the", "shape", "thing", "how", "many", "things", "are", "?",
         *COLOURS, *SHAPES)  # fmt: skip
NULL, START, END = 0, 1, 2
TOKEN = {w: i + 3 for i, w in enumerate(WORDS)}
MAX_LEN = 10
N_TRAIN, N_VAL = 20000, 1000
ARGS = {"num_iterations": 1000, "batch_size": 64, "learning_rate": 2e-3, "weight_decay": 1e-5,
        "record_loss_every": 100, "checkpoint_every": 250, "module_dim": 16, "num_modules": 4,
        "rnn_wordvec_dim": 32, "rnn_hidden_dim": 64, "classifier_proj_dim": 32, "classifier_fc_dims": (32,),
        "stem_num_layers": 1}  # fmt: skip
# the frozen feature extractor's response to a colour/shape (extract_features.py's ResNet-101 conv4 maps)
_EXTRACTOR = np.random.default_rng(1234).normal(0, 1, (FEAT_DIM, len(COLOURS) + len(SHAPES) + 1)).astype(np.float32)


# --------------------------------------------------------------------------- the CLEVR stand-in


def make_scene(rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """A scene of two or three objects (one per shape, so "the <shape>" is unique) on a GRID x GRID
    floor, and its "pre-extracted" features: (FEAT_DIM, GRID, GRID), ReLU'd like conv features."""
    n = int(rng.integers(NUM_OBJECTS[0], NUM_OBJECTS[1] + 1))
    shapes = rng.choice(len(SHAPES), size=n, replace=False)
    cells = rng.choice(GRID * GRID, size=n, replace=False)
    onehot = np.zeros((GRID * GRID, len(COLOURS) + len(SHAPES) + 1), dtype=np.float32)
    onehot[:, -1] = 1.0  # the empty floor
    objects = []
    for shape, cell in zip(shapes, cells):
        colour = int(rng.integers(len(COLOURS)))
        onehot[cell] = 0.0
        onehot[cell, colour] = onehot[cell, len(COLOURS) + shape] = 1.0
        objects.append((COLOURS[colour], SHAPES[shape]))
    feats = onehot @ _EXTRACTOR.T + rng.normal(0, 0.3, (GRID * GRID, FEAT_DIM)).astype(np.float32)
    return np.maximum(feats, 0).T.reshape(FEAT_DIM, GRID, GRID), objects


def make_question(objects: list[tuple[str, str]], rng: np.random.Generator) -> tuple[list[str], str]:
    family = int(rng.integers(0, 2))
    if family == 0:
        if rng.random() < 0.5:
            colour, shape = objects[int(rng.integers(len(objects)))]
        else:
            colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        return ["is", "there", "a", colour, shape, "?"], "yes" if (colour, shape) in objects else "no"
    if family == 1:
        colour, shape = objects[int(rng.integers(len(objects)))]
        return ["what", "colour", "is", "the", shape, "?"], colour
    if family == 2:
        colours = [c for c, _ in objects]
        unique = [c for c in colours if colours.count(c) == 1]
        if unique:
            colour = unique[int(rng.integers(len(unique)))]
            return ["what", "shape", "is", "the", colour, "thing", "?"], dict(objects)[colour]
    colour = str(rng.choice(list(COLOURS)))
    return ["how", "many", colour, "things", "are", "there", "?"], str(sum(c == colour for c, _ in objects))


def make_split(n: int, rng: np.random.Generator, questions_per_image: int = 1):
    feats, questions, answers = [], [], []
    while len(questions) < n:
        img, objects = make_scene(rng)
        for _ in range(questions_per_image):
            words, answer = make_question(objects, rng)
            tokens = [START] + [TOKEN[w] for w in words] + [END]
            questions.append(tokens + [NULL] * (MAX_LEN - len(tokens)))
            answers.append(ANSWERS.index(answer))
            feats.append(img)
    feats = torch.tensor(np.stack(feats[:n]))
    return torch.tensor(questions[:n]), feats, torch.tensor(answers[:n])


# --------------------------------------------------------------------------- layers.py


def init_modules(modules) -> None:
    for m in modules:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(m.weight)


def build_stem(feature_dim: int, module_dim: int, num_layers: int) -> nn.Sequential:
    layers, prev = [], feature_dim
    for _ in range(num_layers):
        layers += [nn.Conv2d(prev, module_dim, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(module_dim),
                   nn.ReLU(inplace=True)]  # fmt: skip
        prev = module_dim
    return nn.Sequential(*layers)


def build_classifier(module_c: int, module_h: int, num_answers: int, fc_dims, proj_dim: int) -> nn.Sequential:
    layers = [nn.Conv2d(module_c, proj_dim, kernel_size=1), nn.BatchNorm2d(proj_dim), nn.ReLU(inplace=True),
              nn.MaxPool2d(kernel_size=module_h, stride=module_h), nn.Flatten()]  # maxpoolfull
    prev = proj_dim
    for nxt in fc_dims:
        layers += [nn.Linear(prev, nxt), nn.BatchNorm1d(nxt), nn.ReLU(inplace=True)]
        prev = nxt
    layers.append(nn.Linear(prev, num_answers))
    return nn.Sequential(*layers)


def coord_map(h: int, w: int) -> torch.Tensor:
    x = torch.linspace(-1, 1, w).unsqueeze(0).expand(h, w)
    y = torch.linspace(-1, 1, h).unsqueeze(1).expand(h, w)
    return torch.stack([x, y], 0)


# --------------------------------------------------------------------------- film_gen.py


class FiLMGen(nn.Module):
    def __init__(self, vocab_size: int, wordvec_dim: int, hidden_dim: int, num_modules: int, module_dim: int,
                 gamma_baseline: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        self.num_modules, self.module_dim, self.gamma_baseline = num_modules, module_dim, gamma_baseline
        self.cond_feat_size = 2 * module_dim  # parameter_efficient, one layer per module
        self.encoder_embed = nn.Embedding(vocab_size, wordvec_dim)
        self.encoder_rnn = nn.GRU(wordvec_dim, hidden_dim, 1, batch_first=True)
        self.decoder_linear = nn.Linear(hidden_dim, num_modules * self.cond_feat_size)
        init_modules(self.modules())

    def encoder(self, x: torch.Tensor) -> torch.Tensor:
        n, t = x.shape
        # the last non-NULL token of each question (before_rnn)
        nonnull = (x != NULL).long()
        idx = (nonnull * torch.arange(t)).max(1).values
        embed = self.encoder_embed(x)
        h0 = torch.zeros(1, n, self.encoder_rnn.hidden_size)
        out, _ = self.encoder_rnn(embed, h0)
        return out.gather(1, idx.view(n, 1, 1).expand(n, 1, out.size(2))).view(n, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoded = self.encoder(x)
        film = self.decoder_linear(encoded).view(x.size(0), self.num_modules, self.cond_feat_size)
        gammas, betas = film.split(self.module_dim, dim=-1)
        return torch.cat([gammas + self.gamma_baseline, betas], -1)  # gamma_option linear, gamma_shift 1


# --------------------------------------------------------------------------- filmed_net.py


class FiLMedResBlock(nn.Module):
    def __init__(self, dim: int, num_extra_channels: int = 2) -> None:
        super().__init__()
        self.input_proj = nn.Conv2d(dim + num_extra_channels, dim, kernel_size=1)
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(dim, affine=False)  # FiLM supplies the affine part
        init_modules(self.modules())

    def forward(self, x, gammas, betas, extra_channels):
        x = F.relu(self.input_proj(torch.cat([x, extra_channels], 1)))
        out = self.bn1(self.conv1(x))
        out = gammas[:, :, None, None] * out + betas[:, :, None, None]  # FiLM
        out = F.relu(out)
        return x + out


class FiLMedNet(nn.Module):
    def __init__(self, num_answers: int, feature_dim=(1024, 14, 14), module_dim: int = 128, num_modules: int = 4,
                 stem_num_layers: int = 2, proj_dim: int = 512, fc_dims=(1024,)) -> None:  # fmt: skip
        super().__init__()
        self.num_modules, self.module_dim = num_modules, module_dim
        h = feature_dim[1]  # stem stride 1
        self.register_buffer("coords", coord_map(h, h))
        self.stem = build_stem(feature_dim[0] + 2, module_dim, stem_num_layers)  # stem_use_coords
        self.blocks = nn.ModuleList(FiLMedResBlock(module_dim) for _ in range(num_modules))
        self.classifier = build_classifier(module_dim + 2, h, num_answers, fc_dims, proj_dim)
        init_modules(self.modules())

    def forward(self, x: torch.Tensor, film: torch.Tensor) -> torch.Tensor:
        gammas, betas = film.split(self.module_dim, dim=-1)
        batch_coords = self.coords.unsqueeze(0).expand(x.size(0), *self.coords.shape)
        feats = self.stem(torch.cat([x, batch_coords], 1))
        for i, block in enumerate(self.blocks):
            feats = block(feats, gammas[:, i], betas[:, i], batch_coords)
        return self.classifier(torch.cat([feats, batch_coords], 1))


class FiLMVQA(nn.Module):
    """The author's wrapper for nndx: the loop's two calls as one module."""

    def __init__(self, program_generator: FiLMGen, execution_engine: FiLMedNet) -> None:
        super().__init__()
        self.program_generator, self.execution_engine = program_generator, execution_engine

    def forward(self, questions: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        return self.execution_engine(feats, self.program_generator(questions))


# --------------------------------------------------------------------------- train_model.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    q_tr, x_tr, a_tr = make_split(N_TRAIN, rng)
    q_va, x_va, a_va = make_split(N_VAL, rng)

    program_generator = FiLMGen(len(WORDS) + 3, args["rnn_wordvec_dim"], args["rnn_hidden_dim"],
                                args["num_modules"], args["module_dim"])  # fmt: skip
    execution_engine = FiLMedNet(len(ANSWERS), feature_dim=(FEAT_DIM, GRID, GRID), module_dim=args["module_dim"],
                                 num_modules=args["num_modules"],
                                 stem_num_layers=args["stem_num_layers"], proj_dim=args["classifier_proj_dim"],
                                 fc_dims=args["classifier_fc_dims"])  # fmt: skip
    model = FiLMVQA(program_generator, execution_engine)
    pg_optimizer = torch.optim.Adam(program_generator.parameters(), lr=args["learning_rate"],
                                    weight_decay=args["weight_decay"])  # fmt: skip
    ee_optimizer = torch.optim.Adam(execution_engine.parameters(), lr=args["learning_rate"],
                                    weight_decay=args["weight_decay"])  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()

    bs = args["batch_size"]
    gen = torch.Generator().manual_seed(seed)

    def train_loader():
        order = torch.randperm(N_TRAIN, generator=gen)
        image_order = torch.randperm(N_TRAIN, generator=gen) if variant == "image_idx_misaligned" else order
        for start in range(0, N_TRAIN, bs):
            idx, image_idx = order[start : start + bs], image_order[start : start + bs]
            yield q_tr[idx], x_tr[image_idx], a_tr[idx]

    def check_accuracy(q, x, a) -> tuple[float, float]:
        model.eval()
        correct, total_loss = 0, 0.0
        with torch.no_grad():
            for start in range(0, len(a), bs):
                scores = model(q[start : start + bs], x[start : start + bs])
                correct += int((scores.argmax(1) == a[start : start + bs]).sum())
                total_loss += float(loss_fn(scores, a[start : start + bs])) * len(scores)
        model.train()
        return correct / len(a), total_loss / len(a)

    first = next(train_loader())
    probe_batch = ((first[0], first[1]), first[2])
    nx.preflight(model, probe_batch, loss_fn)
    mon = nx.monitor(model, [pg_optimizer, ee_optimizer], every=10, loss_fn=loss_fn)

    stats = {"train_losses": [], "train_accs": [], "val_accs": [], "best_val_acc": -1.0}
    best_state = None
    model.train()
    t, running_loss = 0, 0.0
    while t < args["num_iterations"]:
        for questions, feats, answers in train_loader():
            t += 1
            scores = model(questions, feats)
            loss = mon.loss_fn(scores, answers)
            if variant != "pg_no_zero_grad":
                pg_optimizer.zero_grad()
            ee_optimizer.zero_grad()
            loss.backward()
            pg_optimizer.step()
            ee_optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            running_loss += loss.item()
            if t % args["record_loss_every"] == 0:
                stats["train_losses"].append(running_loss / args["record_loss_every"])
                running_loss = 0.0
            if t % args["checkpoint_every"] == 0:
                train_acc, _ = check_accuracy(q_tr[:N_VAL], x_tr[:N_VAL], a_tr[:N_VAL])
                val_acc, val_loss = check_accuracy(q_va, x_va, a_va)
                nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc))  # noqa: B023
                stats["train_accs"].append(train_acc)
                stats["val_accs"].append(val_acc)
                if val_acc > stats["best_val_acc"]:
                    stats["best_val_acc"] = val_acc
                    best_state = copy.deepcopy(model.state_dict())
            if t == args["num_iterations"]:
                break
    del best_state
    nx.finish(mon, model, probe_batch, loss_fn)
    return {
        "val_acc": stats["val_accs"][-1],
        "best_val_acc": stats["best_val_acc"],
        "train_acc": stats["train_accs"][-1],
        "last_train_loss": stats["train_losses"][-1],
    }
