"""The Monitor under DDP: 2 processes on the gloo backend, on CPU.

One spawn runs two scenarios on fresh DDP models: a correct loop, and a loop where
from step 4 on rank 1 calls ``ddp.module(x)`` (bypassing the wrapper, so its gradients
are never averaged) while rank 0 trains unsynchronised under ``no_sync``, so the
replicas drift apart.
"""

import json
import math
import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from nndx.collector.merge import merge_ranks
from nndx.integrations.monitor import Monitor
from nndx.report import ActivationStats, DiagnosticReport, LayerStats, LoopStats, LossPoint, ScalarPoint

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")

STEPS = 8
BYPASS_FROM = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results = {}
    for scenario in ("synced", "bypass"):
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        )
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        with Monitor(ddp, opt, every=2, checksum_every=2) as mon:
            for step in range(STEPS):
                x, y = torch.randn(16, 8, generator=data), torch.randint(0, 3, (16,), generator=data)
                opt.zero_grad()
                if scenario == "bypass" and step >= BYPASS_FROM:
                    if rank == 1:
                        loss = nn.functional.cross_entropy(ddp.module(x), y)
                        loss.backward()
                    else:
                        with ddp.no_sync():
                            loss = nn.functional.cross_entropy(ddp(x), y)
                            loss.backward()
                else:
                    loss = nn.functional.cross_entropy(ddp(x), y)
                    loss.backward()
                opt.step()
                mon.log(loss)
            results[scenario] = mon.report().model_dump_json()
            results[f"{scenario}_local"] = mon.local_report().model_dump_json()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown (seconds under load); the results are on disk


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("ddp"))
    context = mp.start_processes(_worker, args=(2, _free_port(), out_dir), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.terminate()
            pytest.fail("DDP workers did not finish in 120 s")
    reports = {}
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            reports[rank] = {k: DiagnosticReport.model_validate_json(v) for k, v in json.load(f).items()}
    return reports


@pytest.mark.slow
def test_ddp_in_sync_merged_on_rank0(ddp_reports):
    merged, local0, local1 = ddp_reports[0]["synced"], ddp_reports[0]["synced_local"], ddp_reports[1]["synced"]
    loop = merged.loop
    assert loop.world_size == 2 and loop.steps == STEPS and loop.backward_calls == STEPS
    assert loop.desync_steps == [] and loop.max_desync == 0.0
    assert merged.errors == []
    # rank 0's merged losses are the mean of both ranks' (each rank its own shard)
    pairs = zip(merged.loss_history["train"], local0.loss_history["train"], local1.loss_history["train"])
    for point, rank0, rank1 in pairs:
        assert rank0.value != rank1.value
        assert point.value == pytest.approx((rank0.value + rank1.value) / 2)
    assert local1.loop.world_size == 2 and local1.loop.desync_steps == []
    assert merged.layers and all(s.name.startswith("module.") for s in merged.layers)


@pytest.mark.slow
def test_ddp_bypassed_wrapper_seen_as_desync(ddp_reports):
    loop = ddp_reports[0]["bypass"].loop
    assert loop.world_size == 2
    assert loop.desync_steps == [5, 7]  # checked every 2 steps; drift starts at step 4
    assert loop.max_desync > 1e-4
    assert ddp_reports[1]["bypass"].loop.desync_steps == [5, 7]  # every rank knows


def test_merge_reports_combines_ranks():
    def report(loss: float, dead: float, input_norm: float, grad_none: list[str]) -> DiagnosticReport:
        act = ActivationStats(mean=loss, std=1, min=-loss, max=loss, zero_fraction=0.5, dead_unit_fraction=dead,
                              nonfinite_count=1, unit_count=4)
        return DiagnosticReport(
            loss_history={"train": [LossPoint(step=0, value=loss)]},
            layers=[LayerStats(name="fc", type="Linear", step=0, activation=act)],
            loop=LoopStats(steps=3, params_grad_none=grad_none, input_norm_history=[ScalarPoint(step=0, value=input_norm)]),
        )

    merged = merge_ranks([report(1.0, 0.5, 3.0, ["a"]), report(3.0, 0.25, 0.0, ["b"])])
    assert merged.loss_history["train"][0].value == 2.0
    layer = merged.layers[0].activation
    assert (layer.mean, layer.min, layer.max, layer.dead_unit_fraction, layer.nonfinite_count) == (2.0, -3.0, 3.0, 0.25, 2)
    assert merged.loop.world_size == 2 and merged.loop.steps == 3
    assert merged.loop.input_norm_history[0].value == 0.0  # the zeroed batch on rank 1 shows
    assert merged.loop.params_grad_none == ["a", "b"]
    nan_merged = merge_ranks([report(float("nan"), 0.0, 1.0, []), report(1.0, 0.0, 1.0, [])])
    assert math.isnan(nan_merged.loss_history["train"][0].value)
    with pytest.raises(ValueError):
        merge_ranks([])
