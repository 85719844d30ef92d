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


_INT64_MAX = 2**63 - 1
_BINARY_EXPONENTS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_EXPONENTS = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def held_as_int64(text: str) -> bool:
    """Whether Kubernetes holds the quantity ``text`` as a whole int64, which is what CEL's
    `quantity(x).isInteger()` answers (apimachinery's `Quantity.AsInt64`). Not the same as being whole:
    `ParseQuantity` keeps an int64 only on its fast path (few digits; a binary suffix only without a
    fraction and while `15 - digits - 3·exponent/10 - 1 >= 0`, so `1Pi`, `1Ei` and `1.5Gi` are not), and
    an int64 of negative scale (`1000m`) is no integer to it."""
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        return False
    digits = match["number"].lstrip("+-")
    num, _, denom = digits.partition(".")
    num = num.lstrip("0") or "0"
    if match["exponent"] is not None:
        binary, exponent = False, int(match["exponent"])
    elif (match["si"] or "") in _BINARY_EXPONENTS:
        binary, exponent = True, _BINARY_EXPONENTS[match["si"]]
    else:
        binary, exponent = False, _DECIMAL_EXPONENTS[match["si"] or ""]
    if binary:
        if denom or 15 - len(num) - int(exponent * 3 / 10) - 1 < 0:
            return False
        return int(num) << exponent <= _INT64_MAX
    if 18 - (len(num) + len(denom)) < 0:
        return False
    scale = exponent - len(denom)
    if scale < 0:
        return False
    return int(num + denom) * 10**scale <= _INT64_MAX
