import random

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from nndx.collector.probes.label_alignment import label_alignment

STEPS = 100  # the probe's budget in these tests; enough for digits and XOR


@pytest.fixture(scope="module")
def digits():
    bunch = load_digits()
    return bunch.data, bunch.target


@pytest.mark.slow
def test_real_labels_pass_and_shuffled_labels_fail(digits):
    x, y = digits
    aligned = label_alignment(x, y, steps=STEPS)
    assert aligned.status == "passed", aligned.message
    assert aligned.real_accuracy > 0.8 and aligned.permuted_accuracy < 0.25
    assert aligned.chance_accuracy == pytest.approx(0.1) and aligned.steps == STEPS

    shuffled = label_alignment(x, np.random.default_rng(1).permutation(y), steps=STEPS)
    assert shuffled.status == "failed", shuffled.message
    assert shuffled.real_accuracy < 0.25
    assert "do not belong" in shuffled.message


def test_nonlinear_but_aligned_labels_pass():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 2))
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(np.int64)  # XOR: no linear model fits it
    result = label_alignment(x, y, steps=STEPS)
    assert result.status == "passed", result.message


def test_global_rng_and_inputs_untouched(digits):
    x, y = digits
    x_tensor, y_tensor = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    threads = torch.get_num_threads()
    first = label_alignment(x_tensor, y_tensor, steps=20, seed=3)
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state and np.array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(x_tensor, torch.from_numpy(x)) and torch.equal(y_tensor, torch.from_numpy(y))
    again = label_alignment(x_tensor, y_tensor, steps=20, seed=3)
    assert (first.real_accuracy, first.permuted_accuracy) == (again.real_accuracy, again.permuted_accuracy)


def test_encodings_and_non_finite_rows(digits):
    x, y = digits
    one_hot = label_alignment(x, np.eye(10)[y], steps=STEPS)
    assert one_hot.status == "passed"
    x_nan = x.astype(np.float64)
    x_nan[:7, 3] = np.nan
    floats = label_alignment(x_nan, y.astype(np.float32), steps=STEPS)
    assert floats.status == "passed" and "7 rows with non-finite" in floats.message


def test_skipped_when_it_cannot_judge(digits):
    x, y = digits
    tiny = label_alignment(x[:30], y[:30], steps=STEPS)
    assert tiny.status == "skipped" and "30 usable samples" in tiny.message
    single = label_alignment(x, np.zeros(len(x), dtype=np.int64), steps=STEPS)
    assert single.status == "skipped" and "one class" in single.message


def test_real_valued_targets_get_the_same_paired_test(digits):
    """Regression targets that belong to their inputs lower the held-out squared error well
    below permuted ones; the same targets shuffled separately do not."""
    x, _ = digits
    rng = np.random.default_rng(0)
    y = (x[:, 20] + x[:, 43] - x[:, 10]) / 16 + 0.1 * rng.standard_normal(len(x))
    aligned = label_alignment(x, y.astype(np.float32), steps=STEPS)
    assert aligned.status == "passed" and "squared error" in aligned.message, aligned.message
    assert aligned.real_accuracy is None  # no accuracy for real values: the message has the numbers
    shuffled = label_alignment(x, rng.permutation(y).astype(np.float32), steps=STEPS)
    assert shuffled.status == "failed" and "do not belong" in shuffled.message, shuffled.message
    two_columns = label_alignment(x, np.stack([y, -y], axis=1), steps=STEPS)
    assert two_columns.status == "passed" and "scores 2" in two_columns.message


def test_bad_input_raises(digits):
    x, y = digits
    with pytest.raises(ValueError, match="one label per input"):
        label_alignment(x, y[:-1])
    with pytest.raises(ValueError, match="steps"):
        label_alignment(x, y, steps=0)


@pytest.mark.slow
def test_small_healthy_splits_are_never_called_misaligned(digits):
    # a fixed margin called these LABELS_MISALIGNED (error); too few samples is "skipped"
    from sklearn.datasets import make_blobs

    x, y = digits
    verdicts = []
    for seed in range(4):
        rows = np.random.default_rng(seed).permutation(len(y))[:120]
        verdicts.append(label_alignment(x[rows], y[rows], steps=STEPS).status)
        bx, by = make_blobs(n_samples=200, centers=2, cluster_std=2.0, random_state=seed + 1)
        verdicts.append(label_alignment(bx, by, steps=STEPS).status)
    assert "failed" not in verdicts and "passed" in verdicts, verdicts
    # every sample is held out once: 100 aligned samples are enough to tell
    assert label_alignment(x[:100], y[:100], steps=STEPS).status == "passed"
    rare = np.flatnonzero(y[:200] != 9).tolist() + np.flatnonzero(y[:200] == 9)[:2].tolist()
    few = label_alignment(x[rare], y[rare], steps=STEPS)
    assert few.status == "skipped" and "too few samples" in few.message


def test_a_clustered_task_is_not_judged_by_the_initialisations_luck():
    # two tight clusters: an untrained network's argmax already "separates" them, so the
    # permuted-label model scores far above chance by accuracy; the verdict must not care
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-4, 1, (300, 5)), rng.normal(4, 1, (300, 5))])
    y = np.repeat([0, 1], 300)
    assert label_alignment(x, y, steps=STEPS).status == "passed"
    assert label_alignment(x, rng.permutation(y), steps=STEPS).status in ("failed", "skipped")


@pytest.mark.slow
def test_two_classes_shuffled_separately_are_judged_on_every_sample():
    """Two classes have little entropy, so the gain aligned labels would give is small and a
    held-out quarter cannot bound it: the probe holds out every sample once before it says
    it cannot tell."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=768, n_features=20, n_informative=5, class_sep=0.8, random_state=0)
    verdicts = [label_alignment(x, np.random.default_rng(seed).permutation(y), steps=STEPS, seed=seed).status
                for seed in range(3)]  # fmt: skip
    assert verdicts.count("failed") >= 2 and "passed" not in verdicts, verdicts
    assert label_alignment(x, y, steps=STEPS).status == "passed"


def _markov_windows(rng: np.random.Generator, sequences: int = 200, length: int = 16, vocab: int = 10):
    """Windows of a peaked first-order Markov chain over ``vocab`` ids and their next ids."""
    transitions = rng.dirichlet(np.full(vocab, 0.2), size=vocab)
    stream = [0]
    for _ in range(sequences * length + length):
        stream.append(int(rng.choice(vocab, p=transitions[stream[-1]])))
    stream = np.array(stream)
    starts = rng.integers(0, len(stream) - length - 1, sequences)
    windows = starts[:, None] + np.arange(length)
    return stream[windows], stream[windows + 1]


def test_token_sequences_are_judged_position_by_position():
    """Token ids with one target per position (a language model, a tagger) are read row by
    position, held out by whole sequences: next tokens pass, next tokens that belong to
    other sequences fail, ignore_index positions are left out."""
    rng = np.random.default_rng(0)
    x, y = _markov_windows(rng)
    aligned = label_alignment(torch.from_numpy(x), torch.from_numpy(y), steps=STEPS)
    assert aligned.status == "passed" and "sequences" in aligned.message, aligned.message
    shuffled = label_alignment(x, y[rng.permutation(len(y))], steps=STEPS)
    assert shuffled.status == "failed", shuffled.message
    tags = np.where(rng.random(x.shape) < 0.1, rng.integers(0, 3, x.shape), x % 3)  # a tag per token, 10% noise
    tags[:, :4] = -100  # a prompt the loss ignores
    assert label_alignment(x, tags, steps=STEPS).status == "passed"
    assert label_alignment(x, tags[rng.permutation(len(tags))], steps=STEPS).status == "failed"


def test_token_sequences_with_one_class_each_are_judged_by_their_ids():
    """A text classifier fed token ids (a Hugging Face batch's input_ids): one row per
    sequence, read as a bag of ids: labels shuffled apart fail."""
    rng = np.random.default_rng(0)
    x = rng.integers(8, 60, (600, 20))
    y = rng.integers(0, 4, 600)
    x[np.arange(600), rng.integers(0, 20, 600)] = y + 1  # a topic word
    x[:, -5:] = 0  # padding
    aligned = label_alignment(torch.from_numpy(x), torch.from_numpy(y), steps=STEPS)
    assert aligned.status == "passed" and "one row per sequence" in aligned.message, aligned.message
    assert label_alignment(x, rng.permutation(y), steps=STEPS).status == "failed"


def test_a_recommenders_user_and_item_ids_are_read_column_by_column():
    """NCF's implicit feedback: (user id, item id) rows, 1 for an item the user picked and
    0 for a sampled one. Read as one bag of ids, user 5 and item 5 were one feature and the
    healthy labels 'did not belong to their inputs'; each column's own codes show the items'
    popularity, and permuted labels still fail."""
    rng = np.random.default_rng(0)
    users, items = 64, 128
    taste, trait = rng.normal(size=(users, 4)), rng.normal(size=(items, 4))
    popularity = rng.normal(scale=0.5, size=items)
    rows, labels = [], []
    for u in range(users):
        p = np.exp(1.5 * trait @ taste[u] + popularity)
        picked = rng.choice(items, size=11, replace=False, p=p / p.sum())
        unseen = np.setdiff1d(np.arange(items), picked)
        for i in picked:
            rows += [[u, i]] + [[u, j] for j in rng.choice(unseen, size=4)]
            labels += [1.0, 0.0, 0.0, 0.0, 0.0]
    x, y = np.array(rows), np.array(labels, dtype=np.float32)
    assert label_alignment(x, y).status == "passed"
    assert label_alignment(x, rng.permutation(y)).status == "failed"


def test_categorical_fields_are_read_as_fields_before_labels_are_called_misaligned():
    """DeepFM's click log: ten categorical fields, each with ids from 0, the click driven by
    per-field effects. One bag of ids loses which field an id came from (field 3's id 5 is
    field 7's id 5), and the healthy labels 'did not belong to their inputs'."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (3000, 10))
    weight = rng.normal(scale=1.0, size=10)
    logit = sum((-1) ** j * weight[x[:, j]] for j in range(10))  # id 5 counts for in one field, against in the next
    y = (rng.random(3000) < 1 / (1 + np.exp(-(logit - logit.mean())))).astype(np.int64)
    aligned = label_alignment(torch.from_numpy(x), torch.from_numpy(y), steps=STEPS)
    assert aligned.status == "passed", aligned.message
    assert label_alignment(x, rng.permutation(y), steps=STEPS).status == "failed"
