"""Load and durability of `nndx serve` on loopback, on SQLite and on PostgreSQL, beside a
bare FastAPI app measured in the same run.

Not a test: prints a table. For each server (the bare app, nndx on SQLite, nndx on
PostgreSQL when a server is given), each phase bounded in count and time:

1. load    — 16 concurrent clients POST distinct 50-layer reports for a fixed number
             of requests, each as soon as its last was answered; throughput and
             p50/p99 latency of the acknowledged (201) POSTs.
2. paced   — the same clients at ``--rate`` POSTs/s on a fixed schedule; latency from
             the scheduled send.
3. verify  — (nndx) every acknowledged report is read back through the API: count and
             content.
4. crash   — (nndx) the same load, and the server is SIGKILLed in the middle of it;
             after a restart every report acknowledged before the kill must be there,
             byte for byte (SQLite: and PRAGMA integrity_check must pass).
5. explain — (nndx, SQLite) 80 concurrent explains against an LLM that never answers
             (NNDX_LLM_TIMEOUT=5): the longest explain, and the latency of /healthz
             and GET requests sent meanwhile.

The bare app is FastAPI under the same uvicorn (2 workers, httptools) whose POST reads
the body and answers 201 with an id: the framework's own ceiling on this machine, so
that "nndx ÷ bare" is a ratio measured side by side.

Usage: .venv/bin/python bench/api_load.py [--requests 3000] [--concurrency 16] [--workers 2]
           [--postgres-url postgresql+psycopg://user@host:5432/db]   (or NNDX_TEST_POSTGRES_URL)
Targets on the 2-core dev machine: >= 400 reports/s saturated, p99 < 100 ms paced at
200/s, zero acknowledged lost; /healthz and GET p99 < 100 ms during the hung explains.
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
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
from fastapi import FastAPI, Request, Response

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
    """A server as a subprocess in its own session (so SIGKILL reaches it all)."""

    def __init__(self, command: list[str], port: int, workers: int, env: dict[str, str] | None = None) -> None:
        self.command, self.port, self.workers = command, port, workers
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NNDX_")} | (env or {})
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    @classmethod
    def nndx(cls, database_url: str, workers: int, env: dict[str, str] | None = None) -> Server:
        port = free_port()
        return cls([sys.executable, "-m", "nndx.cli", "serve", "--port", str(port), "--workers", str(workers),
                    "--database-url", database_url], port, workers, env)  # fmt: skip

    @classmethod
    def bare(cls, workers: int) -> Server:
        port = free_port()
        return cls([sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent), "api_load:bare_app",
                    "--factory", "--port", str(port), "--workers", str(workers), "--log-level", "warning",
                    "--http", "httptools"], port, workers)  # fmt: skip

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[2]} exited during start-up")
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy within 60 s")

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
        raise RuntimeError("server workers still starting after 60 s")

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


def bare_app():  # type: ignore[no-untyped-def]
    """The baseline: FastAPI reading a POST body and answering 201 with an id."""
    app = FastAPI()

    @app.post("/v1/reports")
    async def create(request: Request) -> Response:
        await request.body()
        return Response(f'{{"id": "{uuid.uuid4().hex}"}}', status_code=201, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response('{"status": "ok"}', media_type="application/json")

    return app


class RawHTTPConnection:
    """A minimal keep-alive HTTP/1.1 client for the load phase. httpx costs ~2 ms of CPU
    per request here — CPU taken from the server on the same two cores — this ~0.2 ms."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        return await self.request(head, body)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self.request(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode(), b"")

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
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


def hung_llm() -> tuple[socket.socket, str]:
    """A listening socket that accepts and never answers: an LLM that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def measure_load(server: Server, args: argparse.Namespace, first: int, verify_reports: bool) -> list[tuple[str, str]]:
    """The load, paced and (nndx) verify phases against a started server."""
    bodies = report_bodies(first, args.requests)
    cpu_before = session_cpu_seconds(server.process.pid)
    acknowledged, latencies, elapsed, errors = asyncio.run(load(server.url, bodies, args.concurrency))
    cpu_after = session_cpu_seconds(server.process.pid)
    server_cpu = sum(cpu_after[pid] - cpu_before.get(pid, 0.0) for pid in cpu_after)
    throughput = len(acknowledged) / elapsed
    p50, p99 = (percentile(latencies, q) * 1e3 for q in (50, 99))
    paced_bodies = report_bodies(first + 2 * 10**6, args.requests)
    paced, paced_latencies, paced_elapsed, paced_errors = asyncio.run(
        load(server.url, paced_bodies, args.concurrency, rate=args.rate))
    paced_p50, paced_p99 = (percentile(paced_latencies, q) * 1e3 for q in (50, 99))
    rows = [
        ("saturated throughput", f"{throughput:.0f} reports/s ({len(acknowledged)} acknowledged, {errors} errors)"),
        ("saturated latency p50 / p99", f"{p50:.1f} / {p99:.1f} ms"),
        ("server CPU per report", f"{server_cpu / max(1, len(acknowledged)) * 1e3:.2f} ms"),
        (f"paced {args.rate:.0f}/s: latency p50 / p99", f"{paced_p50:.1f} / {paced_p99:.1f} ms "
         f"({len(paced)} acknowledged, {paced_errors} errors)"),
    ]
    if verify_reports:
        same, different = asyncio.run(verify(server.url, acknowledged, bodies, args.concurrency))
        paced_same, paced_different = asyncio.run(verify(server.url, paced, paced_bodies, args.concurrency))
        total = len(acknowledged) + len(paced)
        rows.append(("acknowledged read back identical",
                     f"{same + paced_same} / {total} ({different + paced_different} missing or different)"))
    return [("_throughput", str(throughput))] + rows


def measure_crash(database_url: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    """SIGKILL under load, restart, and look for every acknowledged report."""
    server = Server.nndx(database_url, args.workers)
    server.start()
    bodies = report_bodies(10**6, args.requests)
    try:
        acked, _, _, crash_errors = asyncio.run(
            load(server.url, bodies, args.concurrency, kill_after=len(bodies) // 3, on_kill=server.kill))
    finally:
        if server.process.poll() is None:
            server.kill()
    rows = []
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:  # replays the WAL, as a restart would
            rows.append(("PRAGMA integrity_check after SIGKILL", conn.execute("PRAGMA integrity_check").fetchone()[0]))
    server.start()
    try:
        same, different = asyncio.run(verify(server.url, acked, bodies, args.concurrency))
    finally:
        server.stop()
    return rows + [("acknowledged before SIGKILL, present after restart", f"{same} / {len(acked)} (lost {different})")]


def measure_explain_starvation(database_url: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    """80 explains on a hung LLM; the latency of /healthz and GET meanwhile."""
    llm_socket, llm_url = hung_llm()
    deadline_s = 5.0
    server = Server.nndx(database_url, 1, {"NNDX_LLM_BASE_URL": llm_url, "NNDX_LLM_MODEL": "m",
                                           "NNDX_LLM_TIMEOUT": str(deadline_s)})  # fmt: skip
    server.start()
    try:
        report_id = httpx.post(f"{server.url}/v1/reports", content=report_bodies(5 * 10**6, 1)[0],
                               headers=JSON, trust_env=False).json()["id"]  # fmt: skip

        async def run() -> tuple[list[float], list[float]]:
            async def explain() -> float:
                connection = RawHTTPConnection("127.0.0.1", server.port)
                started = time.perf_counter()
                status, _ = await connection.post(f"/v1/reports/{report_id}/explain", b"")
                connection.close()
                assert status == 200, status
                return time.perf_counter() - started

            explains = [asyncio.create_task(explain()) for _ in range(80)]
            await asyncio.sleep(0.5)
            connection, latencies = RawHTTPConnection("127.0.0.1", server.port), []
            while not any(task.done() for task in explains):
                for path in ("/healthz", f"/v1/reports/{report_id}"):
                    started = time.perf_counter()
                    status, _ = await connection.get(path)
                    assert status == 200, (path, status)
                    latencies.append(time.perf_counter() - started)
                await asyncio.sleep(0.01)
            connection.close()
            return await asyncio.gather(*explains), latencies

        explain_times, latencies = asyncio.run(run())
    finally:
        server.stop()
        llm_socket.close()
    return [
        ("explains answered / longest", f"{len(explain_times)} / {max(explain_times):.2f} s "
         f"(deadline {deadline_s:g} s; target < deadline + 1 s)"),
        ("/healthz + GET meanwhile: p50 / p99", f"{percentile(latencies, 50) * 1e3:.1f} / "
         f"{percentile(latencies, 99) * 1e3:.1f} ms over {len(latencies)} requests (target p99 < 100 ms)"),
    ]


def postgres_schema_url(server_url: str) -> tuple[str, Callable[[], None]]:
    """A fresh schema on ``server_url`` for one measurement, and how to drop it."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(server_url)
    plain = base.set(drivername="postgresql").render_as_string(hide_password=False)
    schema = f"nndx_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    url = base.set(drivername="postgresql+psycopg").update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), drop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="POSTs in the load phase (default 3000)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="server workers (default 2, one per core)")
    parser.add_argument("--rate", type=float, default=200.0, help="POSTs/s of the paced phase (default 200, the target)")
    parser.add_argument("--postgres-url", default=os.environ.get("NNDX_TEST_POSTGRES_URL"),
                        help="a PostgreSQL server to measure too (default $NNDX_TEST_POSTGRES_URL)")
    args = parser.parse_args()

    columns: dict[str, list[tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="nndx-bench-") as folder:
        print("bare FastAPI app ...", file=sys.stderr)
        bare = Server.bare(args.workers)
        bare.start()
        bare.wait_idle()
        try:
            columns["bare FastAPI"] = measure_load(bare, args, 3 * 10**6, verify_reports=False)
        finally:
            bare.stop()
        backends = [("nndx, SQLite", f"sqlite:///{Path(folder) / 'load.sqlite3'}", None)]
        if args.postgres_url:
            url, drop = postgres_schema_url(args.postgres_url)
            backends.append(("nndx, PostgreSQL", url, drop))
        for name, url, drop in backends:
            print(f"{name} ...", file=sys.stderr)
            server = Server.nndx(url, args.workers)
            server.start()
            server.wait_idle()
            try:
                rows = measure_load(server, args, 0, verify_reports=True)
            finally:
                server.stop()
            crash_url = url.replace("load.sqlite3", "crash.sqlite3")
            if drop is not None:
                drop()
                crash_url, drop = postgres_schema_url(args.postgres_url)
            rows += measure_crash(crash_url, args)
            if drop is not None:
                drop()
            else:
                rows += measure_explain_starvation(f"sqlite:///{Path(folder) / 'explain.sqlite3'}", args)
            columns[name] = rows
    bare_throughput = float(dict(columns["bare FastAPI"])["_throughput"])
    for name, rows in columns.items():
        throughput = float(dict(rows)["_throughput"])
        rows.insert(1, ("throughput ÷ bare FastAPI", f"{throughput / bare_throughput:.2f}"))

    print(f"\n{args.concurrency} clients, {args.workers} workers, 50-layer reports of "
          f"{len(report_bodies(0, 1)[0]) / 1024:.1f} KiB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, rows in columns.items():
        print(f"\n| {name} | value |\n|---|---|")
        for measure, value in rows:
            if not measure.startswith("_"):
                print(f"| {measure} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
