import random

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs, make_classification
from torch import nn

import nndx
from nndx.collector.probes.label_noise import label_noise


def flipped(y, share, seed=0):
    """``share`` of the labels changed to another class, chosen at random."""
    rng = np.random.default_rng(seed)
    y = y.copy()
    rows = rng.choice(len(y), int(share * len(y)), replace=False)
    y[rows] = (y[rows] + rng.integers(1, y.max() + 1, len(rows))) % (y.max() + 1)
    return y


@pytest.fixture(scope="module")
def digits():
    return load_digits(return_X_y=True)


def blobs():
    return make_blobs(n_samples=800, centers=4, cluster_std=1.5, random_state=0)


@pytest.mark.slow
@pytest.mark.parametrize("data", ["digits", "blobs"])
def test_forty_percent_of_labels_flipped_is_caught(digits, data):
    x, y = digits if data == "digits" else blobs()
    noisy = label_noise(x, flipped(y, 0.4))
    assert noisy.status == "failed", noisy.message
    assert 0.3 < noisy.noise_fraction < 0.5 and noisy.noise_lower_bound > 0.25
    clean = label_noise(x, y)
    assert clean.status == "passed" and clean.noise_fraction < 0.05, clean.message


@pytest.mark.slow
def test_a_hard_but_clean_task_is_not_label_noise():
    # a fifth of the labels disagree with the best out-of-sample prediction, because the
    # classes overlap: those disagreements are where no prediction is confident
    x, y = make_classification(n_samples=1500, n_features=10, n_informative=4, class_sep=0.5, flip_y=0.0,
                               random_state=0)  # fmt: skip
    result = label_noise(x, y)
    assert result.disagreement_fraction > 0.15
    assert result.status == "passed" and result.noise_fraction < 0.05, result.message


@pytest.mark.slow
def test_the_probe_and_its_rule_from_nndx_probe(digits):
    x, y = (torch.as_tensor(a) for a in digits)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    noisy_y = torch.as_tensor(flipped(digits[1], 0.4))
    report = nndx.probe(model, (x[:64].float(), noisy_y[:64]), nn.CrossEntropyLoss(), probes=["label_noise"],
                        data=(x.float(), noisy_y))  # fmt: skip
    assert report.probes.label_noise.status == "failed"
    codes = {f.code.value: f.severity for f in nndx.diagnose(report).findings}
    assert codes.get("LABEL_NOISE") == "error"
    clean = nndx.probe(model, (x[:64].float(), y[:64]), nn.CrossEntropyLoss(), probes=["label_noise"],
                       data=(x.float(), y))  # fmt: skip
    assert "LABEL_NOISE" not in [f.code.value for f in nndx.diagnose(clean).findings]


def test_skipped_when_it_cannot_judge(digits):
    x, y = digits
    assert label_noise(x, x[:, 20] / 16 + 0.01).status == "skipped"  # regression targets
    tiny = label_noise(x[:50], y[:50])
    assert tiny.status == "skipped" and "50 usable samples" in tiny.message


def test_global_rng_and_threads_untouched(digits):
    x, y = digits
    state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    threads = torch.get_num_threads()
    first = label_noise(x[:300], y[:300], steps=20)
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state) and torch.get_num_threads() == threads
    assert label_noise(x[:300], y[:300], steps=20).noise_fraction == first.noise_fraction  # seeded: reproducible


@pytest.mark.slow
def test_labels_unrelated_to_their_inputs_are_misaligned_not_noisy(digits):
    """Labels shuffled apart from their inputs disagree as often as random labels would
    (1 - 1/C): that is LABELS_MISALIGNED, while 40% flips stay LABEL_NOISE (above)."""
    x, y = (torch.as_tensor(a) for a in digits)
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    report = nndx.probe(model, (x[:64].float(), shuffled[:64]), nn.CrossEntropyLoss(), probes=["label_noise"],
                        data=(x.float(), shuffled), progress=False)  # fmt: skip
    (finding,) = [f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX612"]
    assert finding.code.value == "LABELS_MISALIGNED" and finding.severity == "error"


def test_token_id_inputs_are_not_judged_by_a_model_that_reads_magnitudes():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (400, 12), generator=g)
    labels = (tokens == 7).any(dim=1).long() + 2 * (tokens == 9).any(dim=1).long()  # a rule over ids
    result = label_noise(tokens, labels)
    assert result.status == "skipped" and "ids" in result.message
    pixels = label_noise(load_digits().images.astype(np.uint8), load_digits().target, steps=20)
    assert pixels.status != "skipped"  # uint8 pixels are magnitudes


def test_token_sequences_are_skipped():
    # next-token targets are uncertain by nature: their disagreement is not label noise
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (200, 16))
    assert label_noise(x, np.roll(x, -1, axis=1)).status == "skipped"


def test_outcomes_drawn_at_random_are_not_label_noise_but_flips_of_a_two_class_task_are():
    """Click-through data: a click is a Bernoulli draw whose rate the features set. The most
    confident predictions are all 'no click', and the clicks among them
    are the outcome's own randomness, which no relabelling fixes: the probe cannot judge."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 6))
    rate = 1 / (1 + np.exp(-(0.8 * x[:, 0] - 0.8)))  # 33% click; ~16% among the surest no-clicks
    clicks = (rng.random(2000) < rate).astype(np.int64)
    result = label_noise(x, clicks)
    assert result.status == "skipped" and "one class" in result.message, result.message
    # 30% of a balanced two-class task's labels flipped: confident predictions of both classes disagree
    x, y = make_blobs(n_samples=1000, centers=2, cluster_std=1.0, random_state=0)
    noisy = label_noise(x, flipped(y, 0.3))
    assert noisy.status == "failed", noisy.message
