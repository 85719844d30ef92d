"""Kubernetes resource quantities (`500m`, `2Gi`, `1e3`, `.5`), read by Kubernetes' own grammar.

    <quantity>     ::= <signedNumber><suffix>
    <signedNumber> ::= <number> | <sign><number>          <sign>   ::= "+" | "-"
    <number>       ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>       ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>     ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>    ::= m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

(k8s.io/apimachinery `resource.ParseQuantity`; CEL's `isQuantity` and `quantity()` in the CRD.)
"""

from __future__ import annotations

import re
from decimal import Decimal

_GRAMMAR = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<si>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_MULTIPLIERS = {
    **{suffix: Decimal(2) ** (10 * (i + 1)) for i, suffix in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    "m": Decimal("1e-3"),
    **{suffix: Decimal(10) ** (3 * (i + 1)) for i, suffix in enumerate(("k", "M", "G", "T", "P", "E"))},
}


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity; ValueError when ``text`` is not one."""
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (such as 500m, 2Gi, 1e3 or .5)")
    number = Decimal(match["number"])
    if match["exponent"] is not None:
        return number.scaleb(int(match["exponent"]))
    return number * _MULTIPLIERS.get(match["si"] or "", Decimal(1))
