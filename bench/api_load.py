"""Load and durability of `nndx serve` on loopback with the default SQLite store.

Not a test: prints a table. Four phases, each bounded in count and time:

1. load    — 16 concurrent clients POST distinct 50-layer reports for a fixed number
             of requests, each as soon as its last was answered; throughput and
             p50/p99 latency of the acknowledged (201) POSTs.
2. paced   — the same clients at ``--rate`` POSTs/s on a fixed schedule; latency from
             the scheduled send.
3. verify  — every acknowledged report is read back through the API: count and content.
4. crash   — the same load, and the server is SIGKILLed in the middle of it; the
             database must pass PRAGMA integrity_check, and after a restart every
             report acknowledged before the kill must be there, byte for byte.

Usage: .venv/bin/python bench/api_load.py [--requests 3000] [--concurrency 16] [--workers 2]
Targets on the 2-core dev machine: >= 200 reports/s, p99 < 100 ms, zero acknowledged lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from nndx.report import (
    ActivationStats,
    DiagnosticReport,
    GradientStats,
    LayerInfo,
    LayerStats,
    LossPoint,
    ModelSummary,
    ParameterStats,
    RunInfo,
)

JSON = {"content-type": "application/json"}


def fifty_layer_report(index: int) -> DiagnosticReport:
    """A realistic monitor report: 50 layers with activation and gradient stats, their
    parameters, a model summary and 100 loss points. Distinct per ``index``."""
    names = [f"encoder.blocks.{i // 2}.{'fc' if i % 2 == 0 else 'act'}" for i in range(50)]
    return DiagnosticReport(
        run=RunInfo(name=f"load-{index}", project="bench", seed=index),
        model=ModelSummary(
            param_count=50 * 4160, trainable_param_count=50 * 4160,
            layers=[LayerInfo(name=n, type="Linear" if i % 2 == 0 else "ReLU", output_shape=[32, 64],
                              param_count=4160 if i % 2 == 0 else 0) for i, n in enumerate(names)],
            activations=["ReLU"] * 25, last_layer="Linear",
        ),
        loss_history={"train": [LossPoint(step=s, value=2.3 * 0.99**s + index * 1e-9) for s in range(100)]},
        layers=[
            LayerStats(
                name=n, type="Linear" if i % 2 == 0 else "ReLU", step=99,
                activation=ActivationStats(mean=0.1, std=0.8 + i * 1e-3, min=-2.0, max=3.0,
                                           zero_fraction=0.5 if i % 2 else 0.0, dead_unit_fraction=0.0,
                                           unit_count=64),
                gradient=GradientStats(abs_mean=1e-3 * (1 + i / 50), max=0.05, norm=0.1 + i * 1e-3),
            )
            for i, n in enumerate(names)
        ],
        parameters=[
            ParameterStats(name=f"{n}.weight", shape=[64, 64], step=99, weight_norm=4.0, grad_norm=0.05,
                           update_ratio=1e-3)
            for i, n in enumerate(names) if i % 2 == 0
        ],
    )


def report_bodies(first: int, count: int) -> list[bytes]:
    """``count`` distinct report bodies; ``first`` keeps the phases' reports apart."""
    return [fifty_layer_report(first + i).model_dump_json().encode() for i in range(count)]


def session_cpu_seconds(session_id: int) -> dict[int, float]:
    """CPU time (user + system) of each live process in the server's session, by pid: the
    server's cost per report, independent of how loaded the machine is, and how evenly
    its workers share the load."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id:  # field 6 of stat: session id
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return cpu


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`nndx serve` as a subprocess in its own session (so SIGKILL reaches it all)."""

    def __init__(self, database: Path, port: int, workers: int) -> None:
        self.database, self.port, self.workers = database, port, workers
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NNDX_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nndx.cli", "serve", "--port", str(self.port), "--workers", str(self.workers),
             "--database-url", f"sqlite:///{self.database}"],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError("nndx serve exited during start-up")
            time.sleep(0.1)
        raise RuntimeError("nndx serve did not become healthy within 60 s")

    def wait_idle(self) -> None:
        """Wait until every worker has started: /healthz answers as soon as the first
        does, and a load started then puts all 16 connections on that one worker."""
        deadline = time.monotonic() + 60
        previous = session_cpu_seconds(self.process.pid)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = session_cpu_seconds(self.process.pid)
            busy = sum(now.values()) - sum(previous.values())
            processes = self.workers + 1 if self.workers > 1 else 1  # uvicorn's supervisor and its workers
            if len(now) >= processes and busy < 0.02:
                return
            previous = now
        raise RuntimeError("nndx serve workers still starting after 60 s")

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class RawHTTPConnection:
    """A minimal keep-alive HTTP/1.1 client for the load phase. httpx costs ~2 ms of CPU
    per request here — CPU taken from the server on the same two cores — this ~0.2 ms."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.writer.write(head + body)
            await self.writer.drain()
            status = int((await self.reader.readline()).split()[1])
            length, close = 0, False
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and "close" in value.lower():
                    close = True
            content = await self.reader.readexactly(length)
        except (OSError, IndexError, ValueError, asyncio.IncompleteReadError):
            self.close()
            raise ConnectionError("connection lost") from None
        if close:
            self.close()
        return status, content

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def load(url: str, bodies: list[bytes], concurrency: int, kill_after: int | None = None,
               on_kill=None, time_limit_s: float = 120.0, rate: float | None = None):
    """POST ``bodies`` with ``concurrency`` clients; returns ({index: id}, latencies, seconds, errors).

    Without ``rate`` each client sends its next POST as soon as it has the answer (the
    most the server can do). With ``rate`` (POSTs/s, all clients together) the POSTs
    follow a fixed schedule, and a latency counts from the scheduled time, so a server
    that falls behind pays for the queue it built (no coordinated omission)."""
    import json

    port = int(url.rsplit(":", 1)[1])
    acknowledged: dict[int, str] = {}
    latencies: list[float] = []
    errors = 0
    next_index = 0
    killed = False
    deadline = time.monotonic() + time_limit_s

    async def client() -> None:
        nonlocal next_index, errors, killed
        connection = RawHTTPConnection("127.0.0.1", port)
        while next_index < len(bodies) and time.monotonic() < deadline:
            index = next_index
            next_index += 1
            if kill_after is not None and not killed and len(acknowledged) >= kill_after:
                killed = True
                on_kill()
            start = time.perf_counter()
            if rate is not None:
                start = started + index / rate
                await asyncio.sleep(max(0.0, start - time.perf_counter()))
            try:
                status, content = await connection.post("/v1/reports", bodies[index])
            except ConnectionError:
                errors += 1
                continue
            if status == 201:
                latencies.append(time.perf_counter() - start)
                acknowledged[index] = json.loads(content)["id"]
            else:
                errors += 1
        connection.close()

    started = time.perf_counter() + (0.1 if rate else 0.0)  # paced: a moment for the clients to start
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return acknowledged, latencies, time.perf_counter() - started, errors


async def verify(url: str, acknowledged: dict[int, str], bodies: list[bytes], concurrency: int) -> tuple[int, int]:
    """(reports found with identical content, reports missing or different)."""
    items = list(acknowledged.items())
    same = different = 0

    async def reader(http: httpx.AsyncClient, chunk) -> None:
        nonlocal same, different
        for index, report_id in chunk:
            response = await http.get(f"{url}/v1/reports/{report_id}")
            if response.status_code == 200 and response.content == bodies[index]:
                same += 1
            else:
                different += 1

    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:  # loopback: no proxy
        await asyncio.gather(*(reader(http, items[i::concurrency]) for i in range(concurrency)))
    return same, different


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="POSTs in the load phase (default 3000)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="nndx serve --workers (default 2, one per core)")
    parser.add_argument("--rate", type=float, default=200.0, help="POSTs/s of the paced phase (default 200, the target)")
    args = parser.parse_args()

    print(f"building {args.requests} distinct 50-layer reports ...", file=sys.stderr)
    bodies = report_bodies(0, args.requests)
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="nndx-bench-") as folder:
        database = Path(folder) / "nndx.sqlite3"
        server = Server(database, free_port(), args.workers)
        server.start()
        server.wait_idle()
        try:
            print("load phase ...", file=sys.stderr)
            cpu_before = session_cpu_seconds(server.process.pid)
            client_cpu_before = time.process_time()
            acknowledged, latencies, elapsed, errors = asyncio.run(load(server.url, bodies, args.concurrency))
            cpu_after = session_cpu_seconds(server.process.pid)
            per_process = sorted((cpu_after[pid] - cpu_before.get(pid, 0.0) for pid in cpu_after), reverse=True)
            server_cpu = sum(per_process)
            client_cpu = time.process_time() - client_cpu_before
            throughput = len(acknowledged) / elapsed
            p50, p90, p99 = (percentile(latencies, q) * 1e3 for q in (50, 90, 99))
            print(f"paced phase ({args.rate:.0f}/s) ...", file=sys.stderr)
            paced_bodies = report_bodies(2 * 10**6, args.requests)
            paced, paced_latencies, paced_elapsed, paced_errors = asyncio.run(
                load(server.url, paced_bodies, args.concurrency, rate=args.rate)
            )
            paced_p50, paced_p90, paced_p99 = (percentile(paced_latencies, q) * 1e3 for q in (50, 90, 99))
            print("verify phase ...", file=sys.stderr)
            same, different = asyncio.run(verify(server.url, acknowledged, bodies, args.concurrency))
            paced_same, paced_different = asyncio.run(verify(server.url, paced, paced_bodies, args.concurrency))
            same, different = same + paced_same, different + paced_different
            listed = httpx.get(f"{server.url}/v1/reports", params={"limit": 1}, trust_env=False).status_code
        finally:
            server.stop()
        rows += [
            ("load", "report size", f"{len(bodies[0]) / 1024:.1f} KiB JSON, 50 layers"),
            ("load", "clients / server workers", f"{args.concurrency} / {args.workers}"),
            ("load", "acknowledged (201) / sent", f"{len(acknowledged)} / {args.requests} ({errors} errors)"),
            ("load", "throughput", f"{throughput:.0f} reports/s (target >= 200)"),
            ("load", "latency p50 / p90", f"{p50:.1f} / {p90:.1f} ms"),
            ("load", "latency p99", f"{p99:.1f} ms (target < 100)"),
            ("load", "server CPU per report", f"{server_cpu / max(1, len(acknowledged)) * 1e3:.2f} ms"
             f" (= {max(1, len(acknowledged)) / max(server_cpu, 1e-9):.0f} reports/s per free core)"),
            ("load", "cores used by each server process", " / ".join(
                f"{c / elapsed:.2f}" for c in per_process if c / elapsed >= 0.01)),
            ("load", "bench client CPU per report", f"{client_cpu / max(1, len(acknowledged)) * 1e3:.2f} ms"),
            ("load", "machine load average (1 min)", f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"),
            ("paced", "offered / achieved", f"{args.rate:.0f} / {len(paced) / paced_elapsed:.0f} reports/s, "
             f"{len(paced)} acknowledged ({paced_errors} errors)"),
            ("paced", "latency p50 / p90 (from the scheduled send)", f"{paced_p50:.1f} / {paced_p90:.1f} ms"),
            ("paced", "latency p99", f"{paced_p99:.1f} ms (target < 100)"),
            ("verify", "acknowledged read back identical", f"{same} / {len(acknowledged) + len(paced)} ({different} missing or different)"),
        ]
        assert listed == 200

        print("crash phase ...", file=sys.stderr)
        crash_db = Path(folder) / "crash.sqlite3"
        server = Server(crash_db, free_port(), args.workers)
        server.start()
        crash_bodies = report_bodies(10**6, args.requests)
        try:
            acked, _, _, crash_errors = asyncio.run(
                load(server.url, crash_bodies, args.concurrency, kill_after=len(crash_bodies) // 3, on_kill=server.kill)
            )
        finally:
            if server.process.poll() is None:
                server.kill()
        with sqlite3.connect(crash_db) as conn:  # opening replays the WAL, as a restart would
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            rows_on_disk = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
        server.start()
        try:
            same, different = asyncio.run(verify(server.url, acked, crash_bodies, args.concurrency))
        finally:
            server.stop()
        rows += [
            ("crash", "SIGKILL after", f"{len(crash_bodies) // 3} acknowledged; {crash_errors} requests failed after"),
            ("crash", "acknowledged before the kill", f"{len(acked)}"),
            ("crash", "PRAGMA integrity_check", integrity),
            ("crash", "rows on disk", f"{rows_on_disk} (>= acknowledged; extra = committed, answer lost in the kill)"),
            ("crash", "acknowledged present after restart", f"{same} / {len(acked)} (lost: {different})"),
        ]

    width = max(len(r[1]) for r in rows)
    print(f"\n| phase  | {'measure'.ljust(width)} | value |")
    print(f"|--------|{'-' * (width + 2)}|-------|")
    for phase, measure, value in rows:
        print(f"| {phase.ljust(6)} | {measure.ljust(width)} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
