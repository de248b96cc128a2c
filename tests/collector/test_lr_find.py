"""nndx.lr_find: torch-lr-finder's shape over the one LR range implementation, on a copy."""

from __future__ import annotations

import math

import pytest
import torch
from _probe_models import assert_untouched, batch, mlp, single_thread, snapshot  # noqa: F401
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nndx
from nndx.collector.lr_find import draw, save_png
from nndx.collector.probes.lr_range import from_csv, lr_range_test, suggest
from nndx.errors import UsageError
from nndx.report import LRRangeResult


def indexed_loader(n: int = 32, batch_size: int = 8, seed: int = 0) -> DataLoader:
    """Targets that are the samples' indices, so a loss can see the order read."""
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.arange(n)), batch_size=batch_size,
                      shuffle=True, generator=torch.Generator().manual_seed(seed))  # fmt: skip


def recording_loss(seen: list[list[int]]):
    """Cross-entropy on 3 classes (index % 3) that appends each batch's indices to ``seen``."""

    def loss_fn(logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        seen.append(indices.tolist())
        return nn.functional.cross_entropy(logits, indices % 3)

    return loss_fn


def test_user_objects_untouched_and_result_in_torch_lr_finder_shape():
    model, (x, y) = mlp(batchnorm=True), batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    before = snapshot(model, optimizer)
    found = nndx.lr_find(model, optimizer, nn.CrossEntropyLoss(), (x, y), steps=40, progress=False)
    assert_untouched(before, model, optimizer)
    assert found.record.status == "passed"
    low, high = found.interval
    assert low < found.suggestion < high
    assert found.history["lr"] == found.record.lrs and len(found.history["loss"]) == len(found.record.lrs)
    assert "suggestion=" in repr(found)


def test_one_batch_gives_the_probe_s_own_sweep():
    """lr_find is the LR range probe, not a second implementation of it."""
    model, (x, y) = mlp(), batch()
    found = nndx.lr_find(model, None, nn.CrossEntropyLoss(), (x, y), steps=30, progress=False)
    probed = lr_range_test(model, (x, y), nn.CrossEntropyLoss(), steps=30)
    assert found.record.lrs == pytest.approx(probed.lrs)
    assert found.record.losses == pytest.approx(probed.losses)
    assert found.suggestion == pytest.approx(probed.suggested_lr)


def test_a_dataloader_is_reshuffled_every_pass_not_replayed():
    seen: list[list[int]] = []
    # 4 batches a pass, 12 steps: three passes
    nndx.lr_find(mlp(), None, recording_loss(seen), indexed_loader(), steps=12, end_lr=1e-3, progress=False)
    hooked = seen[:12]
    passes = [sorted(sum(hooked[i:i + 4], [])) for i in (0, 4, 8)]
    assert all(p == list(range(32)) for p in passes), "each pass reads every sample once"
    orders = [sum(hooked[i:i + 4], []) for i in (0, 4, 8)]
    assert orders[0] != orders[1] and orders[1] != orders[2], "the passes were not reshuffled"


@pytest.mark.parametrize("own_generator", [True, False])
def test_the_users_next_epoch_is_in_the_order_it_would_have_had(own_generator):
    """A shuffling DataLoader draws its order from its own generator, or else from the
    global RNG: lr_find reads it pass after pass and puts both back."""

    def loader() -> DataLoader:
        data = TensorDataset(torch.randn(32, 8, generator=torch.Generator().manual_seed(0)), torch.arange(32))
        generator = torch.Generator().manual_seed(5) if own_generator else None
        return DataLoader(data, batch_size=8, shuffle=True, generator=generator)

    def next_epoch(source: DataLoader) -> list[int]:
        return [i for _, y in source for i in y.tolist()]

    model = mlp()  # seeds the global RNG itself: before the user's seed
    torch.manual_seed(11)
    untouched = next_epoch(loader())
    torch.manual_seed(11)
    swept = loader()
    nndx.lr_find(model, None, lambda out, y: nn.functional.cross_entropy(out, y % 3), swept, steps=12, end_lr=1e-3,
                 progress=False)  # fmt: skip
    assert next_epoch(swept) == untouched


def test_device_copy_leaves_the_user_model_untouched():
    model, (x, y) = mlp(), batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()  # Adam now has state tensors, which the copy must carry to the device
    before = snapshot(model, optimizer)
    found = nndx.lr_find(model, optimizer, nn.CrossEntropyLoss(), (x, y), device="cpu", steps=30, progress=False)
    assert_untouched(before, model, optimizer)
    assert found.record.lrs and "copy of the user's Adam" in found.record.message


def test_plot_marks_the_suggestion_interval_and_divergence(tmp_path):
    found = nndx.lr_find(mlp(), None, nn.CrossEntropyLoss(), batch(), start_lr=1e-5, end_lr=100.0, steps=60,
                         progress=False)  # fmt: skip
    assert found.record.diverged_at_lr is not None
    ax = Figure().subplots()
    assert found.plot(ax) is ax
    assert ax.get_xscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert any(label.startswith("suggested lr") for label in labels)
    assert any(label.startswith("trains well") for label in labels)
    assert any(label.startswith("diverged at") for label in labels)
    low, high = ax.get_ylim()
    finite = [s for s in found.record.smoothed if math.isfinite(s)]
    assert low <= min(finite) and high < 10 * max(found.record.smoothed[:5]), "the spike sets the y range"


def test_csv_round_trip_gives_the_same_suggestion(tmp_path):
    found = nndx.lr_find(mlp(), None, nn.CrossEntropyLoss(), batch(), steps=40, progress=False)
    loaded = from_csv(found.to_csv(tmp_path / "lr.csv"))
    assert loaded.suggested_lr == pytest.approx(found.suggestion)
    assert (loaded.interval_low_lr, loaded.interval_high_lr) == pytest.approx(found.interval)


def test_bad_loaders_and_ranges_are_usage_errors():
    model, loss = mlp(), nn.CrossEntropyLoss()
    with pytest.raises(UsageError, match="re-iterable"):
        nndx.lr_find(model, None, loss, iter(indexed_loader()), progress=False)
    with pytest.raises(UsageError, match="no batch"):
        nndx.lr_find(model, None, loss, [], progress=False)
    with pytest.raises(UsageError, match="start_lr < end_lr"):
        nndx.lr_find(model, None, loss, batch(), start_lr=1.0, end_lr=0.1, progress=False)


@pytest.mark.parametrize("shown", [True, False])
def test_progress_bar_on_stderr_only_when_asked(capsys, shown):
    nndx.lr_find(mlp(), None, nn.CrossEntropyLoss(), batch(), steps=20, progress=shown)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ("nndx lr_find" in captured.err) is shown


def test_suggest_needs_a_clear_drop_after_the_warm_up():
    lrs = [10 ** (-6 + i * 0.1) for i in range(40)]
    assert suggest(lrs, [1.0 + 0.001 * ((-1) ** i) for i in range(40)]) is None  # noise, no drop
    assert suggest(lrs, [1.0 - 0.01 * min(i, 3) for i in range(40)]) is None  # a 3% drop is no evidence
    assert suggest(lrs, [0.5] + [1.0] * 39) is None  # the minimum inside the warm-up
    assert suggest(lrs, [1.0] * 20 + [0.2] * 20) == pytest.approx((lrs[20] / 4, lrs[20] / 8, lrs[20] / 2))


def test_a_sweep_with_no_finite_loss_still_plots_and_says_so(tmp_path):
    nan = float("nan")
    record = LRRangeResult(status="failed", lrs=[1e-7, 1e-6], losses=[nan, nan], smoothed=[nan, nan],
                           diverged_at_lr=1e-6, message="the loss diverged within 2 steps")  # fmt: skip
    ax = Figure().subplots()
    draw(record, ax)
    assert any("no finite loss" in text.get_text() for text in ax.texts)
    assert save_png(record, tmp_path / "lr.png").read_bytes()[:4] == b"\x89PNG"
