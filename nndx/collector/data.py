"""Data checks: what is wrong with the data before any model sees it.

How to use::

    stats = check_data(x_train, y_train, x_test=x_val, y_test=y_val)   # -> DataStats
    stats = check_data(train_dataset)        # a Dataset or DataLoader: a bounded sample
    report.data = stats                       # the rules read it (NAN_IN_DATA, DATA_LEAKAGE, ...)

Inputs may be numpy arrays, torch tensors, nested lists, or a
``torch.utils.data.Dataset``/``DataLoader`` (then ``y`` is None: labels are read from
its ``(input, label)`` items). Arrays are checked completely; a Dataset or DataLoader is
read up to ``max_samples`` items (``sampled=True`` in the result), because reading an
item may run arbitrary decoding and augmentation code.

What is measured, per split (see ``SplitStats``):

- NaN/Inf counts in inputs and labels; overall and per-feature mean/std/min/max, per
  channel for inputs shaped ``N×C×...`` (torch's convention), the ratio of the largest
  to the smallest non-zero feature std, constant features, and ``raw_range`` when the
  inputs are integral and non-negative with a maximum of at least 10 (``"0-255"`` for raw
  pixels, ``"0-16"`` for the digits) — float data, or uint8; other integer dtypes are
  ids/tokens that cannot reach a Linear layer unconverted.
- Labels (one per sample: class indices, one-hot rows, float targets): dtype and
  encoding (``label_kind``), class counts with the imbalance ratio,
  classes that are expected but absent (``num_classes``, a gap in the integer label range,
  or a class present only in the other split: their count is 0 and the ratio infinite),
  ``label_runs_fraction`` (1.0 when sorted by class, about 1/C when shuffled),
  regression target mean/std and ``target_order_correlation`` (±1 when sorted by target);
  ``order_source`` says whose order that is: a DataLoader's (what training sees) or the
  storage order of arrays and Datasets, which a shuffling loader changes.
- Exact duplicate rows and the train/test overlap, found by a vectorised hash of each
  row's bytes and then confirmed byte for byte, so the counts are exact and the cost is
  O(n log n), not O(n²). ``-0.0`` and ``0.0`` count as equal. A test row of one value
  repeated (all padding) is no leaked sample.

Everything is computed in chunks of rows with float64 accumulators, so memory stays at a
few tens of MiB above the input and 1,000,000 × 100 float32 rows take a few seconds
(bench/data_check.py).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from nndx.collector.progress import progress_bar, wanted
from nndx.report import DataStats, SplitStats

__all__ = ["DEFAULT_MAX_SAMPLES", "check_data", "sample_arrays"]

DEFAULT_MAX_SAMPLES = 10_000
# Integral non-negative inputs whose maximum reaches this are reported as a raw range.
RAW_RANGE_MIN_MAX = 10
# images of which this share is raw pixels make a raw batch though the rest is not: a GAN discriminator's
# batch of real images beside generated ones (in [-1, 1]), the real ones left at 0-255
RAW_SHARE, RAW_SAMPLE_ROWS = 0.25, 64
# Float labels with integral values and at most this many distinct values are taken as
# classes (a LABEL_DTYPE smell) when the task is not given.
MAX_INFERRED_CLASSES = 20
# Per-feature lists are kept in the report up to this many features (the scalars derived
# from them always use every feature).
MAX_LISTED_FEATURES = 1024
# Elements per processing chunk: big enough for numpy to be efficient, small enough to
# keep the temporaries at a few tens of MiB.
CHUNK_ELEMENTS = 2_000_000
_AUTO_PROGRESS_ITEMS = 2_000
_AUTO_PROGRESS_ELEMENTS = 20_000_000

Task = Literal["classification", "regression"]


# --------------------------------------------------------------------------- public


def check_data(
    x: Any,
    y: Any = None,
    *,
    x_test: Any = None,
    y_test: Any = None,
    task: Task | None = None,
    num_classes: int | None = None,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
    progress: bool | None = None,
    index_features: Sequence[int] = (),
    scaled_features: Sequence[int] = (),
    label_positions: bool = False,
) -> DataStats:
    """Measure a training split (and optionally a test/validation split) for the data
    bugs that crash nothing: NaNs, unnormalised inputs, float or one-hot labels, class
    imbalance, duplicates, train/test leakage, class-sorted order.

    ``index_features``: columns of a 2-D float ``x`` that the model reads as indices
    (label-encoded categories looked up in an embedding); they are left out of the input
    scale statistics (``nndx.probe`` finds them in the model's forward). So are
    ``scaled_features``, columns the model standardises itself (a stored mean and std
    applied in ``forward``): their raw scale is no bug.

    ``label_positions``: the integer labels point at positions of each input sequence (an
    extractive QA model's answer starts, a pointer network's targets; ``nndx.probe`` sees one
    logit per input token): they are no classes, so no class counts and none missing.

    ``task`` ("classification"/"regression") is inferred from the labels when None.
    ``num_classes`` is the number of classes the model predicts; classes in
    ``range(num_classes)`` with no sample are recorded as missing. ``max_samples`` and
    ``seed`` bound and seed the sample read from a Dataset/DataLoader (the global RNGs
    are left as they were). ``progress`` shows a progress bar on stderr (None: for large
    data, when stderr is a terminal or in a notebook; see nndx.collector.progress).

    Raises ValueError/TypeError for inputs that cannot be checked (empty, non-numeric,
    labels of another length, test samples of another shape).
    """
    if task not in (None, "classification", "regression"):
        raise ValueError(f"task must be 'classification', 'regression' or None, not {task!r}")
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes must be a positive int, not {num_classes!r}")
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, not {max_samples}")
    if y_test is not None and x_test is None:
        raise ValueError("y_test given without x_test")

    train = _load_split(x, y, "train", max_samples, seed, progress)
    test = _load_split(x_test, y_test, "test", max_samples, seed, progress) if x_test is not None else None
    if test is not None and test.x.shape[1:] != train.x.shape[1:]:
        raise ValueError(
            f"x_test samples have shape {list(test.x.shape[1:])}, x samples {list(train.x.shape[1:])}"
        )
    hash_dtype = train.x.dtype if test is None else np.result_type(train.x.dtype, test.x.dtype)

    index_features = sorted({int(c) for c in index_features} | set(train.index_columns))
    scaled_features = sorted({int(c) for c in scaled_features} - set(index_features))
    for name, columns in (("index_features", index_features), ("scaled_features", scaled_features)):
        if columns and (train.x.ndim != 2 or not 0 <= columns[0] <= columns[-1] < train.x.shape[1]):
            raise ValueError(f"{name} {columns} are not columns of samples of shape {list(train.x.shape[1:])}")
    train_result = _check_split(train, hash_dtype, task, progress, index_features, scaled_features, num_classes)
    if task is None:
        task = train_result.labels.task if train_result.labels is not None else None
    test_result = (_check_split(test, hash_dtype, task, progress, index_features, scaled_features, num_classes)
                   if test is not None else None)  # fmt: skip

    # Classes seen in one split are expected in the other; num_classes in both.
    results = [r for r in (train_result, test_result) if r is not None]
    classification = [r.labels for r in results if r.labels is not None and r.labels.classes is not None]
    if label_positions:
        for labels in classification:
            labels.counts, labels.missing = {}, []
    elif task == "classification" or (task is None and classification):
        all_seen = set().union(*(lab.classes for lab in classification)) if classification else set()
        for labels in classification:
            expected = set(all_seen)
            if num_classes is not None:
                expected |= {str(c) for c in range(num_classes)}
            labels.finish_classes(expected)

    overlap = 0
    if test_result is not None:
        overlap = _count_overlap(train_result.rows, test_result.rows, *_real_targets(train_result, test_result))
    return DataStats(
        train=train_result.to_split_stats(),
        test=test_result.to_split_stats() if test_result is not None else None,
        train_test_overlap=overlap,
        train_test_overlap_fraction=overlap / test_result.rows.n if test_result is not None else 0.0,
        input_space_size=_input_space([r.rows.x2d for r in results]),
        expected_num_classes=num_classes,
    )


MAX_SPACE = 1e12  # a larger space of possible rows makes chance repeats negligible at any data size


def _input_space(splits: list[np.ndarray]) -> float | None:
    """The number of distinct rows the values seen per feature allow, when every feature
    holds integers (a recommender's user and item ids, codes, counts): the product of each
    feature's distinct values over the splits; None for non-integral inputs or over MAX_SPACE."""
    rows = [x.reshape(x.shape[0], -1) for x in splits]
    if rows[0].shape[1] > math.log2(MAX_SPACE):  # two values per feature already exceed it: no copy of images
        return None
    joined = np.concatenate(rows)
    if joined.size == 0:
        return None
    if joined.dtype.kind == "f" and not (np.isfinite(joined).all() and np.array_equal(joined, np.floor(joined))):
        return None
    if joined.dtype.kind not in "biuf":
        return None
    log_size = sum(math.log10(np.unique(column).size) for column in joined.T)
    return None if log_size > math.log10(MAX_SPACE) else float(round(10**log_size))


# --------------------------------------------------------------------------- loading


@dataclass
class _Split:
    name: str
    x: np.ndarray
    y: np.ndarray | None
    x_dtype: str
    y_dtype: str | None
    n_samples: int
    sampled: bool
    order: str = "storage"  # "loader": the order a DataLoader yields, the order training sees
    index_columns: list[int] = field(default_factory=list)  # the id columns of a multi-input model's inputs


def sample_arrays(source: Any, *, max_samples: int = DEFAULT_MAX_SAMPLES, seed: int = 0,
                  name: str = "train") -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """``(inputs, labels)`` as arrays: a bounded sample of a Dataset or DataLoader of
    ``(input, label)`` items, read as :func:`check_data` reads it (the global RNGs and
    the loader's own generator are left as they were). How a framework callback gives
    the data probes what ``nndx.probe(..., data=...)`` would."""
    kind = _torch_data_kind(source)
    if kind is None:
        raise TypeError(f"{name}: expected a torch Dataset or DataLoader, got {type(source).__name__}")
    split = _sample_torch_data(source, kind, name, max_samples, seed, progress=False)
    return split.x, split.y


def _load_split(x: Any, y: Any, name: str, max_samples: int, seed: int, progress: bool | None) -> _Split:
    kind = _torch_data_kind(x)
    if kind is not None:
        if y is not None:
            raise ValueError(f"{name}: pass labels inside the {kind} items, not as a separate argument")
        return _sample_torch_data(x, kind, name, max_samples, seed, progress)
    ya, y_dtype = (None, None) if y is None else _as_array(y, f"{name} labels")
    xa, x_dtype, ids = as_inputs(x, f"{name} inputs", ya.shape[0] if ya is not None and ya.ndim else None)
    if xa.ndim == 0 or xa.shape[0] == 0:
        raise ValueError(f"{name} inputs are empty (shape {list(xa.shape)})")
    if ya is not None and (ya.ndim == 0 or ya.shape[0] != xa.shape[0]):
        raise ValueError(
            f"{name}: {xa.shape[0]} inputs but labels of shape {list(ya.shape)}; they must have one label per input"
        )
    return _Split(name, xa, ya, x_dtype, y_dtype, xa.shape[0], False, index_columns=ids)


def as_inputs(x: Any, what: str, samples: int | None = None) -> tuple[np.ndarray, str, list[int]]:
    """The inputs as one array, its original dtype name, and the columns that hold ids.

    A model of several inputs takes a tuple of tensors with one row each per sample
    (TabTransformer's category ids and continuous columns, a wide-and-deep model's two
    parts): they are read as one row per sample, each input flattened and their columns
    side by side, and the columns of the signed integer inputs (category or token ids)
    returned as index columns, which the scale statistics leave out. ``samples``: the
    number of labels, which tells such a tuple from a list of per-sample rows."""
    parts = _input_parts(x, samples)
    if parts is None:
        array, dtype_name = _as_array(x, what)
        return array, dtype_name, []
    arrays = [_as_array(part, f"{what} {i}") for i, part in enumerate(parts)]
    rows = [array.reshape(array.shape[0], -1) for array, _ in arrays]
    ids = [array.dtype.kind == "i" for array, _ in arrays]
    floats = [name for (array, name), is_id in zip(arrays, ids) if not is_id]
    dtype = np.float64 if any(array.dtype == np.float64 for array, _ in arrays) else np.float32
    columns, start = [], 0
    for row, is_id in zip(rows, ids):
        if is_id:
            columns += range(start, start + row.shape[1])
        start += row.shape[1]
    if not floats:  # ids only (a two-tower model's user and item): one integer row per sample
        return np.concatenate(rows, axis=1), arrays[0][1], []
    return np.concatenate([row.astype(dtype) for row in rows], axis=1), floats[0], columns


def _input_parts(x: Any, samples: int | None) -> list[Any] | None:
    """The inputs of a multi-input model, or None: a tuple or list of two or more arrays
    or tensors of one length, which is the number of labels (or, without labels, a tuple)
    and not the number of parts."""
    torch = sys.modules.get("torch")
    kinds = (np.ndarray,) + ((torch.Tensor,) if torch is not None else ())
    if not isinstance(x, (tuple, list)) or len(x) < 2 or not all(isinstance(p, kinds) and p.ndim >= 1 for p in x):
        return None
    length = int(x[0].shape[0])
    if any(int(p.shape[0]) != length for p in x) or length == len(x):
        return None
    return list(x) if (samples == length or (samples is None and isinstance(x, tuple))) else None


def _as_array(value: Any, what: str) -> tuple[np.ndarray, str]:
    """A numpy view of ``value`` (no copy where possible) and its original dtype name."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        dtype_name = str(value.dtype).removeprefix("torch.")
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()  # numpy has no bfloat16
        array = tensor.numpy()
    else:
        array = np.asarray(value)
        dtype_name = array.dtype.name
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be numeric (bool, int or float), got dtype {array.dtype}")
    return array, dtype_name


def _torch_data_kind(x: Any) -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None  # nothing can be a torch Dataset if torch was never imported
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(x, DataLoader):
        return "DataLoader"
    if isinstance(x, IterableDataset):
        return "IterableDataset"
    if isinstance(x, Dataset):
        return "Dataset"
    return None


def _sample_torch_data(
    source: Any, kind: str, name: str, max_samples: int, seed: int, progress: bool | None
) -> _Split:
    try:
        total: int | None = len(source.dataset if kind == "DataLoader" else source)
    except TypeError:
        total = None  # an iterable dataset without __len__
    target = min(total, max_samples) if total is not None else max_samples
    show = progress if progress is not None else (wanted(None) and target > _AUTO_PROGRESS_ITEMS)
    bar = progress_bar(total=target, desc=f"nndx check_data: reading {name}", progress=show, unit="sample")
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    x_dtype = y_dtype = None
    index_columns: list[int] = []
    read = 0
    stopped_early = False
    # reading items (augmentations) or a shuffling DataLoader draws from the global RNGs:
    # put them back, so that checking data never changes the user's random stream. Imported
    # here: check_data on arrays never loads torch.
    from nndx.collector._common import loader_generators, preserved_rng

    with preserved_rng(*loader_generators(source)):
        if kind == "Dataset":
            assert total is not None
            if total > max_samples:
                # sorted, so that the order check still sees the dataset's own order
                indices = np.sort(np.random.default_rng(seed).choice(total, size=max_samples, replace=False))
            else:
                indices = np.arange(total)
            items = (source[int(i)] for i in indices)
            batched = False
        else:
            items = iter(source)
            batched = kind == "DataLoader" and source.batch_size is not None
        for item in items:
            xi, yi = _split_item(item, name)
            parts = None if batched else _one_sample_parts(xi)
            if parts is not None:  # one sample of a multi-input model: its parts as a batch of one
                xa, xd, index_columns = as_inputs(parts, f"{name} inputs", 1)
            else:
                xa, xd, index_columns = as_inputs(xi, f"{name} inputs", len(yi) if batched and yi is not None else None)
                xa = xa if batched else xa[None]
            x_dtype = x_dtype or xd
            if yi is not None:
                ya, yd = _as_array(yi, f"{name} labels")
                y_dtype = y_dtype or yd
                ys.append(ya if batched else ya[None])
            xs.append(xa)
            read += xa.shape[0] if xa.ndim else 1
            bar.update(min(read, target) - bar.n)
            if read >= max_samples:
                stopped_early = total is None or read < total
                break
    bar.close()
    if not xs:
        raise ValueError(f"{name}: the {kind} yielded no samples")
    if ys and len(ys) != len(xs):
        raise ValueError(f"{name}: some {kind} items have labels and some do not")
    try:
        x_all = np.concatenate(xs)[:max_samples]
        y_all = np.concatenate(ys)[:max_samples] if ys else None
    except ValueError as exc:
        raise ValueError(f"{name}: {kind} samples differ in shape and cannot be checked as one array ({exc})") from None
    checked = x_all.shape[0]
    n_samples = total if total is not None else checked
    return _Split(name, x_all, y_all, x_dtype or x_all.dtype.name, y_dtype, n_samples, checked < n_samples or stopped_early,
                  "loader" if kind == "DataLoader" else "storage", index_columns)


def _one_sample_parts(x: Any) -> tuple[Any, ...] | None:
    """One Dataset item's inputs for a multi-input model (a tuple of arrays or tensors, one
    per input), each with a batch axis of one; None for a single input."""
    if not isinstance(x, (tuple, list)):
        return None
    parts = tuple(p[None] if hasattr(p, "ndim") else np.asarray(p)[None] for p in x)
    return parts if _input_parts(parts, 1) is not None else None


def _split_item(item: Any, name: str) -> tuple[Any, Any]:
    if isinstance(item, (tuple, list)):
        if len(item) == 0:
            raise ValueError(f"{name}: an empty item")
        return item[0], item[1] if len(item) > 1 else None
    if isinstance(item, dict):
        raise TypeError(f"{name}: items are dicts ({sorted(item)[:5]}); pass arrays or (input, label) items instead")
    return item, None


# --------------------------------------------------------------------------- one split


@dataclass
class _Rows:
    """Row hashes of one split, plus what is needed to confirm a hash match exactly."""

    x2d: np.ndarray
    dtype: np.dtype
    hashes: np.ndarray

    @property
    def n(self) -> int:
        return self.x2d.shape[0]

    def row_bytes(self, i: int) -> bytes:
        return _canonical(self.x2d[i : i + 1], self.dtype).tobytes()


@dataclass
class _SplitResult:
    split: _Split
    rows: _Rows
    inputs: dict[str, Any]
    labels: _Labels | None

    def to_split_stats(self) -> SplitStats:
        fields = dict(self.inputs)
        if self.labels is not None:
            fields.update(self.labels.fields())
        return SplitStats(
            n_samples=self.split.n_samples,
            sampled=self.split.sampled,
            checked_samples=self.split.x.shape[0],
            order_source=self.split.order,
            input_shape=list(self.split.x.shape[1:]),
            input_dtype=self.split.x_dtype,
            **fields,
        )


def _raw_images(rows: np.ndarray) -> str | None:
    """The range of the rows (flattened images) that are raw pixels (whole numbers from 0,
    up to RAW_RANGE_MIN_MAX or more), when they are RAW_SHARE of the rows or more."""
    values = rows  # no copy: a few images of the split, read as they are
    with np.errstate(invalid="ignore"):
        raw = (np.isfinite(values).all(1) & (values == np.floor(values)).all(1) & (values.min(1) >= 0)
               & (values.max(1) >= RAW_RANGE_MIN_MAX))  # fmt: skip
    if len(rows) == 0 or raw.mean() < RAW_SHARE:
        return None
    return f"{int(values[raw].min())}-{int(values[raw].max())} in {int(raw.sum())} of {len(rows)} samples"


def _check_split(split: _Split, hash_dtype: np.dtype, task: Task | None, progress: bool | None,
                 index_features: list[int], scaled_features: list[int],
                 num_classes: int | None = None) -> _SplitResult:  # fmt: skip
    x = split.x
    excluded = sorted(set(index_features) | set(scaled_features))
    n = x.shape[0]
    # features: channels (axis 1) for N×C×..., else the flattened sample
    if x.ndim >= 3:
        channels, spatial = x.shape[1], int(np.prod(x.shape[2:]))
    else:
        channels, spatial = (x.shape[1] if x.ndim == 2 else 1), 1
    x3 = x.reshape(n, channels, spatial)
    x2d = x.reshape(n, -1)
    row_size = max(1, x2d.shape[1])
    chunk_rows = max(1, CHUNK_ELEMENTS // row_size)
    work = np.float64 if x.dtype == np.float64 or x.dtype.kind in "iu" else np.float32
    show = progress if progress is not None else (wanted(None) and x.size > _AUTO_PROGRESS_ELEMENTS)
    bar = progress_bar(total=n, desc=f"nndx check_data: checking {split.name}", progress=show, unit="row")

    moments = _Moments(channels)
    multipliers = _hash_multipliers(_canonical(x2d[:1], hash_dtype).view(np.uint8).size)
    hashes = np.empty(n, dtype=np.uint64)
    nan_count = inf_count = zero_rows = 0
    integral = True
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        block = x3[start:stop].astype(work, copy=False)
        if spatial == 1:
            block = block[:, :, 0]
        finite = None
        if x.dtype.kind == "f":
            finite = np.isfinite(block)
            if finite.all():
                finite = None
            else:
                nans = int(np.isnan(block).sum())
                nan_count += nans
                inf_count += int(block.size - finite.sum()) - nans
        moments.update(block, finite)
        if integral:
            scaled = np.delete(block, excluded, axis=1) if excluded else block
            kept = finite if finite is None or not excluded else np.delete(finite, excluded, axis=1)
            values = scaled if kept is None else scaled[kept]
            integral = bool(np.array_equal(values, np.floor(values)))
        # any() counts NaN as non-zero, so a NaN row is never a "zero sample"
        zero_rows += int(np.count_nonzero(~x2d[start:stop].any(axis=1)))
        hashes[start:stop] = _row_hashes(_canonical(x2d[start:stop], hash_dtype), multipliers)
        bar.update(stop - start)
    bar.close()

    rows = _Rows(x2d, hash_dtype, hashes)
    duplicates, conflicts = _count_duplicates(rows, split.y)
    inputs = moments.summary(exclude=excluded)
    inputs["index_features"] = index_features
    inputs["scaled_features"] = scaled_features
    lo, hi = inputs["input_min"], inputs["input_max"]
    raw_ok = x.dtype.kind == "f" or x.dtype == np.uint8
    if raw_ok and integral and lo is not None and lo >= 0 and hi >= RAW_RANGE_MIN_MAX:
        inputs["raw_range"] = f"{int(lo)}-{int(hi)}"
    elif raw_ok and x.ndim >= 3:
        inputs["raw_range"] = _raw_images(x2d[:RAW_SAMPLE_ROWS])
    inputs.update(
        input_nan_count=nan_count,
        input_inf_count=inf_count,
        duplicate_count=duplicates,
        duplicate_fraction=duplicates / n,
        duplicate_label_conflict=conflicts / duplicates if duplicates and split.y is not None else None,
        zero_sample_fraction=zero_rows / n,
    )
    labels = _Labels.measure(split.y, split.y_dtype, task, num_classes) if split.y is not None else None
    return _SplitResult(split, rows, inputs, labels)


class _Moments:
    """Per-feature count/mean/M2/min/max over finite values, merged chunk by chunk with
    Chan's parallel formula (float64), which stays accurate where sum-of-squares does not."""

    def __init__(self, n_features: int) -> None:
        self.count = np.zeros(n_features)
        self.mean = np.zeros(n_features)
        self.m2 = np.zeros(n_features)
        self.min = np.full(n_features, np.inf)
        self.max = np.full(n_features, -np.inf)

    def update(self, block: np.ndarray, finite: np.ndarray | None) -> None:
        """``block`` is rows × features (× positions); ``finite`` masks non-finite values."""
        axes = (0,) if block.ndim == 2 else (0, 2)
        if finite is None:
            count = np.full(self.count.shape, block.size / block.shape[1])
            block_mean = block.sum(axis=axes, dtype=np.float64) / count
            deviation = block - _expand(block_mean.astype(block.dtype), block.ndim)
            block_m2 = (deviation * deviation).sum(axis=axes, dtype=np.float64)
            block_min, block_max = block.min(axis=axes), block.max(axis=axes)
        else:
            count = finite.sum(axis=axes).astype(np.float64)
            safe = np.maximum(count, 1)
            block_mean = np.where(finite, block, 0).sum(axis=axes, dtype=np.float64) / safe
            deviation = np.where(finite, block - _expand(block_mean.astype(block.dtype), block.ndim), 0)
            block_m2 = (deviation * deviation).sum(axis=axes, dtype=np.float64)
            block_min = np.where(finite, block, np.inf).min(axis=axes)
            block_max = np.where(finite, block, -np.inf).max(axis=axes)
        total = self.count + count
        safe_total = np.maximum(total, 1)
        delta = block_mean - self.mean
        self.mean = self.mean + delta * count / safe_total
        self.m2 = self.m2 + block_m2 + delta * delta * self.count * count / safe_total
        self.count = total
        self.min = np.minimum(self.min, block_min)
        self.max = np.maximum(self.max, block_max)

    def summary(self, exclude: Sequence[int] = ()) -> dict[str, Any]:
        """The moments over every feature but ``exclude`` (index columns: listed as NaN)."""
        seen = self.count > 0
        seen[list(exclude)] = False
        if not seen.any():
            return {"input_mean": None, "input_std": None, "input_min": None, "input_max": None}
        stds = np.sqrt(self.m2 / np.maximum(self.count, 1))
        count = np.where(seen, self.count, 0)
        n = count.sum()
        overall_mean = float((count * self.mean).sum() / n)
        overall_m2 = float(np.where(seen, self.m2, 0).sum() + (count * (self.mean - overall_mean) ** 2).sum())
        constant = np.flatnonzero(seen & (self.min == self.max))
        varying = stds[seen & (self.min != self.max)]
        ratio = float(varying.max() / varying.min()) if varying.size >= 2 else None
        listed = self.mean.size <= MAX_LISTED_FEATURES
        return {
            "input_mean": overall_mean,
            "input_std": float(np.sqrt(overall_m2 / n)),
            "input_min": float(self.min[seen].min()),
            "input_max": float(self.max[seen].max()),
            "feature_means": [float(v) if c else float("nan") for v, c in zip(self.mean, seen)] if listed else [],
            "feature_stds": [float(v) if c else float("nan") for v, c in zip(stds, seen)] if listed else [],
            "feature_scale_ratio": ratio,
            "constant_features": [int(i) for i in constant],
        }


def _expand(per_feature: np.ndarray, ndim: int) -> np.ndarray:
    return per_feature[None, :] if ndim == 2 else per_feature[None, :, None]


# --------------------------------------------------------------------------- hashing


def _canonical(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rows as contiguous values of ``dtype`` with -0.0 turned into 0.0, so that rows of
    equal values have equal bytes."""
    if np.dtype(dtype).kind == "f":
        # a new C-ordered array (never the caller's); -0.0 + 0.0 == +0.0
        return np.add(rows, np.dtype(dtype).type(0), dtype=dtype, order="C")
    return np.ascontiguousarray(rows, dtype=dtype)


def _hash_multipliers(row_bytes: int) -> np.ndarray:
    words = (row_bytes + 3) // 4
    rng = np.random.default_rng(0x6E6E6478)  # fixed: hashes must agree across splits and calls
    return rng.integers(0, 2**63, size=max(words, 1), dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _row_hashes(rows: np.ndarray, multipliers: np.ndarray) -> np.ndarray:
    """A 64-bit multiply-add hash of each row's bytes (random odd multiplier per 32-bit
    word, arithmetic mod 2**64). Equal rows hash equal; unequal rows rarely do, and every
    match is confirmed byte for byte afterwards."""
    n = rows.shape[0]
    raw = rows.reshape(n, -1).view(np.uint8).reshape(n, -1)
    if raw.shape[1] % 4:
        raw = np.concatenate([raw, np.zeros((n, 4 - raw.shape[1] % 4), np.uint8)], axis=1)
    words = raw.view(np.uint32)
    return (words.astype(np.uint64) * multipliers[: words.shape[1]]).sum(axis=1, dtype=np.uint64)


def _count_duplicates(rows: _Rows, y: np.ndarray | None = None) -> tuple[int, int]:
    """Rows equal to an earlier row of the same split, and how many of them, not all zero,
    have another label (``y``) than that row's first occurrence."""
    order = np.argsort(rows.hashes, kind="stable")
    sorted_hashes = rows.hashes[order]
    repeated = np.zeros(rows.n, dtype=bool)
    same = sorted_hashes[1:] == sorted_hashes[:-1]
    repeated[1:] |= same
    repeated[:-1] |= same
    candidates = np.sort(order[repeated])
    first: dict[bytes, bytes] = {}
    duplicates = conflicts = 0
    for i in candidates:
        key, label = rows.row_bytes(int(i)), _target_key(y, int(i))
        if key in first:
            duplicates += 1
            # zeroed rows (a decode that failed) carry every label: no sign of inputs that are contexts
            conflicts += label != first[key] and bool(rows.x2d[i].any())
        else:
            first[key] = label
    return duplicates, conflicts


def _count_overlap(train: _Rows, test: _Rows, train_y: np.ndarray | None = None,
                   test_y: np.ndarray | None = None) -> int:
    """Test rows that also occur in train (leakage), confirmed byte for byte. A row of one
    value repeated (all padding: knowledge tracing's sequences cut to a fixed length leave
    rows of -1 that the mask removes) carries no sample to leak and is not counted. With
    real-valued targets (``train_y``, ``test_y``), a row counts only when a train row with
    the same inputs has the same target too: inputs on a grid both splits share (two
    ``linspace`` ranges with the same ends) meet with different noisy targets, and are
    different samples."""
    maybe_in_train = np.isin(test.hashes, train.hashes)
    if not maybe_in_train.any():
        return 0
    shared = np.unique(test.hashes[maybe_in_train])
    train_keys: dict[bytes, set[bytes]] = {}
    for i in np.flatnonzero(np.isin(train.hashes, shared)):
        train_keys.setdefault(train.row_bytes(int(i)), set()).add(_target_key(train_y, int(i)))
    return sum(not _one_value(test.x2d[i])
               and _target_key(test_y, int(i)) in train_keys.get(test.row_bytes(int(i)), ())
               for i in np.flatnonzero(maybe_in_train))  # fmt: skip


def _real_targets(train: _SplitResult, test: _SplitResult) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Both splits' targets when both are real-valued (a regression's), else (None, None)."""
    if not all(r.labels is not None and r.labels.kind == "float_continuous" and r.split.y is not None
               for r in (train, test)):  # fmt: skip
        return None, None
    return train.split.y, test.split.y


def _target_key(y: np.ndarray | None, i: int) -> bytes:
    if y is None:
        return b""
    try:
        return np.asarray(y[i], dtype=np.float64).tobytes()
    except (TypeError, ValueError):  # labels that are no numbers (strings)
        return repr(y[i]).encode()


def _one_value(row: np.ndarray) -> bool:
    return row.size > 1 and bool(np.all(row == row.flat[0]))


# --------------------------------------------------------------------------- labels


@dataclass
class _Labels:
    kind: str
    dtype: str | None
    task: Task | None
    nan_count: int = 0
    inf_count: int = 0
    target_mean: float | None = None
    target_std: float | None = None
    target_min: float | None = None
    target_max: float | None = None
    runs_fraction: float | None = None
    order_correlation: float | None = None
    classes: set[str] | None = None  # classes seen; None when the labels are not classes
    counts: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    ignored_count: int = 0

    @classmethod
    def measure(cls, y: np.ndarray, dtype_name: str | None, task: Task | None,
                num_classes: int | None = None) -> _Labels:  # fmt: skip
        """Encoding, counts and order of labels ``y``; ``task`` None means infer it. A
        class per pixel (segmentation masks, (N, H, W)) is counted per pixel against
        ``num_classes``; values outside its range are the ignore index (255)."""
        dtype_name = dtype_name or y.dtype.name
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        finite = np.isfinite(y) if y.dtype.kind == "f" else np.ones(y.shape, dtype=bool)
        nan_count = int(np.isnan(y).sum()) if y.dtype.kind == "f" else 0
        inf_count = int(y.size - finite.sum()) - nan_count
        values = y[finite]
        integral = bool(values.size) and (y.dtype.kind in "biu" or np.array_equal(values, np.floor(values)))
        one_hot = y.ndim == 2 and bool(finite.all()) and _is_one_hot(y)
        if y.dtype.kind in "biu":
            kind = "one_hot" if one_hot else "class_index" if y.ndim == 1 else "other"
        else:
            kind = "one_hot" if one_hot else "float_integral" if integral else "float_continuous"
        if task is None:
            if kind in ("class_index", "one_hot"):
                task = "classification"
            elif kind == "float_integral" and y.ndim == 1 and np.unique(values).size <= MAX_INFERRED_CLASSES:
                task = "classification"  # class indices stored as floats: a LABEL_DTYPE smell
            elif kind in ("float_integral", "float_continuous"):
                task = "regression"
        if task == "classification" and (one_hot or (y.ndim == 1 and integral)):
            class_values = y.argmax(axis=1) if one_hot else values.astype(np.int64)
            labels = cls._classes(class_values, kind, dtype_name)
        elif task == "classification" and y.ndim >= 3 and y.dtype.kind in "biu" and num_classes:
            labels = cls._pixel_classes(values.reshape(-1), dtype_name, num_classes)
        else:
            labels = cls(kind=kind, dtype=dtype_name, task=task)
            if task == "regression" and values.size:
                labels.target_mean = float(values.mean(dtype=np.float64))
                labels.target_std = float(values.std(dtype=np.float64))
                labels.target_min, labels.target_max = float(values.min()), float(values.max())
                if y.ndim == 1 and values.size >= 10:
                    labels.order_correlation = _rank_correlation_with_position(values)
        labels.nan_count, labels.inf_count = nan_count, inf_count
        return labels

    @classmethod
    def _pixel_classes(cls, values: np.ndarray, dtype_name: str, num_classes: int) -> _Labels:
        inside = (values >= 0) & (values < num_classes)
        uniques, counts = np.unique(values[inside], return_counts=True)
        labels = cls(kind="other", dtype=dtype_name, task="classification", classes={str(int(u)) for u in uniques},
                     counts={str(int(u)): int(c) for u, c in zip(uniques, counts)})  # fmt: skip
        labels.ignored_count = int((~inside).sum())
        return labels  # check_data adds the classes of range(num_classes) with no pixel, as for any labels

    @classmethod
    def _classes(cls, values: np.ndarray, kind: str, dtype_name: str) -> _Labels:
        ignored = _ignore_marker(values)
        ignored_count = int((values == ignored).sum()) if ignored is not None else 0
        if ignored is not None:
            values = values[values != ignored]
        uniques, counts = np.unique(values, return_counts=True)
        runs = float(np.mean(values[1:] == values[:-1])) if values.ndim == 1 and values.size >= 2 else None
        expected_gaps = set()
        if uniques.size and uniques.max() >= 0:
            # a hole in the integer label range is a class with no sample; not the 0 between -1 and +1
            expected_gaps = {str(c) for c in range(int(uniques[uniques >= 0].min()), int(uniques.max()) + 1)}
        labels = cls(
            kind=kind,
            dtype=dtype_name,
            task="classification",
            runs_fraction=runs,
            classes={str(int(u)) for u in uniques},
            counts={str(int(u)): int(c) for u, c in zip(uniques, counts)},
        )
        labels.ignored_count = ignored_count
        labels.finish_classes(expected_gaps)
        return labels

    def finish_classes(self, expected: set[str]) -> None:
        """Give classes in ``expected`` that have no sample here a count of 0."""
        if self.classes is None:
            return
        for name in expected - set(self.counts):
            self.counts[name] = 0
        self.missing = sorted((c for c, k in self.counts.items() if k == 0), key=_class_sort_key)
        self.counts = dict(sorted(self.counts.items(), key=lambda item: _class_sort_key(item[0])))

    def fields(self) -> dict[str, Any]:
        counts = list(self.counts.values())
        imbalance = None
        if len(counts) >= 2:
            imbalance = float("inf") if min(counts) == 0 else max(counts) / min(counts)
        return {
            "label_dtype": self.dtype,
            "label_kind": self.kind,
            "label_nan_count": self.nan_count,
            "label_inf_count": self.inf_count,
            "target_mean": self.target_mean,
            "target_std": self.target_std,
            "target_min": self.target_min,
            "target_max": self.target_max,
            "class_counts": dict(self.counts),
            "imbalance_ratio": imbalance,
            "label_runs_fraction": self.runs_fraction,
            "target_order_correlation": self.order_correlation,
            "missing_classes": list(self.missing),
            "ignored_label_count": self.ignored_count,
        }


def _ignore_marker(values: np.ndarray) -> int | None:
    """The label that marks a sample unlabelled, or None: one negative value beside
    0-based classes (Mean Teacher's NO_LABEL -1, Hugging Face's -100). Cross-entropy
    rejects a negative class index unless it is the loss's ``ignore_index``, so such a
    value is no class; -1 beside +1 alone is a binary ±1 encoding and stays a class."""
    negative = np.unique(values[values < 0])
    if negative.size != 1:
        return None
    classes = np.unique(values[values >= 0])
    return int(negative[0]) if negative[0] == -100 or (classes.size >= 2 and classes.min() == 0) else None


def _rank_correlation_with_position(values: np.ndarray) -> float | None:
    """Spearman's rank correlation of regression targets with their position: ±1 when the
    samples are sorted by target, about 0 ± 1/sqrt(n) in random order (ties ranked in order)."""
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[np.argsort(values, kind="stable")] = np.arange(values.size, dtype=np.float64)
    positions = np.arange(values.size, dtype=np.float64)
    if ranks.std() == 0:
        return None
    return float(np.corrcoef(positions, ranks)[0, 1])


def _is_one_hot(y: np.ndarray) -> bool:
    return bool(y.shape[1] > 1 and np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all())


def _class_sort_key(name: str) -> tuple[int, str]:
    try:
        return (int(name), "")
    except ValueError:
        return (sys.maxsize, name)
