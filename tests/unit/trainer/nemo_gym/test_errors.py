"""Which NeMo Gym 500s wrap a client error: bodies shaped as nemo_gym 0.4.0's exception middleware writes
them (a JSON string holding the inner server's body as a Python bytes literal, one wrap per hop)."""

from __future__ import annotations

import json

from grpojob_trainer.nemo_gym.errors import inner_client_error

OUR_400 = {
    "error": {
        "message": "temperature=0.7 differs from the training temperature=1.0",
        "type": "BadRequestError",
        "param": "temperature",
        "code": 400,
    }
}


def gym_wrap(server: str, inner_body: bytes) -> bytes:
    """The body a NeMo Gym server answers with status 500 when its call to an inner server failed."""
    return json.dumps(f"Hit an exception in {server} calling an inner server: {inner_body}").encode()


def test_a_400_from_the_engine_through_the_model_server_and_the_agent_is_a_client_error():
    model = gym_wrap("VLLMModel___policy_model", json.dumps(OUR_400).encode())
    agent = gym_wrap("SimpleAgent___simple_agent", model)

    found = inner_client_error(agent.decode())

    assert found is not None
    assert found.servers == ("SimpleAgent___simple_agent", "VLLMModel___policy_model")
    assert found.status == 400
    assert found.message == OUR_400["error"]["message"]
    assert "temperature=0.7 differs" in str(found) and "SimpleAgent___simple_agent" in str(found)


def test_vllms_flat_error_object_and_fastapis_validation_errors_are_client_errors():
    vllm = {"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}
    validation = {"detail": [{"type": "missing", "loc": ["body", "response"], "msg": "Field required"}]}

    assert inner_client_error(gym_wrap("VLLMModel___m", json.dumps(vllm).encode()).decode()).status == 404
    found = inner_client_error(gym_wrap("SimpleAgent___a", json.dumps(validation).encode()).decode())
    assert (found.status, found.message) == (422, "body.response: Field required")


def test_a_crash_or_a_5xx_inside_or_a_body_that_is_not_gyms_wrap_is_not_a_client_error():
    crashed = json.dumps("ValueError('verify failed')").encode()
    server_error = json.dumps({"error": {"message": "engine died", "code": 500}}).encode()

    assert inner_client_error(gym_wrap("SimpleAgent___a", gym_wrap("Resources___r", crashed)).decode()) is None
    assert inner_client_error(gym_wrap("SimpleAgent___a", server_error).decode()) is None
    assert inner_client_error(gym_wrap("SimpleAgent___a", b"").decode()) is None
    assert inner_client_error(json.dumps(OUR_400)) is None, "a 4xx body not wrapped by Gym is not a Gym 500"
    assert inner_client_error("Internal Server Error") is None
    assert inner_client_error(json.dumps("Hit an exception in X calling an inner server: __import__('os')")) is None
