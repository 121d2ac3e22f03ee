"""Measurement 3: moving a 100 MB file into a sandbox and back — throughput, and that memory stays flat
(the client and the agent stream; neither holds the file)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.measurement import BenchContext, Measurement
from bench.memory import host_process
from bench.orchard_clients import agent_memory, embedded_orchard
from bench.peers.swerex import remote_runtime, swerex_server, swerex_upload
from bench.results_model import Findings, Row, Target, ratio

MB = 1_000_000
THROUGHPUT_MB_S, FLAT_GROWTH_MB = 200.0, 32.0
SWEREX_UPLOAD, LOCAL_COPY = "SWE-ReX upload", "local file copy"


def _write_random_file(path: Path, size: int) -> str:
    """Incompressible content, written in chunks; returns its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for offset in range(0, size, 4 * MB):
            chunk = os.urandom(min(4 * MB, size - offset))
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MB):
            digest.update(chunk)
    return digest.hexdigest()


def _timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def run(ctx: BenchContext) -> Findings:
    size = ctx.pick(100, 20) * MB
    mb = size / MB
    client = host_process()
    with tempfile.TemporaryDirectory(prefix="orchard-bench-transfer-") as tmp:
        source, back, copy = Path(tmp, "source.bin"), Path(tmp, "back.bin"), Path(tmp, "copy.bin")
        expected = _write_random_file(source, size)
        copy_s = _timed(lambda: shutil.copyfile(source, copy))
        copy.unlink()

        with embedded_orchard() as orchard, orchard.create() as sandbox:
            agent = agent_memory(orchard, sandbox)
            ctx.console.print(f"  upload {mb:.0f} MB into a sandbox …")
            client.start()
            agent.start()
            upload_s = _timed(lambda: sandbox.upload(source, "bench-upload.bin"))
            up_client_mb, up_agent_mb = client.growth_mb(), agent.growth_mb()
            ctx.console.print(f"  download {mb:.0f} MB out of it …")
            client.start()
            agent.start()
            download_s = _timed(lambda: sandbox.download("bench-upload.bin", back))
            down_client_mb, down_agent_mb = client.growth_mb(), agent.growth_mb()
        if _sha256(back) != expected:
            raise RuntimeError("the file downloaded from the sandbox differs from the one uploaded")
        back.unlink()

        ctx.console.print(f"  SWE-ReX upload of the same {mb:.0f} MB …")
        with swerex_server() as server:
            swerex, swerex_process = remote_runtime(server), host_process(server.pid)
            client.start()
            swerex_process.start()
            swerex_s = _timed(lambda: asyncio.run(swerex_upload(swerex, str(source), str(copy))))
            swerex_client_mb, swerex_server_mb = client.growth_mb(), swerex_process.growth_mb()
        if _sha256(copy) != expected:
            raise RuntimeError("the file SWE-ReX uploaded differs from the source")

    throughput = {"upload": mb / upload_s, "download": mb / download_s}
    local_copy, swerex_up = mb / copy_s, mb / swerex_s
    rows = [
        Row(metric=f"upload {mb:.0f} MB", unit="MB/s", ours=throughput["upload"],
            peers={SWEREX_UPLOAD: swerex_up, LOCAL_COPY: local_copy},
            ratios={"orchard/swerex": ratio(throughput["upload"], swerex_up),
                    "orchard/local_copy": ratio(throughput["upload"], local_copy)},
            targets=[Target(op=">=", limit=THROUGHPUT_MB_S)]),
        Row(metric=f"download {mb:.0f} MB", unit="MB/s", ours=throughput["download"],
            peers={LOCAL_COPY: local_copy},
            ratios={"orchard/local_copy": ratio(throughput["download"], local_copy)},
            targets=[Target(op=">=", limit=THROUGHPUT_MB_S)]),
        Row(metric="client peak memory growth, upload", unit="MB", ours=up_client_mb,
            peers={"SWE-ReX client": swerex_client_mb}, targets=[Target(op="<=", limit=FLAT_GROWTH_MB)]),
        Row(metric="agent peak memory growth, upload", unit="MB", ours=up_agent_mb,
            peers={"SWE-ReX server": swerex_server_mb}, targets=[Target(op="<=", limit=FLAT_GROWTH_MB)]),
        Row(metric="client peak memory growth, download", unit="MB", ours=down_client_mb,
            targets=[Target(op="<=", limit=FLAT_GROWTH_MB)]),
        Row(metric="agent peak memory growth, download", unit="MB", ours=down_agent_mb,
            targets=[Target(op="<=", limit=FLAT_GROWTH_MB)]),
    ]
    return Findings(rows=rows, notes=[
        "Memory growth is the kernel's high-water mark (VmHWM, reset through /proc/PID/clear_refs before "
        "each transfer) minus the resident size before it; the agent's is read from inside its sandbox.",
        "SWE-ReX has no binary download (its `read_file` returns decoded text), so only its upload is a "
        "peer; it writes to the host's disk, unisolated. The local file copy (`shutil.copyfile`) is the "
        "disk's own ceiling on this machine.",
        "Both transfers are checked byte for byte (sha256) after the timing.",
    ])


MEASUREMENT = Measurement(
    name="transfer",
    title="100 MB upload and download",
    method=("A 100 MB file of random bytes is uploaded into a fresh sandbox with `sb.upload(local, remote)`, "
            "then downloaded with `sb.download(remote, local)` (sync SDK), each timed alone; meanwhile the "
            "peak memory growth of the client process and of the sandbox's agent is recorded. SWE-ReX "
            "uploads the same file through its `RemoteRuntime.upload`."),
    run=run,
)
