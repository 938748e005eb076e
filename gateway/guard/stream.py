"""A choice's guard: the policies of a request over its reasoning and its answer (sans-I/O).

``ChoiceGuard(policies).take(reasoning, content, final) -> Guarded`` implements the relay's
``TextGuard`` (``gateway.relay.guarding``). Each channel has its own ``ChannelScanner`` over
the detectors of the policies whose ``scope`` names it, so a match never spans the boundary
between reasoning and answer: the reasoning channel is closed (its held text decided and sent)
the moment the first answer text arrives, and both close with the choice (``final``).

What each decided match does, by its policy's ``action``:

- ``redact``: the match is replaced by its detector's label (``[EMAIL]``) in the client's copy
  when ``targets`` has ``client``, in the record's when it has ``ledger``;
- ``flag``: nothing changes; the act is recorded;
- ``block``: the text before the match goes out, nothing from the match on (in either copy),
  and the choice is over (``blocked`` names the policy).

Every act is kept in ``acts`` with its value, for the record's keyed hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.guard.policy import Channel, GuardPolicy
from gateway.relay.guarding import GuardAct, Guarded

if TYPE_CHECKING:  # a guard is made only for a request some policy applies to (and so are
    # the scanner, its detectors and ``regex``: a gateway without guardrails never loads them)
    from gateway.guard.detectors import Detector
    from gateway.guard.scanner import ChannelScanner


@dataclass(slots=True)
class _Lane:
    """One channel: its scanner and the policy of each of its rules."""

    name: Channel
    scanner: ChannelScanner
    owners: list[tuple[GuardPolicy, Detector]]  # per rule
    sent: int = 0  # how far the channel's text has gone out
    closed: bool = False


@dataclass(slots=True)
class ChoiceGuard:
    policies: Sequence[GuardPolicy]
    acts: list[GuardAct] = field(default_factory=list)
    blocked: str | None = None
    _lanes: dict[str, _Lane | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from gateway.guard.scanner import ChannelScanner

        for channel in ("reasoning", "answer"):
            owners = [(p, d) for p in self.policies if channel in p.channels
                      for d in p.detectors]  # fmt: skip
            scanner = ChannelScanner([d for _, d in owners])
            self._lanes[channel] = _Lane(channel, scanner, owners) if owners else None

    def take(self, reasoning: str, content: str, final: bool) -> Guarded:
        if self.blocked is not None:
            return Guarded("", "", "", "")
        r_client, r_kept = self._feed("reasoning", reasoning, final or bool(content))
        if self.blocked is not None:
            return Guarded(r_client, "", r_kept, "")
        c_client, c_kept = self._feed("answer", content, final)
        return Guarded(r_client, c_client, r_kept, c_kept)

    def take_one(self, channel: str, text: str) -> tuple[str, str] | None:
        if self.blocked is not None:
            return None
        if channel == "answer":  # the reasoning channel must be closed already, or absent
            reasoning = self._lanes["reasoning"]
            if reasoning is not None and not reasoning.closed:
                return None
        return self._feed(channel, text, False)

    def stop(self, act: GuardAct) -> None:
        self.acts.append(act)
        if self.blocked is None:
            self.blocked = act.policy

    def _feed(self, channel: str, text: str, final: bool) -> tuple[str, str]:
        lane = self._lanes[channel]
        if lane is None:
            return text, text
        if lane.closed and text:  # more after the channel closed (reasoning after an answer
            from gateway.guard.scanner import ChannelScanner  # began): scanned anew

            lane = self._lanes[channel] = _Lane(lane.name, ChannelScanner(
                [d for _, d in lane.owners]), lane.owners)  # fmt: skip
        if lane.closed or not (text or final):
            return ("", "") if lane.closed else (text, text)
        released, findings = lane.scanner.feed(text, final)
        lane.closed = final
        if not findings:  # the common case: what is decided goes as it came
            tail = lane.scanner.text(lane.sent, released) if released > lane.sent else ""
            lane.sent = max(released, lane.sent)
            lane.scanner.drop_before(lane.sent)
            return tail, tail
        client: list[str] = []
        kept: list[str] = []
        cursor = lane.sent
        for finding in findings:
            policy, detector = lane.owners[finding.rule]
            plain = lane.scanner.text(cursor, finding.start)
            client.append(plain)
            kept.append(plain)
            self.acts.append(GuardAct(policy.name, policy.action, channel, detector.name,
                                      finding.text))  # fmt: skip
            if policy.action == "block":
                self.blocked = policy.name
                lane.closed = True
                return "".join(client), "".join(kept)
            redact = policy.action == "redact"
            # the span, not the match: an overlapping match is kept from where the last ended
            span = lane.scanner.text(finding.start, finding.end)
            client.append(detector.label if redact and "client" in policy.targets else span)
            kept.append(detector.label if redact and "ledger" in policy.targets else span)
            cursor = finding.end
        if released > cursor:
            tail = lane.scanner.text(cursor, released)
            client.append(tail)
            kept.append(tail)
        lane.sent = max(released, cursor)
        lane.scanner.drop_before(lane.sent)
        return "".join(client), "".join(kept)
