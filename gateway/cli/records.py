"""``thinkgate ledger retention ...`` and ``thinkgate ledger hold ...``: records management from
the command line (``audit.retention`` holds the rules; docs/records.md the walkthrough).

- ``retention set --tenant T (--days N | --forever)``: the tenant's retention, a signed record.
- ``retention show [--tenant T]``: each tenant's retention (its own, or ``RETENTION_DAYS``).
- ``retention run [--now TIME]``: one retention run now (the gateway runs one every
  ``RETENTION_INTERVAL_S``); prints what it destroyed and which holds kept what.
- ``hold add --tenant T [--key K] [--since S] [--until U] --reason R``, ``hold list [--tenant
  T] [--all]``, ``hold release ID [--reason R]``: legal holds, each act a signed record.

Exit codes: 0 done, 1 nothing to release (an unknown hold) or the act's record not committed
yet (the database is away: it is in force once it is), 2 bad arguments or keys missing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.settings import Settings

# the ledger's modules are imported by each command, not by the parser (``thinkgate serve``
# starts without them)


def add_parsers(ledger: Any, missing_keys: Callable[[Settings], int], when: Callable[[str], float]
                ) -> None:  # fmt: skip
    """The ``retention`` and ``hold`` subcommands, under ``thinkgate ledger``."""

    def run(command: Callable[[argparse.Namespace, Settings], int]) -> Callable[..., int]:
        def call(args: argparse.Namespace) -> int:
            from audit.retention import RecordsNotInForce

            settings = Settings()
            if missing := missing_keys(settings):
                return missing
            try:
                return command(args, settings)
            except RecordsNotInForce as exc:
                print(f"thinkgate ledger: {exc}")
                return 1

        return call

    keep = ledger.add_parser("retention", help="how long each tenant's records stay readable")
    keep = keep.add_subparsers(required=True)
    set_ = keep.add_parser("set", help="a tenant's retention (a signed record)")
    set_.add_argument("--tenant", required=True)
    days = set_.add_mutually_exclusive_group(required=True)
    days.add_argument("--days", type=int)
    days.add_argument("--forever", action="store_true", help="never expire this tenant")
    set_.set_defaults(func=run(_set))
    show = keep.add_parser("show", help="each tenant's retention in force")
    show.add_argument("--tenant", default=None)
    show.set_defaults(func=run(_show))
    now = keep.add_parser("run", help="one retention run now")
    now.add_argument("--now", type=when, default=None, help="as if at this time (RFC 3339)")
    now.set_defaults(func=run(_run))

    hold = ledger.add_parser("hold", help="legal holds: records kept from retention and shred")
    hold = hold.add_subparsers(required=True)
    add = hold.add_parser("add", help="place a hold (a signed record)")
    add.add_argument("--tenant", required=True)
    add.add_argument("--key", default=None, help="only this API key's records (its key id)")
    add.add_argument("--since", type=when, default=None, help="RFC 3339 or epoch seconds")
    add.add_argument("--until", type=when, default=None, help="RFC 3339 or epoch seconds")
    add.add_argument("--reason", required=True)
    add.set_defaults(func=run(_add))
    listed = hold.add_parser("list", help="holds in force (--all: released ones too)")
    listed.add_argument("--tenant", default=None)
    listed.add_argument("--all", action="store_true")
    listed.set_defaults(func=run(_list))
    release = hold.add_parser("release", help="release a hold (a signed record)")
    release.add_argument("id")
    release.add_argument("--reason", default="")
    release.set_defaults(func=run(_release))


def _set(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    days = None if args.forever else args.days
    if days is not None and days < 1:
        print("thinkgate ledger retention set: --days is at least 1")
        return 2

    async def act() -> None:
        async with opened(settings) as ledger:
            await ledger.set_retention(args.tenant, days)

    asyncio.run(act())
    said = "forever" if days is None else f"{days} days"
    print(f"retention of tenant {args.tenant}: {said} (signed record appended)")
    return 0


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    async def read() -> tuple[dict[str, int | None], list[str]]:
        async with opened(settings) as ledger:
            register = await ledger.register(args.tenant)
            tenants = sorted({*register.retention, *(h.tenant for h in register.active())})
        return register.retention, tenants

    own, tenants = asyncio.run(read())
    default = settings.retention_days
    print(f"default (RETENTION_DAYS): {'forever' if default is None else f'{default} days'}")
    for tenant in tenants if args.tenant is None else [args.tenant]:
        days = own.get(tenant, default)
        source = "its own" if tenant in own else "the default"
        print(f"{tenant}: {'forever' if days is None else f'{days} days'} ({source})")
    return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    if args.now is not None and args.now > time.time():
        print("thinkgate ledger retention run: --now is in the future: it would destroy days "
              "still within retention")  # fmt: skip
        return 2

    async def act() -> list[Any]:
        async with opened(settings) as ledger:
            return await ledger.apply_retention(settings.retention_days, args.now)

    runs = asyncio.run(act())
    for done in runs:
        kept = f"; kept by {', '.join(done.kept_by)}" if done.kept_by else ""
        print(f"{done.tenant}: {len(done.dek_ids)} data keys destroyed "
              f"(days {', '.join(done.periods)}){kept}")  # fmt: skip
    if not runs:
        print("retention: nothing past its time")
    return 0


def _add(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    async def act() -> Any:
        async with opened(settings) as ledger:
            return await ledger.place_hold(args.tenant, args.reason, key_id=args.key,
                                           since=args.since, until=args.until)  # fmt: skip

    try:
        hold = asyncio.run(act())
    except ValueError as exc:
        print(f"thinkgate ledger hold add: {exc}")
        return 2
    print(f"{hold.id}: tenant {hold.tenant} held (signed record appended)")
    return 0


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    async def read() -> list[Any]:
        async with opened(settings) as ledger:
            register = await ledger.register(args.tenant)
        holds = register.holds.values() if args.all else register.active()
        return sorted(holds, key=lambda h: h.placed_at)

    for hold in asyncio.run(read()):
        scope = (f"key {hold.key_id}" if hold.key_id else "every key") + (
            f", from {_iso(hold.since)}" if hold.since is not None else "") + (
            f", until {_iso(hold.until)}" if hold.until is not None else "")  # fmt: skip
        state = f"released {_iso(hold.released_at)}" if hold.released_at else "in force"
        print(f"{hold.id}\t{hold.tenant}\t{scope}\t{state}\t{hold.reason}")
    return 0


def _release(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.cli.ledger import opened

    async def act() -> Any:
        async with opened(settings) as ledger:
            return await ledger.release_hold(args.id, args.reason)

    from audit.retention import HoldNotFound

    try:
        hold = asyncio.run(act())
    except HoldNotFound as exc:
        print(f"thinkgate ledger hold release: {exc}")
        return 1
    except ValueError as exc:
        print(f"thinkgate ledger hold release: {exc}")
        return 2
    print(f"{hold.id} released (signed record appended)")
    return 0


def _iso(when: float | None) -> str:
    return "" if when is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
