"""What the maintained secret rules cost the guardrail scanner, and what its prefilter saves
(issue 45). In process, prose with no match fed one token at a time, as a reasoning stream
arrives.

``python -m bench.secret_rules [--tokens 1500] [--rounds 15]``

Four rule sets, measured in turn within each round (so a drifting machine falls on all):
the six built-ins (bench/pii.yaml's policy), the same with the prefilter's gates off, the
built-ins and ``secret_rules`` (detect-secrets' 23 rules), and the same with the gates off
(every rule's ``starts``, ``first`` and ``needs`` emptied: literals, first characters, an
email's ``@``). Reported: µs per token, the median and least of the rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Sequence

from gateway.guard.detectors import BUILTIN, Detector
from gateway.guard.scanner import ChannelScanner
from gateway.guard.secrets import RULESET, secret_rules

WORDS = [
    "the",
    "model",
    "thinks",
    "about",
    "a",
    "question",
    "and",
    "writes",
    "its",
    "answer",
    "in",
    "several",
    "sentences",
    "with",
    "numbers",
    "like",
    "42",
    "and",
    "2026",
    "and",
    "names",
    "such",
    "as",
    "Alice,",
    "then",
    "it",
    "checks",
    "the",
    "result",
    "again",
]


def per_token(rules: Sequence[Detector], tokens: Sequence[str]) -> float:
    """µs per token to scan ``tokens`` as one channel."""
    start = time.perf_counter()
    scanner = ChannelScanner(rules)
    for i, token in enumerate(tokens):
        released, _ = scanner.feed(token, final=i == len(tokens) - 1)
        scanner.drop_before(released)
    return (time.perf_counter() - start) / len(tokens) * 1e6


def rule_sets() -> dict[str, list[Detector]]:
    built_ins = list(BUILTIN.values())
    with_rules = built_ins + list(secret_rules().values())

    def off(rules: list[Detector]) -> list[Detector]:
        return [dataclasses.replace(rule, starts=(), first="", needs=(), tail=None)
                for rule in rules]  # fmt: skip

    return {"built-ins": built_ins, "built-ins, gates off": off(built_ins),
            "built-ins + secret_rules": with_rules,
            "built-ins + secret_rules, gates off": off(with_rules)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    rng = random.Random(1)
    tokens = [rng.choice(WORDS) + " " for _ in range(args.tokens)]
    sets = rule_sets()
    found: dict[str, list[float]] = {name: [] for name in sets}
    for _ in range(args.rounds):
        for name, rules in sets.items():
            found[name].append(per_token(rules, tokens))
    print(f"{RULESET[0]} {RULESET[1]}, {args.tokens} tokens, {args.rounds} rounds\n")
    print("| rules | µs per token (median) | least |")
    print("|---|---|---|")
    for name, values in found.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} |")


if __name__ == "__main__":
    main()
