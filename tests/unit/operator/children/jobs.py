"""The job the builder tests start from, and what they read of a container."""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_operator.children.endpoints import endpoints_data
from grpojob_operator.settings import OperatorSettings

from ..conftest import job_body

SETTINGS = OperatorSettings(cluster_domain="cluster.example", ray_image="example/ray:1")


def job(**spec_overrides) -> api.GRPOJob:
    """The `demo` job of `conftest.job_body`, with ``spec_overrides``."""
    body = job_body()
    body["spec"].update(spec_overrides)
    return parse_job(body)


def env_of(container: dict) -> dict[str, dict]:
    """A container's environment variables, by name."""
    return {e["name"]: e for e in container["env"]}


TOOL_CALL = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
AGENT = "example_single_tool_call_simple_agent"


def gym_body(**nemo_gym_fields) -> dict:
    """The `demo` job with a plain environment `math` and a NeMo Gym environment `tools`."""
    body = job_body()
    body["spec"]["environments"] = [
        {"name": "math", "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"]},
        {"name": "tools", "port": 9000, "nemoGym": {"configPaths": [TOOL_CALL], "agent": AGENT, **nemo_gym_fields}},
    ]
    return body


GYM_SETTINGS = OperatorSettings(nemo_gym_image="example/nemo-gym:1")
GYM_JOB = parse_job(gym_body())
GYM_ENV = GYM_JOB.spec.environments[1]


def gym_endpoints(ip: str = "10.0.0.2") -> dict[str, str]:
    """The endpoints' data of `GYM_JOB` with the head at ``ip``."""
    return endpoints_data(GYM_JOB, GYM_SETTINGS, ip, 1)
