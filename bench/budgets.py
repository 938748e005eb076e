"""Budgets in money: what they cost admission, in one process and through the gateway, on
Redis (issue 43's target: admissions per second with budgets on ≥ 0.9× without).

``python -m bench.budgets [--seconds 5] [--rounds 3] [--concurrency 64] [--redis-url URL]
[--gateway-seconds 8] [--gateway-rounds 3]``

- **In one process** (the admission alone, its worst case): the gateway's own admission objects
  on the process's one auto-pipelined Redis client, as ``bench.admission``'s micro part builds
  them (``Gate.admit`` then ``Gate.settle``: rate limits and the KV budget at once). ``on`` adds
  what the pipeline adds with ``PRICES_FILE`` and a budget: ``Spending.ask`` (the key's daily
  budget and its tenant's monthly one; the budgets read from SQLite through their cache),
  reserved in the rate limits' own script, and the settlement priced by the usage, in the
  refund's script. Budgets never refuse here (10⁹ USD). C workers share one key and loop
  admission then settlement. One stack, key and budget book serve every slice; slices
  alternate off, on, off, on (a short warm-up each), so the machine's drift falls on both
  alike. Reported per round: admissions + settlements per second of each slice, on ÷ off, and
  this process's CPU per admission (steadier on a shared machine than the rate, which also
  moves with how requests happen to share Redis round trips).
- **Through the gateway** (what users run): gateway processes in turn, off, on, off, on, each
  on Redis with a rate-limited key and ``KV_CAPACITY_TOKENS``; ``on`` adds ``PRICES_FILE`` and
  a monthly budget on the key's tenant (checked afterwards to have counted). 64 workers stream
  ``max_tokens`` 8 from an unpaced simulator, flat out, so requests per second are admissions
  per second; the ledger is a ``DiscardSink`` as in ``bench.admission``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import secrets
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from tempfile import TemporaryDirectory

from audit.record import Usage
from bench.admission import (
    GatewayPlan,
    GatewayRound,
    Probe,
    Stack,
    admission_stack,
    clean_keys,
    create_key,
    gateway_round,
    redis_admin,
    remove_keys,
    start_gateway,
)
from bench.procs import THINKGATE, Workdir, start_sim
from gateway.admission.spending import BudgetBook, Spending
from gateway.db import create_engine, upgrade_schema
from gateway.settings import Settings
from gateway.spend.budgets import MoneyBudget
from gateway.spend.prices import parse_prices

PRICES = parse_prices(b"currency: USD\nmodels: {m: {input: 0.55, output: 2.19}}\n")
USAGE = Usage(400, 600, 300, 1000)


@dataclass
class Bench:
    """One stack, key and budget book for every slice: off and on differ only in the budgets."""

    stack: Stack
    probe: Probe
    spending: Spending
    concurrency: int

    async def slice(self, budgets: bool, seconds: float) -> tuple[float, float]:
        """Admissions (with their settlements) per second, and this process's CPU µs per
        admission, over ``seconds`` after a short warm-up."""
        done = 0
        stack, probe, spending = self.stack, self.probe, self.spending

        async def worker(until: float) -> None:
            nonlocal done
            while time.perf_counter() < until:
                if budgets:  # in the rate limits' script, as the pipeline asks them
                    spend = await spending.ask(probe.key, "m", 400, 1024)
                    await stack.settle(await stack.admit(probe, spend), USAGE)
                else:
                    await stack.settle(await stack.admit(probe))
                done += 1

        warm = time.perf_counter() + 0.2
        await asyncio.gather(*(worker(warm) for _ in range(self.concurrency)))
        done, start, cpu = 0, time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(start + seconds) for _ in range(self.concurrency)))
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        return done / elapsed, used / max(done, 1) * 1e6


async def run(redis_url: str, seconds: float, rounds: int, concurrency: int) -> None:
    probe = Probe.new()
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite+aiosqlite:///{Path(tmp) / 'budgets.db'}")
        await upgrade_schema(engine)
        book = BudgetBook(engine)
        for b in (MoneyBudget("key", probe.key.key_id, "day", Decimal(10**9)),
                  MoneyBudget("tenant", probe.key.tenant, "month", Decimal(10**9))):  # fmt: skip
            await book.set(b)
        async with admission_stack(redis_url) as stack, redis_admin(redis_url) as admin:
            bench = Bench(stack, probe, Spending(PRICES, book, stack.limiter.circuit), concurrency)
            gc.collect()  # as the gateway does once it has started (gateway.app)
            gc.freeze()
            try:
                await report(bench, seconds, rounds)
            finally:
                await remove_keys(admin, probe.patterns)
        await engine.dispose()


async def report(bench: Bench, seconds: float, rounds: int) -> None:
    ratios, cpu = [], {False: [], True: []}  # type: ignore[var-annotated]
    print("| round | off (admissions/s) | on (admissions/s) | on ÷ off | CPU µs off / on |")
    print("|---|---|---|---|---|")
    for round_ in range(1, rounds + 1):
        (off, off_cpu), (on, on_cpu) = (
            await bench.slice(False, seconds),
            await bench.slice(True, seconds),
        )
        ratios.append(on / off)
        cpu[False].append(off_cpu)
        cpu[True].append(on_cpu)
        print(f"| {round_} | {off:,.0f} | {on:,.0f} | {on / off:.2f} | "
              f"{off_cpu:.0f} / {on_cpu:.0f} |")  # fmt: skip
    off_cpu, on_cpu = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"\nmedian on ÷ off: {statistics.median(ratios):.2f} (target ≥ 0.90); this "
          f"process's CPU per admission: {off_cpu:.0f} µs off, {on_cpu:.0f} µs on "
          f"(off ÷ on {off_cpu / on_cpu:.2f})")  # fmt: skip


PRICES_YAML = "currency: USD\nmodels: {deepseek-r1: {input: 0.55, output: 2.19}}\n"


def gateway_rounds(redis_url: str, seconds: float, rounds: int) -> list[GatewayRound]:
    """Gateway processes in turn (off, on, off, on; a fresh one each) on Redis, one
    rate-limited key; ``on`` adds ``PRICES_FILE`` and a budget on the key's tenant. Flat out:
    the simulator answers at once, so requests per second are admissions per second."""
    plan = GatewayPlan(redis_url, seconds, 0, 0, rounds)
    with TemporaryDirectory(prefix="tg-budgets-") as tmp:
        work = Workdir(Path(tmp))
        subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=work.env, check=True,
                       capture_output=True)  # fmt: skip
        tenant = f"bench-{secrets.token_hex(4)}"
        key = create_key(work, tenant, limited=True)
        prices = work.path / "prices.yaml"
        prices.write_text(PRICES_YAML)
        priced = {**work.env, "THINKGATE_PRICES_FILE": str(prices)}
        subprocess.run([THINKGATE, "budget", "set", "--tenant", tenant, "--amount", "1000000000",
                        "--per", "month"], cwd=work.path, env=priced, check=True,
                       capture_output=True)  # fmt: skip
        found: list[GatewayRound] = []
        with start_sim(work, 0, 0) as sim:
            try:
                for round_ in range(1, rounds + 1):
                    for mode in ("off", "on"):
                        extra = {"THINKGATE_PRICES_FILE": str(prices)} if mode == "on" else {}
                        with start_gateway(work, sim.base_url, "on", redis_url,
                                           extra) as gateway:  # fmt: skip
                            found.append(gateway_round(plan, gateway, key, mode, round_))
                if not asyncio.run(_counted(redis_url, tenant)):
                    raise RuntimeError("the budgets counted nothing: the 'on' cells measured none")
            finally:
                patterns = (f"rl:{{{tenant}}}:*", f"spend:{{{tenant}}}:*",
                            f"thinkgate:kv:{{pool}}:{sim.base_url}:*")  # fmt: skip
                asyncio.run(clean_keys(redis_url, patterns))
    return found


async def _counted(redis_url: str, tenant: str) -> bool:
    """Whether the tenant's budget counter holds what the 'on' gateways spent."""
    async with redis_admin(redis_url) as admin:
        assert admin is not None
        found = [k async for k in admin.scan_iter(match=f"spend:{{{tenant}}}:*")]
        return bool(found) and int(await admin.get(found[0]) or 0) > 0


def report_gateway(found: list[GatewayRound]) -> None:
    print("\n| round | off (requests/s) | on (requests/s) | on ÷ off | gateway CPU µs off / on |")
    print("|---|---|---|---|---|")
    ratios = []
    for off, on in zip(found[::2], found[1::2], strict=True):
        ratios.append(on.rate / off.rate)
        print(f"| {off.round} | {off.rate:,.0f} | {on.rate:,.0f} | {ratios[-1]:.2f} | "
              f"{off.cpu_us:.0f} / {on.cpu_us:.0f} |")  # fmt: skip
    print(
        f"\nthrough the gateway, median on ÷ off: {statistics.median(ratios):.2f} (target ≥ 0.90)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--redis-url", default=Settings().test_redis_url)
    parser.add_argument("--gateway-seconds", type=float, default=8.0)
    parser.add_argument("--gateway-rounds", type=int, default=3)
    args = parser.parse_args()
    import uvloop

    uvloop.run(run(args.redis_url, args.seconds, args.rounds, args.concurrency))
    if args.gateway_rounds:
        report_gateway(gateway_rounds(args.redis_url, args.gateway_seconds, args.gateway_rounds))


if __name__ == "__main__":
    main()
