"""Rollout collection against real environment servers, and against servers that fail or never answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import httpx
import pydantic
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from grpojob_trainer.environments import get_environment
from grpojob_trainer.experience.rollouts import collect_rollouts
from grpojob_trainer.net.http import ThreadedServer
from grpojob_trainer.net.loopback import free_port


def rows(name: str, count: int, seed: int = 0) -> list[dict]:
    return get_environment(name).make_rows(count, seed)


def test_rollouts_of_two_environments_come_back_in_input_order_with_metrics(environment_urls, policy_sampling):
    batch_rows = [row for pair in zip(rows("arithmetic", 3), rows("lookup", 3), strict=True) for row in pair]

    batch = asyncio.run(
        collect_rollouts(batch_rows, environment_urls, concurrency=4, timeout_s=60, retries=1, sampling=policy_sampling)
    )

    assert [o.row_index for o in batch.outcomes] == list(range(6))
    assert [o.env_name for o in batch.outcomes] == ["arithmetic", "lookup"] * 3
    assert batch.failures == []
    for outcome in batch.outcomes:
        assert outcome.sample.group_index == outcome.row_index
        assert 0.0 <= outcome.sample.reward <= 1.0
    assert batch.metrics["rollout/count"] == 6
    assert batch.metrics["rollout/failed"] == 0
    assert batch.metrics["rollout/turns/min"] == 1
    assert batch.metrics["rollout/turns/max"] >= 2
    assert batch.metrics["rollout/reward/mean"] == pytest.approx(sum(s.reward for s in batch.samples) / 6)
    for outcome in batch.outcomes:  # each rollout's own span, on the batch's clock
        assert 0 <= outcome.started_s < outcome.finished_s
    durations = [o.finished_s - o.started_s for o in batch.outcomes]
    assert batch.metrics["rollout/seconds/max"] == pytest.approx(max(durations))
    assert batch.metrics["rollout/seconds/min"] <= batch.metrics["rollout/seconds/p90"] <= max(durations)
    assert 0 <= batch.metrics["rollout/tail_s"] <= max(o.finished_s for o in batch.outcomes)


class FlakyProxy:
    """An environment server in front of a real one: the first attempt of every row answers 500, rows
    with ``"always_fail": true`` always do; it also records how many /run calls were in flight at once."""

    def __init__(self, upstream: str) -> None:
        self.attempts: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.app = FastAPI()

        @self.app.post("/run")
        async def run(request: Request) -> JSONResponse:
            row = await request.json()
            key = row["responses_create_params"]["input"][0]["content"] + str(row.get("always_fail"))
            self.attempts[key] = self.attempts.get(key, 0) + 1
            if row.get("always_fail") or self.attempts[key] == 1:
                return JSONResponse("Internal Server Error", status_code=500)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                async with httpx.AsyncClient(timeout=60) as client:
                    upstream_response = await client.post(f"{upstream}/run", json=row)
            finally:
                self.in_flight -= 1
            return JSONResponse(upstream_response.json(), status_code=upstream_response.status_code)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_500s_are_retried_and_rows_that_keep_failing_are_counted_not_dropped(environment_urls, policy_sampling):
    proxy = FlakyProxy(environment_urls["arithmetic"])
    batch_rows = rows("arithmetic", 6, seed=5)
    for index in (1, 4):
        batch_rows[index] = batch_rows[index] | {"always_fail": True}

    with ThreadedServer(proxy.app) as server:
        batch = asyncio.run(
            collect_rollouts(
                batch_rows,
                {"arithmetic": server.url},
                concurrency=2,
                timeout_s=30,
                retries=2,
                backoff_s=0.05,
                sampling=policy_sampling,
            )
        )

    assert [o.row_index for o in batch.failures] == [1, 4]
    assert all("answered 500" in o.error and "gave up after 3 attempts" in o.error for o in batch.failures)
    assert all(o.attempts == 2 for o in batch.outcomes if o.ok), "one 500, then success"
    assert all(o.finished_s >= o.started_s for o in batch.outcomes), "failures are timed too"
    assert len(batch.samples) == 4
    assert batch.metrics["rollout/failed"] == 2
    assert batch.metrics["rollout/failure_rate"] == pytest.approx(2 / 6)
    assert proxy.most_in_flight <= 2


@pytest.mark.timeout(30)  # a hang fails here instead of after the suite's 600 s
def test_a_server_that_never_answers_ends_in_counted_timeouts_not_a_hang(silent_server):
    batch = asyncio.run(
        collect_rollouts(rows("arithmetic", 3), {"arithmetic": silent_server}, timeout_s=0.5, retries=1, backoff_s=0.05)
    )

    assert [o.attempts for o in batch.failures] == [2, 2, 2]
    assert [o.row_index for o in batch.failures] == [0, 1, 2]
    assert all("timed out" in o.error for o in batch.failures)
    assert batch.samples == []
    assert batch.metrics["rollout/failed"] == 3


def test_a_refused_connection_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]

    batch = asyncio.run(
        collect_rollouts(
            rows("arithmetic", 1),
            {"arithmetic": f"http://127.0.0.1:{closed_port}"},
            retries=2,
            backoff_s=0.01,
            timeout_s=2,
        )
    )

    assert batch.failures[0].attempts == 3
    assert f"Cannot connect to host 127.0.0.1:{closed_port}" in batch.failures[0].error


def test_a_row_for_an_environment_without_a_url_is_an_error_before_any_request():
    with pytest.raises(KeyError, match="'lookup'"):
        asyncio.run(collect_rollouts(rows("lookup", 1), {"arithmetic": "http://127.0.0.1:1"}))


@pytest.mark.timeout(60)
def test_a_hung_environment_holds_a_step_only_until_its_deadline(silent_server):
    """Per-attempt timeouts alone would hold these rows for 3 waves x 3 attempts x 60 s; the deadline ends them."""
    batch = asyncio.run(
        collect_rollouts(
            rows("arithmetic", 6), {"arithmetic": silent_server}, concurrency=2, timeout_s=60, retries=2, deadline_s=1
        )
    )

    assert [o.row_index for o in batch.failures] == list(range(6))
    assert all("rollout deadline (rolloutDeadlineSeconds: 1s)" in o.error for o in batch.failures)
    assert batch.metrics["rollout/failed"] == 6


def test_a_200_that_is_not_a_run_result_is_a_failed_rollout_naming_the_field():
    app = FastAPI()

    @app.post("/run")
    async def run(request: Request) -> dict:
        return {**(await request.json()), "response": {"output": []}, "reward": "high"}

    with ThreadedServer(app) as server:
        batch = asyncio.run(collect_rollouts(rows("arithmetic", 1), {"arithmetic": server.url}, retries=2))

    [failure] = batch.failures
    assert failure.attempts == 1, "a malformed result is not retried"
    assert "not a /run result: reward: Input should be a valid number" in failure.error


def test_a_row_that_is_not_a_nemo_gym_row_is_an_error_before_any_request():
    row = rows("arithmetic", 1)[0]
    row["responses_create_params"]["temprature"] = 1.0
    with pytest.raises(pydantic.ValidationError, match=r"responses_create_params\.temprature"):
        asyncio.run(collect_rollouts([row], {"arithmetic": "http://127.0.0.1:1"}))


def gym_500_app(inner_body_of_row) -> FastAPI:
    """A /run that answers as a NeMo Gym agent does when a server it called failed: HTTP 500 whose body is a
    JSON string wrapping the inner body (nemo_gym 0.4.0's exception middleware); it counts the calls."""
    app = FastAPI()
    app.state.calls = 0

    @app.post("/run")
    async def run(request: Request) -> JSONResponse:
        app.state.calls += 1
        inner: bytes = inner_body_of_row(await request.json())
        return JSONResponse(f"Hit an exception in SimpleAgent___agent calling an inner server: {inner}", 500)

    return app


def test_a_gym_500_wrapping_a_4xx_fails_at_once_with_its_message_and_a_wrapped_crash_is_retried():
    refused = b'{"error":{"message":"top_p=0.5 differs from the training top_p=1.0","code":400}}'
    crashed = b"\"ValueError('the resources server crashed')\""
    app = gym_500_app(lambda row: crashed if row.get("crash") else refused)
    batch_rows = rows("arithmetic", 2)
    batch_rows[1] = batch_rows[1] | {"crash": True}

    with ThreadedServer(app) as server:
        batch = asyncio.run(
            collect_rollouts(batch_rows, {"arithmetic": server.url}, retries=2, backoff_s=0.01, timeout_s=10)
        )

    refused_outcome, crashed_outcome = batch.outcomes
    assert refused_outcome.attempts == 1
    assert "got HTTP 400" in refused_outcome.error and "top_p=0.5 differs" in refused_outcome.error
    assert crashed_outcome.attempts == 3 and "gave up after 3 attempts" in crashed_outcome.error
    assert app.state.calls == 4
    assert batch.metrics["rollout/failed"] == 2


class CountingProxy:
    """An environment replica in front of a real server: passes every /run on and counts them."""

    def __init__(self, upstream: str) -> None:
        self.runs = 0
        self.app = FastAPI()

        @self.app.post("/run")
        async def run(request: Request) -> JSONResponse:
            self.runs += 1
            async with httpx.AsyncClient(timeout=60) as client:
                upstream_response = await client.post(f"{upstream}/run", json=await request.json())
            return JSONResponse(upstream_response.json(), status_code=upstream_response.status_code)


def closed_port_url() -> str:
    """A loopback URL where nothing listens: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_rollouts_are_spread_evenly_over_an_environments_replicas(environment_urls, policy_sampling):
    first, second = CountingProxy(environment_urls["arithmetic"]), CountingProxy(environment_urls["arithmetic"])

    with ThreadedServer(first.app) as one, ThreadedServer(second.app) as two:
        batch = asyncio.run(
            collect_rollouts(
                rows("arithmetic", 8, seed=7),
                {"arithmetic": [one.url, two.url]},
                concurrency=8,
                timeout_s=30,
                retries=0,
                sampling=policy_sampling,
            )
        )

    assert len(batch.samples) == 8 and not batch.failures
    assert (first.runs, second.runs) == (4, 4)


def test_a_rollout_whose_replica_is_down_is_retried_on_the_next_replica(environment_urls, policy_sampling):
    replica = CountingProxy(environment_urls["arithmetic"])

    with ThreadedServer(replica.app) as alive:
        batch = asyncio.run(
            collect_rollouts(
                rows("arithmetic", 6, seed=8),
                {"arithmetic": [closed_port_url(), alive.url]},
                concurrency=6,
                timeout_s=30,
                retries=1,
                backoff_s=0.01,
                sampling=policy_sampling,
            )
        )

    assert len(batch.samples) == 6 and not batch.failures
    assert [o.attempts for o in batch.outcomes] == [2, 1, 2, 1, 2, 1], "rows sent first to the dead replica retried"
    assert replica.runs == 6


def test_an_environment_listed_with_no_url_is_refused_before_any_request():
    with pytest.raises(ValueError, match=r"environments without a URL: \['arithmetic'\]"):
        asyncio.run(collect_rollouts(rows("arithmetic", 1), {"arithmetic": []}))


def context_overflow_app() -> FastAPI:
    """A /run that answers as NeMo Gym 0.4.0's simple_agent does when its vllm_model got our generation
    server's context-length 400: an empty assistant message without token ids, cut "for length", reward 0
    (`tests/compat` shows the real servers answer so)."""
    app = FastAPI()

    @app.post("/run")
    async def run(request: Request) -> dict:
        message = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed"}
        message["content"] = [{"type": "output_text", "text": "", "annotations": []}]
        response = {"output": [message], "incomplete_details": {"reason": "max_output_tokens"}}
        return {**(await request.json()), "response": response, "reward": 0.0}

    return app


def test_a_prompt_longer_than_the_context_is_skipped_with_its_length_and_max_model_len(generation_server):
    long_row = rows("arithmetic", 1)[0]
    long_row["responses_create_params"]["input"] = [
        {"role": "user", "content": "1 + " * 1500 + "1 =", "type": "message"}
    ]
    counted = httpx.post(f"{generation_server.url}/tokenize", json={"messages": [long_row_message(long_row)]}).json()
    assert counted["count"] > counted["max_model_len"] == 1024

    with ThreadedServer(context_overflow_app()) as server:
        batch = asyncio.run(
            collect_rollouts(
                [long_row], {"arithmetic": server.url}, retries=2, generation_url=generation_server.base_url
            )
        )

    [failure] = batch.failures
    assert failure.prompt_too_long and failure.attempts == 1, "skipped at once, never retried"
    assert f"the prompt is {counted['count']} tokens and spec.generation.maxModelLen is 1024" in failure.error
    assert "Raise spec.generation.maxModelLen" in failure.error
    assert batch.metrics["rollout/prompt_too_long"] == 1 and batch.metrics["rollout/failed"] == 1


def long_row_message(row: dict) -> dict:
    [item] = row["responses_create_params"]["input"]
    return {"role": "user", "content": item["content"]}


def test_a_step_line_says_how_many_prompts_were_too_long():
    from grpojob_trainer.observability.metrics import step_line

    metrics = {"rollout/failed": 3.0, "rollout/count": 8.0, "rollout/prompt_too_long": 2.0}

    assert "failed rollouts 3/8 (2 prompts too long for spec.generation.maxModelLen)" in step_line(1, 4, metrics)
    assert "too long" not in step_line(1, 4, metrics | {"rollout/prompt_too_long": 0.0})


def test_rollouts_to_a_service_name_are_spread_over_the_pods_it_resolves_to(environment_urls, policy_sampling):
    first, second = CountingProxy(environment_urls["arithmetic"]), CountingProxy(environment_urls["arithmetic"])

    async def headless_service(host: str, port: int) -> list[str]:
        assert host == "demo-env-arithmetic.rl.svc.cluster.local"
        return ["127.0.0.2", "127.0.0.1"]

    port = free_port("127.0.0.1")
    with (
        ThreadedServer(first.app, host="127.0.0.1", port=port),
        ThreadedServer(second.app, host="127.0.0.2", port=port),
    ):
        batch = asyncio.run(
            collect_rollouts(
                rows("arithmetic", 8, seed=9),
                {"arithmetic": f"http://demo-env-arithmetic.rl.svc.cluster.local:{port}"},
                concurrency=8,
                timeout_s=30,
                retries=0,
                sampling=policy_sampling,
                lookup=headless_service,
            )
        )

    assert len(batch.samples) == 8 and not batch.failures
    assert (first.runs, second.runs) == (4, 4)


def test_a_service_name_with_no_ready_pod_fails_its_rollouts_naming_the_host():
    batch = asyncio.run(
        collect_rollouts(
            rows("arithmetic", 2),
            {"arithmetic": "http://demo-env-arithmetic.invalid:8080"},
            timeout_s=5,
            retries=1,
            backoff_s=0.01,
        )
    )

    assert not batch.samples and len(batch.failures) == 2
    assert all("demo-env-arithmetic.invalid" in failure.error for failure in batch.failures)
