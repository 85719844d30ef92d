"""A GRPOJob whose environment is reward functions from a file in a ConfigMap, as a user makes it (`kubectl create
configmap --from-file`): the operator mounts the file into the environment's pods, which run the environment
image's reward server; the job trains to Succeeded with every rollout scored. A file that does not import stops
the environment's pod, and the import error reaches the `EnvironmentsReady` condition before any step."""

from __future__ import annotations

import re
import time

import pytest
from kubernetes import client

from tests.e2e.test_grpojob import GROUP, PLURAL, VERSION, tiny_job, trainer_log, watch_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STEPS = 6
REWARD_FILE = '''
def digits(completions, expected_answer, **kwargs):
    """Partial credit the tiny model can earn: the share of the answer's characters that are digits, and the
    expected digit in it."""
    rewards = []
    for completion, answer in zip(completions, expected_answer):
        text = "".join(completion[0]["content"].split())
        share = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        rewards.append(0.5 * share + 0.5 * (str(answer) in text))
    return rewards
'''


def rewards_job(name: str, claim: str, config_map: str) -> dict:
    """The suite's tiny job on the arithmetic rows, scored by `digits` of the ConfigMap's file and the built-in
    math checker."""
    job = tiny_job(name, claim, STEPS, backoff_limit=0)
    del job["spec"]["checkpointing"]
    rewards = {
        "path": "rewards.py",
        "configMap": {"name": config_map},
        "functions": [{"name": "digits"}, {"builtin": "math", "weight": 0.5}],
    }
    job["spec"]["environments"] = [{"name": "arithmetic", "rewards": rewards}]
    return job


def test_a_grpojob_trains_on_reward_functions_from_a_config_map(api_client, namespace, grpo_data):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "my-rewards"}, "data": {"rewards.py": REWARD_FILE}}
    )
    custom = client.CustomObjectsApi(api_client)
    started = time.monotonic()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, rewards_job("rewards", grpo_data, "my-rewards")
    )

    watched = watch_job(api_client, namespace, "rewards", 1200)

    print(f"GRPOJob rewards: {watched.phases} in {time.monotonic() - started:.0f}s; rewards {watched.rewards}")
    assert watched.status["phase"] == "Succeeded", watched.status
    assert watched.status["step"] == STEPS
    log = trainer_log(core, namespace, "rewards", 1)
    failed = re.findall(rf"step \d+/{STEPS} .* failed rollouts (\d+)/\d+", log)
    assert failed == ["0"] * STEPS, log[-3000:]
    assert watched.rewards and all(0.0 <= reward <= 1.5 for reward in watched.rewards.values())


def test_a_reward_file_that_does_not_import_is_named_in_environments_ready(api_client, namespace, grpo_data):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "broken-rewards"}, "data": {"rewards.py": "import numpy_is_not_here\n"}}
    )
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, rewards_job("broken", grpo_data, "broken-rewards")
    )

    def environments_ready(status: dict) -> dict:
        return next((c for c in status.get("conditions") or [] if c["type"] == "EnvironmentsReady"), {})

    def import_error_named(status: dict) -> bool:
        return "does not import" in environments_ready(status).get("message", "")

    watched = watch_job(api_client, namespace, "broken", 600, until=import_error_named)

    condition = environments_ready(watched.status)
    print(f"EnvironmentsReady: {condition}")
    assert (condition["status"], condition["reason"]) == ("False", "EnvironmentFailing")
    assert (
        "reward file /etc/grpojob-rewards/rewards.py does not import: ModuleNotFoundError: "
        "No module named 'numpy_is_not_here' (rewards.py, line 1)"
    ) in condition["message"]
    assert not watched.status.get("step"), "no step ran"
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "broken")
