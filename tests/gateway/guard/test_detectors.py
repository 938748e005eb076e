"""The built-in detectors' coverage (``gateway.guard.detectors``), through the streaming scanner
whole and one character at a time: the values other tools find and ours missed (IBANs grouped
by dashes or followed by a stray group, punycode and Unicode email domains, national phone
numbers of several regions, SSNs with spaces or dots and, as an option, bare after a context
word), and what must stay untouched (checksums or registry formats that fail, nine digits
without a context word)."""

from __future__ import annotations

import pytest

from gateway.guard.detectors import BUILTIN, Detector, builtin, iban
from gateway.guard.policy import PolicyFileError, parse
from gateway.guard.scanner import ChannelScanner, Finding


def found(detector: Detector, text: str, pieces: list[str] | None = None) -> list[str]:
    scanner = ChannelScanner([detector])
    seen: list[Finding] = []
    pieces = pieces or [text]
    for i, piece in enumerate(pieces):
        released, findings = scanner.feed(piece, final=i == len(pieces) - 1)
        seen += findings
        scanner.drop_before(released)
    return [f.text for f in seen]


def both(detector: Detector, text: str) -> list[str]:
    """What the whole text gives, asserted the same fed one character at a time."""
    whole = found(detector, text)
    assert found(detector, text, list(text)) == whole, text
    return whole


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("iban AL47-2121-1009-0000-0002-3569-8741 ok", "AL47-2121-1009-0000-0002-3569-8741"),
        ("to VG96 VPVG 0000 0123 4567 8901 X please", "VG96 VPVG 0000 0123 4567 8901"),
        ("GB82 WEST 1234 5698 7654 32.", "GB82 WEST 1234 5698 7654 32"),
        ("DE89370400440532013000", "DE89370400440532013000"),
        ("FR14 2004 1010 0505 0001 3M02 606", "FR14 2004 1010 0505 0001 3M02 606"),
    ],
)
def test_ibans_grouped_by_spaces_or_dashes_and_cut_at_a_stray_group(text: str, value: str) -> None:
    assert both(BUILTIN["iban"], text) == [value]


def test_an_iban_must_fit_its_countrys_registry_entry() -> None:
    assert iban("GB82WEST12345698765432")
    assert not iban("GB83WEST12345698765432")  # mod-97
    # mod-97 holds, but Germany's IBAN is 22 characters: one digit too many
    assert iban("DE89370400440532013000")
    assert not iban("DE9837040044053201300000")
    assert both(BUILTIN["iban"], "XX82 WEST 1234 5698 7654 32") == []  # no such country


@pytest.mark.parametrize(
    "value", ["a@xn--d1acufc.xn--p1ai", "user@пример.рф", "info@bücher.de", "x@mail.example.com"]
)
def test_emails_with_internationalised_domains(value: str) -> None:
    assert both(BUILTIN["email"], f"write to {value}, thanks") == [value]


def test_not_emails() -> None:
    for text in ("bad@-x.com", "a@b", "a@b.c", "me@host_name.com", "x@y.xn--"):
        assert both(BUILTIN["email"], text) == [], text


@pytest.mark.parametrize(
    ("value", "region"),
    [("09-7625400", "IL"), ("090-1234-5678", "JP"), ("13812345678", "CN"),
     ("020 7946 0958", "GB"), ("(212) 555-0100", "US")],
)  # fmt: skip
def test_national_numbers_of_any_listed_region(value: str, region: str) -> None:
    regions = builtin("phone", regions=("US", "GB", "IL", "JP", "CN"))
    assert both(regions, f"call {value} today") == [value]
    assert both(builtin("phone", regions=(region,)), f"call {value} today") == [value]
    if region != "US":  # the default, US alone, does not read it as a number
        assert both(BUILTIN["phone"], f"call {value} today") == []


@pytest.mark.parametrize("value", ["078-05-1123", "078 05 1123", "078.05.1123"])
def test_ssns_with_dashes_spaces_or_dots(value: str) -> None:
    assert both(BUILTIN["us_ssn"], f"ssn {value}.") == [value]


def test_not_ssns() -> None:
    for text in ("078-05 1123", "666-05-1123", "078-00-1123", "078-05-0000", "v1.078.05.1123",
                 "078051123", "ssn 078051123"):  # fmt: skip
        assert both(BUILTIN["us_ssn"], text) == [], text


def test_bare_ssns_only_after_a_context_word() -> None:
    bare = builtin("us_ssn", bare=True)
    assert both(bare, "SSN: 078051120") == ["078051120"]
    assert both(bare, "Social Security No. 078051120") == ["078051120"]
    assert both(bare, "his social security number is 078-05-1120") == ["078-05-1120"]
    assert both(bare, "order 078051120 shipped") == []
    assert both(bare, "SSN: 666051120") == []
    assert both(bare, "also 078-05-1123 alone") == ["078-05-1123"]  # the separated form too


def test_policy_files_name_regions_and_bare_ssns() -> None:
    policies = parse(
        "policies:\n"
        "  - {name: p, action: redact, detect: [{phone: {regions: [GB, JP]}},"
        " {phone: {region: IL}}, {us_ssn: {bare: true}}]}\n",
        "policies.yaml",
    )
    regional, israeli, ssn = policies.policies[0].detectors
    assert both(regional, "tel 090-1234-5678") == ["090-1234-5678"]
    assert both(israeli, "tel 09-7625400") == ["09-7625400"]
    assert both(ssn, "ssn: 078051120") == ["078051120"]
    with pytest.raises(PolicyFileError, match="ZZ"):
        parse("policies:\n  - {name: p, action: redact, detect: [{phone: {regions: [ZZ]}}]}\n",
              "policies.yaml")  # fmt: skip


def test_uatp_cards_start_with_one() -> None:
    assert both(BUILTIN["credit_card"], "card 122000000000003 on file") == ["122000000000003"]
    assert both(BUILTIN["credit_card"], "card 122000000000004 on file") == []  # Luhn fails
