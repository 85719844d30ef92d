"""Which URLs an environment's rollouts go to: the replica URLs `grpojob run` starts, or, on Kubernetes, the
addresses of the ready pods behind the environment's headless Service, looked up again for every batch (a
pod that was replaced drops out; one that became ready joins)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import urlsplit

EnvironmentURLs = Mapping[str, str | Sequence[str]]
"""Each environment's root URL, or the URLs of its replicas (`grpojob run` starts `replicas` processes of an
environment; in the cluster its replicas are the pods behind one headless Service's name)."""

Lookup = Callable[[str, int], Awaitable[Sequence[str]]]
"""A host name and port to the addresses it resolves to."""


def replica_urls(environment_urls: EnvironmentURLs) -> dict[str, tuple[str, ...]]:
    """Every environment's URLs as a tuple (one for a single URL); raises `ValueError` for an empty list."""
    urls = {name: (value,) if isinstance(value, str) else tuple(value) for name, value in environment_urls.items()}
    if empty := sorted(name for name, value in urls.items() if not value):
        raise ValueError(f"environments without a URL: {empty}")
    return urls


def with_address(url: str, address: str) -> str:
    """``url`` with its host replaced by the IP ``address`` (bracketed when IPv6), port and path kept."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    return parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()


def names_a_host(url: str) -> bool:
    """Whether ``url``'s host is a name to look up rather than an IP address."""
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return bool(host)
    return False


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver; a headless Service's name: its ready pods)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def resolve_replicas(
    urls: Mapping[str, tuple[str, ...]], lookup: Lookup = system_lookup
) -> dict[str, tuple[str, ...]]:
    """``urls`` (`replica_urls`') with each URL whose host is a name replaced by one URL per address the name
    resolves to, in a stable order. A name that does not resolve (a headless Service with no ready pod)
    stays as it is: its requests fail, are retried and are reported like any unreachable replica's."""

    async def expand(url: str) -> tuple[str, ...]:
        if not names_a_host(url):
            return (url,)
        parts = urlsplit(url)
        try:
            addresses = await lookup(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        except OSError:
            return (url,)
        return tuple(with_address(url, address) for address in sorted(set(addresses))) or (url,)

    distinct = sorted({url for replicas in urls.values() for url in replicas})
    expanded = dict(zip(distinct, await asyncio.gather(*(expand(url) for url in distinct)), strict=True))
    return {name: tuple(dict.fromkeys(e for url in replicas for e in expanded[url])) for name, replicas in urls.items()}
