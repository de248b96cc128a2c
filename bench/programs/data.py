"""Stand-ins for the datasets the ported programs download, made offline and small.

Nothing here downloads: images are scikit-learn's 8x8 digits (shipped with the
package), text is generated from a fixed random grammar, and the sine waves are made the
way the original ``generate_sine_wave.py`` makes them. Every generator takes a seed and
is deterministic, so a variant's healthy and buggy runs see the same data.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

# --------------------------------------------------------------------------- images


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """Loaded once per process. The first load imports scikit-learn, whose import draws from the
    global random streams: they are put back, so a program's first run in a process trains as its
    later runs do (a port's seeds come before its data)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        from sklearn.datasets import load_digits

        data = load_digits()
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    return data.images.astype(np.uint8), data.target.astype(np.int64)  # pixels 0..16


def digit_images(seed: int = 0, test_size: int = 360) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_images, train_labels, test_images, test_labels): 8x8 digits as 0..255 uint8
    pixels (N, 8, 8), the form MNIST's raw files have; shuffled once with ``seed``."""
    images, labels = _digits()
    order = np.random.default_rng(seed).permutation(len(labels))
    images = np.round(images[order].astype(np.float64) * (255.0 / 16.0)).astype(np.uint8)
    labels = labels[order]
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    return x[test_size:], y[test_size:], x[:test_size], y[:test_size]


def to_tensor(images: torch.Tensor) -> torch.Tensor:
    """torchvision's ``transforms.ToTensor`` on a batch of uint8 images: (N, 1, H, W) in [0, 1]."""
    return images.unsqueeze(1).float().div(255.0)


def upscaled(images: torch.Tensor, side: int) -> torch.Tensor:
    """``to_tensor`` on the 8x8 digits, resized (bilinear) to ``side`` x ``side`` so a port keeps
    its original's layer shapes (MNIST's 28, CIFAR-10's 32): (N, 1, side, side) in [0, 1]."""
    return torch.nn.functional.interpolate(to_tensor(images), size=(side, side), mode="bilinear",
                                           align_corners=False).clamp(0, 1)  # fmt: skip


# --------------------------------------------------------------------------- text


def _grammar(vocab: int, successors: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A sparse first-order Markov chain: each token has a few likely successors, so a
    language model has something to learn (the entropy is far below log(vocab))."""
    rng = np.random.default_rng(seed)
    nxt = np.stack([rng.choice(vocab, size=successors, replace=False) for _ in range(vocab)])
    prob = rng.dirichlet(np.full(successors, 0.7), size=vocab)
    return nxt, prob


def word_tokens(n_tokens: int, vocab: int = 48, seed: int = 0) -> torch.Tensor:
    """A token stream (int64) from the grammar: the word-language-model corpus."""
    nxt, prob = _grammar(vocab, 4, seed)
    rng = np.random.default_rng(seed + 1)
    out = np.empty(n_tokens, dtype=np.int64)
    token = 0
    for i in range(n_tokens):
        out[i] = token
        token = nxt[token, rng.choice(nxt.shape[1], p=prob[token])]
    return torch.from_numpy(out)


ONSETS = ["b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "z", "ch", "sh", "j", ""]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ie"]
CODAS = ["", "", "", "n", "l", "r", "s", "h"]


def names(count: int, seed: int = 0) -> list[str]:
    """Made-up names (2-4 syllables of onset-vowel-coda): makemore's ``names.txt``."""
    rng = np.random.default_rng(seed)
    onset_p = np.linspace(2.0, 0.5, len(ONSETS))
    onset_p /= onset_p.sum()
    words = []
    for _ in range(count):
        syllables = rng.integers(2, 5)
        word = "".join(
            ONSETS[rng.choice(len(ONSETS), p=onset_p)] + VOWELS[rng.integers(len(VOWELS))] + CODAS[rng.integers(len(CODAS))]
            for _ in range(syllables)
        )  # fmt: skip
        words.append(word[:12])
    return words


def char_text(n_words: int, seed: int = 0) -> str:
    """Character-level text: words of the name generator strung by the word grammar into
    lines (nanoGPT's shakespeare_char stand-in)."""
    lexicon = names(64, seed=seed + 7)
    tokens = word_tokens(n_words, vocab=len(lexicon), seed=seed).tolist()
    lines, line = [], []
    for i, t in enumerate(tokens):
        line.append(lexicon[t])
        if i % 9 == 8:
            lines.append(" ".join(line) + ".")
            line = []
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- sine waves


def sine_waves(n: int = 100, length: int = 1000, period: float = 20.0, seed: int = 2) -> np.ndarray:
    """``time_sequence_prediction/generate_sine_wave.py``: n shifted sine waves, float64."""
    rng = np.random.RandomState(seed)
    x = np.empty((n, length), "int64")
    x[:] = np.array(range(length)) + rng.randint(-4 * int(period), 4 * int(period), n).reshape(n, 1)
    return np.sin(x / 1.0 / period).astype("float64")
