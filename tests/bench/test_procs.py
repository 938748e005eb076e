"""``bench.procs.pinned``: the load generator on a CPU of its own for a run, then restored."""

from __future__ import annotations

import asyncio
import os
import sys

import psutil

from bench.procs import pinned
from tests.waiting import eventually


async def test_the_client_gets_the_last_cpu_and_the_servers_and_their_children_the_rest() -> None:
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)']); time.sleep(60)")  # fmt: skip
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    try:
        supervisor = psutil.Process(server.pid)
        await eventually(lambda: len(supervisor.children()) == 1)
        [worker] = supervisor.children()
        me = psutil.Process()
        cpus = sorted(os.sched_getaffinity(0))
        with pinned(me, [supervisor]) as (client, servers):
            if len(cpus) > 1:
                assert client == {cpus[-1]} and servers == set(cpus[:-1])
                assert os.sched_getaffinity(0) == client
                assert set(supervisor.cpu_affinity()) == servers
                assert set(worker.cpu_affinity()) == servers
            else:
                assert client == servers == set(cpus)
        assert sorted(os.sched_getaffinity(0)) == cpus
        assert sorted(supervisor.cpu_affinity()) == sorted(worker.cpu_affinity()) == cpus
    finally:
        for process in psutil.Process(server.pid).children(recursive=True):
            process.kill()
        server.kill()
        await server.wait()
