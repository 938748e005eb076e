"""``thinkgate spend report``: what the ledger says was spent, summed from its records' headers.

Each completion record's header carries its cost (``cost.amount``, a decimal string, with its
currency and the digest of the prices it used: docs/spend.md), so the sum needs no decryption
and each figure can be checked against a record and its inclusion proof (``ledger export``).
A record without a cost (written before prices were set, a model served unpriced, a
``replica_lost`` record made by a replica that had no prices) is priced here from its usage
when ``PRICES_FILE`` prices its model (counted as ``repriced``), else counted ``unpriced``.

``[--tenant T] [--key KEY_ID] [--since TIME] [--until TIME] [--format csv|json]``: one row per
tenant, key, model and currency (requests, tokens, amount), and the totals per currency.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson

from gateway.ledger.spending import Row, spend_rows, totals
from gateway.settings import Settings
from gateway.spend.prices import Prices, load_prices


def add_parser(sub: Any, when: Callable[[str], float]) -> None:
    spend = sub.add_parser("spend", help="what was spent, from the ledger").add_subparsers(
        required=True
    )
    report = spend.add_parser("report", help="the ledger's costs summed per tenant, key, model")
    report.add_argument("--tenant", default=None)
    report.add_argument("--key", default=None, metavar="KEY_ID")
    report.add_argument("--since", type=when, default=None, help="RFC 3339 or epoch seconds")
    report.add_argument("--until", type=when, default=None, help="RFC 3339 or epoch seconds")
    report.add_argument("--format", choices=("json", "csv"), default="json")
    report.set_defaults(func=cmd_spend_report)


def cmd_spend_report(args: argparse.Namespace) -> int:
    settings = Settings()
    try:
        prices = None if settings.prices_file is None else load_prices(settings.prices_file)
    except (OSError, ValueError) as exc:  # what serve's preflight refuses too
        print(f"thinkgate: prices: {exc}", file=sys.stderr)
        return 2
    rows, unpriced = asyncio.run(_report(settings, prices, args))
    if args.format == "csv":
        out = io.StringIO()
        fields = list(Row("", "", "", "").to_json())
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row.to_json())
        sys.stdout.write(out.getvalue())
    else:
        body = {"rows": [r.to_json() for r in rows], "totals": totals(rows),
                "unpriced": unpriced}  # fmt: skip
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


async def _report(
    settings: Settings, prices: Prices | None, args: argparse.Namespace
) -> tuple[list[Row], int]:
    from gateway.db import create_engine

    engine = create_engine(settings.database_url)
    try:
        return await spend_rows(engine, prices, tenant=args.tenant, key_id=args.key,
                                since=args.since, until=args.until)  # fmt: skip
    finally:
        await engine.dispose()


def add_budget_parser(sub: Any) -> None:
    budget = sub.add_parser("budget", help="budgets in money per key or tenant").add_subparsers(
        required=True
    )
    put = budget.add_parser("set", help="set a key's or a tenant's budget per day or month")
    remove = budget.add_parser("remove", help="remove a budget")
    for command in (put, remove):
        whose = command.add_mutually_exclusive_group(required=True)
        whose.add_argument("--tenant", default=None)
        whose.add_argument("--key", default=None, metavar="KEY_ID")
        command.add_argument("--per", choices=("day", "month"), required=True)
    put.add_argument("--amount", type=Decimal, required=True, help="in the prices' currency")
    put.add_argument("--soft", action="store_true", help="alert only: never refuse")
    put.set_defaults(func=cmd_budget_set)
    remove.set_defaults(func=cmd_budget_remove)
    budget.add_parser("list", help="every budget").set_defaults(func=cmd_budget_list)


def _subject(args: argparse.Namespace) -> tuple[Any, str]:
    return ("tenant", args.tenant) if args.tenant is not None else ("key", args.key)


def cmd_budget_set(args: argparse.Namespace) -> int:
    from gateway.spend.budgets import MoneyBudget

    if not args.amount.is_finite() or args.amount <= 0:
        print("--amount must be more than 0", file=sys.stderr)
        return 2
    scope, subject = _subject(args)
    budget = MoneyBudget(scope, subject, args.per, args.amount, args.soft)
    problem = asyncio.run(_with_book(lambda book: _set(book, budget)))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    kind = "soft" if budget.soft else "hard"
    print(f"{scope} {subject}: {budget.amount} per {budget.period} ({kind})")
    return 0


def cmd_budget_remove(args: argparse.Namespace) -> int:
    scope, subject = _subject(args)
    gone = asyncio.run(_with_book(lambda book: book.remove(scope, subject, args.per)))
    print("removed" if gone else "no such budget", file=sys.stdout if gone else sys.stderr)
    return 0 if gone else 1


def cmd_budget_list(args: argparse.Namespace) -> int:
    budgets = asyncio.run(_with_book(lambda book: book.all()))
    for b in budgets:
        print(f"{b.scope}\t{b.subject}\t{b.amount}\tper {b.period}\t{'soft' if b.soft else 'hard'}")
    return 0


async def _set(book: Any, budget: Any) -> str | None:
    """Set it; what is wrong instead (a key that does not exist)."""
    if budget.scope == "key":
        from gateway.auth.keystore import KeyStore

        if await KeyStore(book.engine).get(budget.subject) is None:
            return f"no key {budget.subject}"
    await book.set(budget)
    return None


async def _with_book(work: Callable[[Any], Any]) -> Any:
    from gateway.admission.spending import BudgetBook
    from gateway.db import create_engine, upgrade_schema

    engine = create_engine(Settings().database_url)
    try:
        await upgrade_schema(engine)
        return await work(BudgetBook(engine))
    finally:
        await engine.dispose()
