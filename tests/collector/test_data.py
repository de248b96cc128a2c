"""check_data on a deliberately damaged copy of scikit-learn's digits, and on edge cases.

Each damage must show in its own field, and the clean (standardised, shuffled, split,
constant pixels dropped) copy must set none of them.
"""

import math
import random

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, Dataset, TensorDataset

import nndx.collector.data as data_module
from nndx.collector.data import check_data
from nndx.report import DataStats, DiagnosticReport


@pytest.fixture(scope="module")
def digits():
    """(x_train, y_train, x_test, y_test, x_raw, y_raw): clean standardised split + raw data."""
    bunch = load_digits()
    x_raw, y_raw = bunch.data, bunch.target
    order = np.random.default_rng(0).permutation(len(x_raw))
    x, y = x_raw[order], y_raw[order]
    n_train = 1350
    x_train, x_test = x[:n_train], x[n_train:]
    keep = x_train.std(axis=0) > 0  # the always-blank border pixels carry nothing
    mean, std = x_train[:, keep].mean(axis=0), x_train[:, keep].std(axis=0)
    x_train = ((x_train[:, keep] - mean) / std).astype(np.float32)
    x_test = ((x_test[:, keep] - mean) / std).astype(np.float32)
    return x_train, y[:n_train], x_test, y[n_train:], x_raw, y_raw


def damage_fields(stats: DataStats) -> list[str]:
    """Every field that reports a data problem, for the clean-copy check."""
    found = []
    if stats.train_test_overlap:
        found.append("train_test_overlap")
    for split_name in ("train", "test"):
        split = getattr(stats, split_name)
        if split is None:
            continue
        checks = {
            "input_nan_count": split.input_nan_count > 0,
            "input_inf_count": split.input_inf_count > 0,
            "label_nan_count": split.label_nan_count > 0,
            "raw_range": split.raw_range is not None,
            "duplicate_count": split.duplicate_count > 0,
            "missing_classes": bool(split.missing_classes),
            "imbalance_ratio": split.imbalance_ratio is None or split.imbalance_ratio > 10,
            "input_mean": abs(split.input_mean) > 0.5,
            "input_std": not 0.5 < split.input_std < 2,
            "label_kind": split.label_kind != "class_index",
            "zero_sample_fraction": split.zero_sample_fraction > 0,
            "label_runs_fraction": split.label_runs_fraction is None or split.label_runs_fraction > 0.5,
        }
        if split_name == "train":  # a small test split may have pixels (nearly) blank by chance
            checks["constant_features"] = bool(split.constant_features)
            checks["feature_scale_ratio"] = split.feature_scale_ratio is None or split.feature_scale_ratio > 10
        found += [f"{split_name}.{name}" for name, bad in checks.items() if bad]
    return found


def test_clean_digits_set_no_damage_field(digits):
    x_train, y_train, x_test, y_test, _, _ = digits
    stats = check_data(x_train, y_train, x_test=x_test, y_test=y_test, num_classes=10)
    assert damage_fields(stats) == []
    assert stats.train.n_samples == 1350 and stats.train.checked_samples == 1350 and not stats.train.sampled
    assert stats.train.input_shape == [61] and stats.train.input_dtype == "float32"
    assert stats.train.class_counts == {str(c): int((y_train == c).sum()) for c in range(10)}
    assert stats.train.label_runs_fraction == pytest.approx(np.mean(y_train[1:] == y_train[:-1]))


def test_nans_counted_in_inputs_and_labels(digits):
    x_train, y_train, x_test, y_test, _, _ = digits
    x = x_train.copy()
    x[[3, 10, 20], [5, 6, 7]] = np.nan
    x[40, 0] = np.inf
    y = y_train.astype(np.float64)
    y[[1, 2]] = np.nan
    stats = check_data(x, y, x_test=x_test, y_test=y_test, task="classification")
    assert stats.train.input_nan_count == 3 and stats.train.input_inf_count == 1
    assert stats.train.label_nan_count == 2
    # statistics skip non-finite values instead of becoming NaN themselves
    assert math.isfinite(stats.train.input_mean) and math.isfinite(stats.train.feature_stds[5])
    assert stats.train.feature_means[5] == pytest.approx(np.nanmean(x[:, 5]), abs=1e-5)


def test_duplicate_rows_counted_exactly(digits):
    x_train, y_train, *_ = digits
    repeats = np.random.default_rng(1).choice(len(x_train), size=50, replace=False)
    x = np.concatenate([x_train, x_train[repeats], x_train[repeats[:5]]])
    y = np.concatenate([y_train, y_train[repeats], y_train[repeats[:5]]])
    stats = check_data(x, y)
    assert stats.train.duplicate_count == 55
    assert stats.train.duplicate_fraction == pytest.approx(55 / len(x))


def test_leaked_test_rows_found(digits):
    x_train, y_train, x_test, y_test, _, _ = digits
    leaked = x_test.copy()
    leaked[:30] = x_train[100:130]
    stats = check_data(x_train, y_train, x_test=leaked, y_test=y_test)
    assert stats.train_test_overlap == 30
    assert stats.train_test_overlap_fraction == pytest.approx(30 / len(leaked))
    # float64 test rows equal to float32 train rows are still the same samples
    stats64 = check_data(x_train, y_train, x_test=leaked.astype(np.float64), y_test=y_test)
    assert stats64.train_test_overlap == 30


def test_rows_of_padding_in_both_splits_are_no_leak():
    """Knowledge tracing cuts each student's log into fixed-length rows padded with -1; a log
    of one interaction leaves a row the mask removes whole, in train and test alike. Such
    rows carry no sample: dkvmn's healthy run got DATA_LEAKAGE from 2 of them. A real
    sequence copied across is still found."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 40, size=(200, 50))
    test = rng.integers(0, 40, size=(60, 50))
    train[:5] = -1
    test[:2] = -1
    test[10] = train[20]
    stats = check_data(train, rng.integers(0, 2, 200), x_test=test, y_test=rng.integers(0, 2, 60))
    assert stats.train_test_overlap == 1


def test_a_grid_both_splits_share_with_noisy_targets_is_no_leak():
    """MorvanZhou's batch-norm tutorial: train and test inputs are two ``linspace(-7, 10)``
    grids, so both ends are in both, each with its own noisy target. The same input with a
    different real-valued target is a different sample; a regression row copied whole (input
    and target) is a leak."""
    rng = np.random.default_rng(0)
    x_train, x_test = np.linspace(-7, 10, 2000)[:, None], np.linspace(-7, 10, 200)[:, None]
    y_train = x_train**2 - 5 + rng.normal(0, 2, x_train.shape)
    y_test = x_test**2 - 5 + rng.normal(0, 2, x_test.shape)
    assert check_data(x_train, y_train, x_test=x_test, y_test=y_test).train_test_overlap == 0
    x_test[50:60], y_test[50:60] = x_train[500:510], y_train[500:510]
    assert check_data(x_train, y_train, x_test=x_test, y_test=y_test).train_test_overlap == 10


def test_duplicates_with_other_labels_are_counted_and_zeroed_rows_are_not():
    """A character model's contexts repeat with other next characters; copied rows repeat with
    their own label; zeroed rows (a failed decode) carry every label but say nothing of that."""
    rng = np.random.default_rng(0)
    contexts = rng.integers(1, 4, size=(3000, 2))
    assert check_data(contexts, rng.integers(0, 5, 3000)).train.duplicate_label_conflict > 0.5
    rows, labels = rng.normal(size=(400, 4)), rng.integers(0, 3, 400)
    copied = check_data(np.concatenate([rows, rows[:100]]), np.concatenate([labels, labels[:100]])).train
    assert copied.duplicate_fraction == pytest.approx(0.2) and copied.duplicate_label_conflict == 0.0
    rows[:60] = 0.0
    zeroed = check_data(rows, labels).train
    assert zeroed.duplicate_count == 59 and zeroed.duplicate_label_conflict == 0.0
    assert check_data(rows).train.duplicate_label_conflict is None


def _implicit_feedback(seed: int, leak_every: int = 0):
    """A recommender's (user id, item id) rows: each user's picks as 1s and 4 items drawn
    from the ones not picked as 0s; the test split holds each user's last pick and 40
    unpicked items, which the train split's sampled 0s also hit by chance. ``leak_every``:
    that many rows of train copied into test instead (a real leak)."""
    rng = np.random.default_rng(seed)
    users, items = 32, 64
    train, test = [], []
    for u in range(users):
        picked = rng.choice(items, size=9, replace=False)
        unseen = np.setdiff1d(np.arange(items), picked)
        for i in picked[:-1]:
            train += [(u, i, 1.0)] + [(u, j, 0.0) for j in rng.choice(unseen, size=4)]
        test += [(u, picked[-1], 1.0)] + [(u, j, 0.0) for j in rng.choice(unseen, size=40, replace=False)]
    train, test = np.array(train), np.array(test)
    if leak_every:
        test[::leak_every] = train[rng.choice(len(train), size=len(test[::leak_every]))]
    return train[:, :2].astype(np.int64), train[:, 2], test[:, :2].astype(np.int64), test[:, 2]


def test_ids_from_a_small_space_overlap_by_chance_and_a_leak_beyond_it_is_found():
    from nndx.rules import diagnose

    x, y, x_test, y_test = _implicit_feedback(0)
    stats = check_data(x, y, x_test=x_test, y_test=y_test)
    assert stats.input_space_size == 32 * 64
    assert stats.train_test_overlap_fraction > 0.1 and stats.train.duplicate_fraction > 0.1  # chance's doing
    codes = {f.code.value for f in diagnose(DiagnosticReport(data=stats)).findings}
    assert not codes & {"DATA_LEAKAGE", "DUPLICATE_SAMPLES"}, codes
    x, y, x_test, y_test = _implicit_feedback(0, leak_every=2)  # 72% of test rows in train; chance gives 50%
    leaked = check_data(x, y, x_test=x_test, y_test=y_test)
    assert "DATA_LEAKAGE" in {f.code.value for f in diagnose(DiagnosticReport(data=leaked)).findings}
    assert check_data(np.random.default_rng(0).normal(size=(50, 2)), np.zeros(50)).input_space_size is None


def test_raw_scale_detected(digits):
    *_, x_raw, y_raw = digits
    stats = check_data(x_raw, y_raw)
    assert stats.train.raw_range == "0-16"
    assert stats.train.input_max == 16 and stats.train.input_mean > 4
    assert stats.train.constant_features == [0, 32, 39]  # blank border pixels
    assert stats.train.feature_scale_ratio > 10
    pixels = (np.random.default_rng(0).random((64, 3, 8, 8)) * 255).round().astype(np.uint8)
    assert check_data(pixels).train.raw_range == "0-255"
    assert check_data(pixels / 255.0).train.raw_range is None


def test_removed_class_recorded_as_missing(digits):
    x_train, y_train, x_test, y_test, _, _ = digits
    keep = y_train != 3
    stats = check_data(x_train[keep], y_train[keep], x_test=x_test, y_test=y_test)
    assert stats.train.missing_classes == ["3"]
    assert stats.train.class_counts["3"] == 0 and stats.train.imbalance_ratio == math.inf
    assert stats.test.missing_classes == []
    # the top class removed from both splits: only num_classes can tell
    top = y_train != 9
    top_test = y_test != 9
    assert check_data(x_train[top], y_train[top]).train.missing_classes == []
    stats = check_data(x_train[top], y_train[top], x_test=x_test[top_test], y_test=y_test[top_test], num_classes=10)
    assert stats.train.missing_classes == ["9"] and stats.test.missing_classes == ["9"]
    assert stats.expected_num_classes == 10
    # infinite ratio survives the JSON round trip
    report = DiagnosticReport(data=stats)
    assert DiagnosticReport.model_validate_json(report.model_dump_json()).data.train.imbalance_ratio == math.inf


def test_imbalance_ratio(digits):
    x_train, y_train, *_ = digits
    keep = (y_train != 1) | (np.cumsum(y_train == 1) <= 5)  # 5 samples of class 1 left
    stats = check_data(x_train[keep], y_train[keep])
    counts = stats.train.class_counts
    assert counts["1"] == 5
    assert stats.train.imbalance_ratio == pytest.approx(max(counts.values()) / 5)
    assert stats.train.imbalance_ratio > 10


def test_sorted_by_class_gives_label_runs_near_one(digits):
    x_train, y_train, *_ = digits
    order = np.argsort(y_train, kind="stable")
    stats = check_data(x_train[order], y_train[order])
    assert stats.train.label_runs_fraction > 0.99
    assert check_data(x_train, y_train).train.label_runs_fraction < 0.2


def test_label_encodings(digits):
    x_train, y_train, *_ = digits
    assert check_data(x_train, y_train).train.label_kind == "class_index"
    floats = check_data(x_train, y_train.astype(np.float32)).train
    assert floats.label_kind == "float_integral" and floats.label_dtype == "float32"
    assert floats.class_counts["0"] == int((y_train == 0).sum())  # still read as classes
    one_hot = check_data(x_train, np.eye(10, dtype=np.float32)[y_train]).train
    assert one_hot.label_kind == "one_hot" and one_hot.class_counts == check_data(x_train, y_train).train.class_counts
    tensor = check_data(torch.from_numpy(x_train), torch.from_numpy(y_train).float()).train
    assert tensor.label_dtype == "float32" and tensor.input_dtype == "float32"


def test_regression_targets():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 4)).astype(np.float32)
    y = 1000 + 50 * rng.standard_normal(500)
    stats = check_data(x, y).train
    assert stats.label_kind == "float_continuous"
    assert stats.target_mean == pytest.approx(y.mean()) and stats.target_std == pytest.approx(y.std())
    assert stats.class_counts == {} and stats.imbalance_ratio is None and stats.label_runs_fraction is None
    assert abs(stats.target_order_correlation) < 0.2  # random order: ~1/sqrt(500)
    ordered = np.argsort(y)
    assert check_data(x[ordered], y[ordered]).train.target_order_correlation == pytest.approx(1.0)
    assert check_data(x[ordered[::-1]], y[ordered[::-1]]).train.target_order_correlation == pytest.approx(-1.0)
    # integral targets with many values are a regression too
    counts = check_data(x, rng.integers(0, 1000, 500).astype(np.float64)).train
    assert counts.label_kind == "float_integral" and counts.target_mean is not None and counts.class_counts == {}


def test_feature_statistics_match_numpy_across_chunks(monkeypatch):
    monkeypatch.setattr(data_module, "CHUNK_ELEMENTS", 700)  # many chunks of 100 rows
    rng = np.random.default_rng(0)
    scales = np.array([1e-3, 1.0, 1e3, 5.0, 0.0])
    x = (rng.standard_normal((1234, 5)) * scales + 1e4).astype(np.float64)
    stats = check_data(x).train
    np.testing.assert_allclose(stats.feature_means, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.feature_stds, x.std(axis=0), rtol=1e-6, atol=1e-9)
    assert stats.input_std == pytest.approx(x.std(), rel=1e-9)
    assert stats.constant_features == [4]
    assert stats.feature_scale_ratio == pytest.approx(x[:, 2].std() / x[:, 0].std(), rel=1e-6)


def test_images_are_measured_per_channel():
    rng = np.random.default_rng(0)
    images = rng.standard_normal((40, 3, 5, 5)).astype(np.float32)
    images[:, 1] = images[:, 1] * 10 + 7
    stats = check_data(images).train
    assert len(stats.feature_means) == 3
    assert stats.feature_means[1] == pytest.approx(images[:, 1].mean(), abs=1e-4)
    assert stats.feature_stds[1] == pytest.approx(images[:, 1].std(), rel=1e-4)
    assert stats.input_shape == [3, 5, 5]


def test_zero_samples_and_signed_zero():
    x = np.ones((10, 3), dtype=np.float32)
    x[[2, 5]] = 0.0
    x[5] = -0.0  # equal to 0.0, so row 5 repeats row 2
    stats = check_data(x).train
    assert stats.zero_sample_fraction == pytest.approx(0.2)
    assert stats.duplicate_count == 8  # 7 more ones-rows, 1 more zero-row


def test_hash_collisions_are_confirmed_byte_for_byte(monkeypatch):
    monkeypatch.setattr(data_module, "_row_hashes", lambda rows, multipliers: np.zeros(rows.shape[0], np.uint64))
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    x[9] = x[0]
    test = np.stack([x[3], [100.0, 101.0]])
    stats = check_data(x, x_test=test)
    assert stats.train.duplicate_count == 1
    assert stats.train_test_overlap == 1


class _DigitsDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        torch.rand(1)  # an "augmentation" that draws from the global RNG
        return self.x[i], int(self.y[i])


def test_dataset_sampled_with_bound_and_rng_untouched(digits):
    x_train, y_train, *_ = digits
    dataset = _DigitsDataset(x_train, y_train)
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    stats = check_data(dataset, max_samples=300, progress=False)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state and np.array_equal(np.random.get_state()[1], np_state)
    assert stats.train.sampled and stats.train.n_samples == 1350 and stats.train.checked_samples == 300
    assert sum(stats.train.class_counts.values()) == 300
    assert stats.train.label_dtype == "int64" and stats.train.label_kind == "class_index"
    full = check_data(dataset, max_samples=5000, progress=False).train
    assert not full.sampled and full.checked_samples == 1350
    assert full.class_counts == check_data(x_train, y_train).train.class_counts


def test_dataloader_sees_the_loader_order(digits):
    x_train, y_train, *_ = digits
    order = np.argsort(y_train, kind="stable")
    dataset = TensorDataset(torch.from_numpy(x_train[order]), torch.from_numpy(y_train[order]))
    state = torch.get_rng_state()
    unshuffled = check_data(DataLoader(dataset, batch_size=64), max_samples=500, progress=False).train
    shuffled = check_data(DataLoader(dataset, batch_size=64, shuffle=True), max_samples=500, progress=False).train
    assert torch.equal(torch.get_rng_state(), state)
    assert unshuffled.checked_samples == 500 and unshuffled.sampled
    assert unshuffled.label_runs_fraction > 0.95 and shuffled.label_runs_fraction < 0.3
    assert unshuffled.order_source == "loader"  # the order training sees
    assert check_data(dataset, max_samples=500, progress=False).train.order_source == "storage"
    assert check_data(x_train, y_train).train.order_source == "storage"
    unbatched = check_data(DataLoader(dataset, batch_size=None), max_samples=50, progress=False).train
    assert unbatched.checked_samples == 50 and unbatched.input_shape == [61]


def test_progress_written_to_stderr_when_asked(digits, capsys):
    x_train, y_train, *_ = digits
    check_data(_DigitsDataset(x_train, y_train), max_samples=100, progress=True)
    assert "100/100" in capsys.readouterr().err
    check_data(_DigitsDataset(x_train, y_train), max_samples=100, progress=False)
    assert capsys.readouterr().err == ""


def test_bad_input_raises_clear_errors():
    x = np.zeros((10, 3))
    with pytest.raises(ValueError, match="one label per input"):
        check_data(x, np.zeros(9))
    with pytest.raises(ValueError, match="empty"):
        check_data(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="shape"):
        check_data(x, x_test=np.zeros((4, 2)))
    with pytest.raises(TypeError, match="numeric"):
        check_data(np.array([["a"], ["b"]]))
    with pytest.raises(ValueError, match="task"):
        check_data(x, task="segmentation")
    with pytest.raises(ValueError, match="labels inside"):
        check_data(TensorDataset(torch.zeros(4, 2)), np.zeros(4))


@pytest.mark.slow
def test_damaged_digits_example_finds_every_damage(capsys):
    """End to end: check_data + label alignment + the rules, on examples/damaged_digits.py."""
    import pathlib
    import runpy

    example = pathlib.Path(__file__).parents[2] / "examples" / "damaged_digits.py"
    main = runpy.run_path(str(example), run_name="damaged_digits")["main"]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; thread hand-offs dominate on a busy machine
    try:
        assert main() == 0, capsys.readouterr().out
    finally:
        torch.set_num_threads(previous)


def test_node_ids_split_once_each_leak_by_any_overlap():
    """GraphSAGE's splits are node ids listed once each: a partition of a small space, so the
    chance reading of recommender ids (rows drawn at random repeat) does not apply. Training
    on every node, validation nodes included, is a leak; the proper split has no overlap."""
    from nndx.rules import diagnose

    rng = np.random.default_rng(0)
    nodes = rng.permutation(600)
    labels = rng.integers(0, 7, 600)
    val, train = nodes[:80], nodes[80:]
    proper = check_data(train[:, None], labels[train], x_test=val[:, None], y_test=labels[val])
    assert proper.train_test_overlap == 0
    leaked = check_data(nodes[:, None], labels[nodes], x_test=val[:, None], y_test=labels[val])
    assert leaked.input_space_size is not None and leaked.train_test_overlap_fraction == 1.0
    found = {f.code.value: f.severity for f in diagnose(DiagnosticReport(data=leaked)).findings}
    assert found.get("DATA_LEAKAGE") == "error"


def test_unlabelled_marker_is_no_class(digits):
    """Semi-supervised training (Mean Teacher) marks unlabelled samples -1 and gives the loss
    ignore_index=-1; Hugging Face uses -100. Such a marker is no class: counting it made
    1,337 unlabelled digits a class 130x larger than the labelled ones."""
    x_train, y_train, _, _, _, _ = digits
    hidden = y_train.copy()
    hidden[100:] = -1
    stats = check_data(x_train, hidden).train
    assert "-1" not in stats.class_counts and sum(stats.class_counts.values()) == 100
    assert stats.ignored_label_count == len(y_train) - 100 and stats.imbalance_ratio < 3
    hf = y_train.copy()
    hf[::2] = -100
    assert check_data(x_train, hf).train.ignored_label_count == (len(y_train) + 1) // 2
    signs = np.where(y_train < 5, -1, 1)  # a ±1 encoding: -1 is a class
    assert check_data(x_train, signs).train.class_counts.keys() == {"-1", "1"}


class WideDeep(torch.nn.Module):
    """DeepCTR-Torch's input layout: label-encoded categories (columns 0-1, ids 0..39) beside
    dense features (columns 2-3) in one float matrix; the categories are cast to indices and
    looked up, one through nn.Embedding, one through F.embedding with a field offset."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Embedding(40, 4)
        self.second = torch.nn.Parameter(torch.randn(50, 4))
        self.head = torch.nn.Linear(10, 1)

    def forward(self, x):
        a = self.first(x[:, 0].long())
        b = torch.nn.functional.embedding(x[:, 1:2].long() + 10, self.second).squeeze(1)
        return self.head(torch.cat([a, b, x[:, 2:]], dim=1))


def tabular(dense_scale: float):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (400, 2), generator=g).float()
    dense = torch.rand(400, 2, generator=g) * dense_scale
    return torch.cat([ids, dense], dim=1), torch.randint(0, 2, (400, 1), generator=g).float()


def test_category_ids_the_model_looks_up_are_not_unnormalised_inputs_and_raw_dense_features_are():
    import nndx

    codes = {}
    for scale in (1.0, 5e5):  # MinMax-scaled dense features, and the same left raw
        x, y = tabular(scale)
        report = nndx.probe(WideDeep(), (x[:64], y[:64]), torch.nn.BCEWithLogitsLoss(), data=(x, y),
                            probes=["hooks"])  # fmt: skip
        assert report.data.train.index_features == [0, 1]
        assert math.isnan(report.data.train.feature_means[0]) and report.data.train.input_max <= scale
        codes[scale] = {f.code.value for f in nndx.diagnose(report).findings}
    assert "UNNORMALIZED_INPUTS" not in codes[1.0] and "UNNORMALIZED_INPUTS" in codes[5e5]
    # check_data on its own measures every column unless told which are indices
    x, y = tabular(1.0)
    assert check_data(x, y).train.input_max == 39
    assert check_data(x, y, index_features=[0, 1]).train.input_max <= 1
    with pytest.raises(ValueError, match="index_features"):
        check_data(x, y, index_features=[4])


class TwoInputs(torch.nn.Module):
    """TabTransformer's call: model(x_categ, x_cont), category ids and continuous columns;
    given ``mean_std``, the model standardises the continuous columns itself from buffers
    (its ``continuous_mean_std``), and their raw scale is no bug."""

    def __init__(self, mean_std=None):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 3)
        self.head = torch.nn.Linear(2 * 3 + 2, 1)
        self.register_buffer("mean_std", mean_std)

    def forward(self, categories, continuous):
        if self.mean_std is not None:
            continuous = (continuous - self.mean_std[:, 0]) / self.mean_std[:, 1]
        return self.head(torch.cat([self.embedding(categories).flatten(1), continuous], dim=1))


def two_input_table(continuous_scale: float, n: int = 600):
    g = torch.Generator().manual_seed(3)
    categories = torch.randint(0, 10, (n, 2), generator=g)
    continuous = torch.randn(n, 2, generator=g)
    y = ((categories[:, 0] >= 5).float() + continuous[:, 0] > 0.5).float()[:, None]
    return (categories, continuous * continuous_scale), y


def test_a_model_of_two_inputs_has_its_data_checked_ids_apart():
    import nndx

    codes = {}
    for scale in (1.0, 5e4):  # standardised continuous columns, and an income left raw
        x, y = two_input_table(scale)
        stats = check_data(x, y)
        assert stats.train.index_features == [0, 1] and stats.train.input_max <= 5 * scale
        batch = ((x[0][:64], x[1][:64]), y[:64])
        report = nndx.probe(TwoInputs(), batch, torch.nn.BCEWithLogitsLoss(), data=(x, y), probes=["label_alignment"])
        assert not report.errors, report.errors
        assert report.probes.label_alignment.status == "passed", report.probes.label_alignment.message
        codes[scale] = {f.code.value for f in nndx.diagnose(report).findings}
    assert "UNNORMALIZED_INPUTS" not in codes[1.0] and "UNNORMALIZED_INPUTS" in codes[5e4]
    # the same raw income, standardised by the model itself: the columns are left out of the scale statistics
    (categories, continuous), y = two_input_table(5e4)
    standardising = TwoInputs(torch.stack([continuous.mean(0), continuous.std(0)], dim=1))
    report = nndx.probe(standardising, ((categories[:64], continuous[:64]), y[:64]), torch.nn.BCEWithLogitsLoss(),
                        data=((categories, continuous), y), probes=[])  # fmt: skip
    assert report.data.train.scaled_features == [2, 3] and report.data.train.input_max is None  # no column left
    assert "UNNORMALIZED_INPUTS" not in {f.code.value for f in nndx.diagnose(report).findings}
    # the labels of other rows: the small model finds nothing left to learn
    (categories, continuous), y = two_input_table(1.0, n=2400)
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    report = nndx.probe(TwoInputs(), ((categories[:64], continuous[:64]), shuffled[:64]), torch.nn.BCEWithLogitsLoss(),
                        data=((categories, continuous), shuffled), probes=["label_alignment"])  # fmt: skip
    assert report.probes.label_alignment.status == "failed", report.probes.label_alignment.message
    # the same rows as a Dataset of ((ids, continuous), label) items
    items = [((categories[i], continuous[i]), y[i]) for i in range(len(y))]
    assert check_data(items_dataset(items)).train.index_features == [0, 1]


def items_dataset(items):
    class Items(Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

    return Items()


class ScalesItsInput(torch.nn.Module):
    """An MLP that divides raw 0..255 values by 255 in its own forward (or, unscaled, does not)."""

    def __init__(self, scale: bool):
        super().__init__()
        self.scale = scale
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

    def forward(self, x):
        return self.layers(x / 255 if self.scale else x * 1.0)


def test_raw_values_the_model_divides_itself_are_no_unnormalised_inputs():
    import nndx

    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (300, 16), generator=g).float(), torch.randint(0, 3, (300,), generator=g)
    codes = {}
    for scale in (True, False):
        report = nndx.probe(ScalesItsInput(scale), (x[:64], y[:64]), torch.nn.CrossEntropyLoss(), data=(x, y),
                            probes=[])  # fmt: skip
        assert report.data.train.scaled_features == (list(range(16)) if scale else [])
        codes[scale] = {f.code.value for f in nndx.diagnose(report).findings}
    assert "UNNORMALIZED_INPUTS" not in codes[True] and "UNNORMALIZED_INPUTS" in codes[False]


class KnowledgeTracer(torch.nn.Module):
    """DKT's call: model(skills, responses), both integer, combined into one interaction id
    and looked up; the data checks are given the interaction ids as one float matrix
    (-1 padding), how the program stores them."""

    def __init__(self, skills: int = 12):
        super().__init__()
        self.skills = skills
        self.embedding = torch.nn.Embedding(2 * skills, 8)
        self.rnn = torch.nn.GRU(8, 8, batch_first=True)
        self.head = torch.nn.Linear(8, skills)

    def forward(self, skill, response):
        out, _ = self.rnn(self.embedding(skill + self.skills * response))
        return self.head(out)


def test_float_data_of_a_model_that_reads_only_integer_ids_is_not_called_unnormalised():
    import nndx

    g = torch.Generator().manual_seed(0)
    skill, response = torch.randint(0, 12, (200, 10), generator=g), torch.randint(0, 2, (200, 10), generator=g)
    x = (skill + 12 * response).float()  # 0..23, stored as floats
    y = torch.randint(0, 2, (200, 10), generator=g).float()
    loss = torch.nn.BCEWithLogitsLoss()

    def tracer_loss(out, target):
        return loss(out.gather(2, target[1].unsqueeze(2)).squeeze(2), target[0])

    batch = ((skill[:32], response[:32]), (y[:32], skill[:32]))
    report = nndx.probe(KnowledgeTracer(), batch, tracer_loss, data=(x.numpy(), y), probes=["hooks"])
    assert report.data.train.input_mean is None, report.data.train
    assert "UNNORMALIZED_INPUTS" not in {f.code.value for f in nndx.diagnose(report).findings}
    # the same float matrix read as features by a model of float inputs is measured
    report = nndx.probe(torch.nn.Linear(10, 10), (x[:32], y[:32]), loss, data=(x, y), probes=["hooks"])
    assert report.data.train.input_max == 23


def test_raw_real_images_beside_generated_ones_are_raw_pixels():
    """A GAN discriminator's batch: real digits left at 0-255 beside generated images in
    [-1, 1]. The batch as a whole is neither whole numbers nor non-negative, but its real
    half is raw pixels. Generated images beside real ones scaled to [-1, 1] are not."""
    rng = np.random.default_rng(0)
    real = rng.integers(0, 256, size=(32, 1, 8, 8)).astype(np.float32)
    fake = np.tanh(rng.normal(size=(32, 1, 8, 8))).astype(np.float32)
    batch = np.concatenate([real, fake])
    stats = check_data(batch, None).train
    assert stats.raw_range is not None and stats.raw_range.startswith("0-255")
    assert check_data(np.concatenate([real / 127.5 - 1, fake]), None).train.raw_range is None
