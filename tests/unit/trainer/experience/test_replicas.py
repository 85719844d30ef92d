"""Which URLs an environment's rollouts go to: replica URLs as given, a Service name as its pods' addresses."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from grpojob_trainer.experience.replicas import replica_urls, resolve_replicas, system_lookup, with_address


def lookup_of(table: dict[str, Sequence[str]]):
    async def lookup(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return table[host]

    return lookup


def test_a_service_name_becomes_one_url_per_ready_pod_in_a_stable_order():
    urls = replica_urls({"math": "http://demo-env-math.rl.svc.cluster.local:8080"})
    pods = lookup_of({"demo-env-math.rl.svc.cluster.local": ["10.0.0.9", "10.0.0.7", "10.0.0.9"]})

    resolved = asyncio.run(resolve_replicas(urls, pods))

    assert resolved == {"math": ("http://10.0.0.7:8080", "http://10.0.0.9:8080")}


def test_addresses_and_names_that_do_not_resolve_are_kept_as_they_are():
    urls = replica_urls(
        {"local": ["http://127.0.0.1:9001", "http://127.0.0.1:9002"], "starting": "http://demo-env-new.rl.svc:8080"}
    )

    resolved = asyncio.run(resolve_replicas(urls, lookup_of({})))

    assert resolved == {
        "local": ("http://127.0.0.1:9001", "http://127.0.0.1:9002"),
        "starting": ("http://demo-env-new.rl.svc:8080",),
    }


def test_an_environment_and_its_agent_name_share_the_same_resolved_replicas():
    url = "http://demo-env-gym.rl.svc:8000"
    resolved = asyncio.run(
        resolve_replicas(replica_urls({"gym": url, "gym_agent": url}), lookup_of({"demo-env-gym.rl.svc": ["10.1.0.2"]}))
    )
    assert resolved["gym"] == resolved["gym_agent"] == ("http://10.1.0.2:8000",)


@pytest.mark.parametrize(
    ("url", "address", "expected"),
    [
        ("http://svc.ns.svc:8080", "10.0.0.1", "http://10.0.0.1:8080"),
        ("http://svc.ns.svc:8080/v1", "fd00::5", "http://[fd00::5]:8080/v1"),
        ("http://svc.ns.svc", "10.0.0.1", "http://10.0.0.1"),
    ],
)
def test_the_address_replaces_the_host_and_keeps_port_and_path(url, address, expected):
    assert with_address(url, address) == expected


def test_the_system_resolver_finds_the_loopback_name():
    assert "127.0.0.1" in asyncio.run(system_lookup("localhost", 80))
