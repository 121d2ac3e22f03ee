"""A tour of Orchard's sandboxes: `python -m orchard.demo`. Runs on the embedded default (no server), or
on the server ORCHARD_URL names.

Creates one sandbox, runs commands, uses a persistent shell, moves files and a directory in and out,
measures exec latency, and deletes everything it made. Prints what each step took."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchard.sandbox.client import AsyncOrchard

LATENCY_RUNS = 200
LATENCY_WARMUP = 20


class Steps:
    """Rows of the report: step, what it showed, milliseconds."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float]] = []
        self.where = ""

    def add(self, step: str, detail: str, started: float) -> None:
        self.rows.append((step, detail, (time.perf_counter() - started) * 1000))

    def table(self) -> Table:
        table = Table("step", "result", "ms", title=f"Orchard sandbox tour ({self.where})")
        for step, detail, ms in self.rows:
            table.add_row(step, detail, f"{ms:.1f}")
        return table


def _percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def tour() -> Steps:
    steps = Steps()
    async with AsyncOrchard() as orch:  # embedded, unless ORCHARD_URL names a server
        steps.where = "embedded, local backend" if orch.embedded else f"server {orch.url}"
        t = time.perf_counter()
        sandbox = await orch.create(image="host", labels={"purpose": "demo"})
        steps.add("create sandbox", sandbox.id, t)

        t = time.perf_counter()
        result = await sandbox.exec("echo hello from $(hostname) && uname -sr")
        steps.add("exec", " / ".join(result.stdout.split("\n")[:2]).strip(" /"), t)

        t = time.perf_counter()
        shell = await sandbox.shell("demo")
        await shell.run("mkdir -p notes && cd notes && export GREETING=hi")
        shown = await shell.run('echo "$GREETING from $(pwd)"')
        await shell.close()
        steps.add("shell session (cd + export persist)", shown.output.strip(), t)

        t = time.perf_counter()
        await sandbox.write_file("notes/todo.txt", "1. plant\n2. water\n")
        text = (await sandbox.read_file("notes/todo.txt")).decode()
        steps.add("write + read a file", f"{len(text)} bytes back, {text.count(chr(10))} lines", t)

        with tempfile.TemporaryDirectory(prefix="orchard-demo-") as tmp:
            local = Path(tmp) / "project"
            (local / "src").mkdir(parents=True)
            for i in range(20):
                (local / "src" / f"module_{i}.py").write_text(f"VALUE = {i}\n")
            t = time.perf_counter()
            await sandbox.upload(local, "project")
            listing = await sandbox.exec("ls project/src | wc -l && cat project/src/*.py | wc -l")
            steps.add("upload a directory (tar)", f"{' files, '.join(listing.stdout.split())} lines in sandbox", t)

            await sandbox.exec("echo built > project/BUILD_OK")
            t = time.perf_counter()
            await sandbox.download("project", Path(tmp) / "back")
            back = sorted(p.name for p in (Path(tmp) / "back").rglob("*") if p.is_file())
            steps.add("download it back", f"{len(back)} files, BUILD_OK={'BUILD_OK' in back}", t)

        for _ in range(LATENCY_WARMUP):
            await sandbox.exec("true")
        samples = []
        t = time.perf_counter()
        for _ in range(LATENCY_RUNS):
            started = time.perf_counter()
            await sandbox.exec(["true"])
            samples.append((time.perf_counter() - started) * 1000)
        steps.add(f"{LATENCY_RUNS} x exec `true`",
                  f"p50 {_percentile(samples, 50):.2f} ms, p99 {_percentile(samples, 99):.2f} ms", t)

        t = time.perf_counter()
        await sandbox.close()  # deletes it: it was created by this client
        steps.add("delete", f"state: {(await orch.get(sandbox.id)).state}", t)
    return steps


def main() -> None:
    console = Console()
    started = time.perf_counter()
    with console.status("touring a sandbox..."):
        steps = asyncio.run(tour())
    console.print(steps.table())
    console.print(f"done in {time.perf_counter() - started:.1f} s; nothing left behind.")


if __name__ == "__main__":
    main()
