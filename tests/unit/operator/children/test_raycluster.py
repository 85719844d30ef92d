"""The RayCluster and the generation Service."""

from __future__ import annotations

from grpojob_operator.children.raycluster import build_generation_service, build_raycluster
from grpojob_operator.children.trainer import build_trainer_job

from .jobs import SETTINGS, job


def test_raycluster_has_a_cpu_head_and_gpu_groups_sized_from_the_spec():
    cluster = build_raycluster(job(), SETTINGS)["spec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"]["requests"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert groups["generation"]["replicas"] == 2
    assert groups["policy"]["replicas"] == 1
    policy = groups["policy"]["template"]["spec"]["containers"][0]
    assert policy["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # KubeRay pastes rayStartParams into a shell command line: the JSON must be single-quoted.
    assert groups["generation"]["rayStartParams"]["resources"] == """'{"generation": 1}'"""
    # One policy rank per GPU: a policy pod offers one unit of the `policy` resource per GPU.
    assert groups["policy"]["rayStartParams"]["resources"] == """'{"policy": 4}'"""
    assert head["image"] == "example/ray:1"


def test_cpu_only_groups_request_no_gpu():
    cluster = build_raycluster(job(training={"gpusPerReplica": 0}), SETTINGS)["spec"]
    policy = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "policy")
    assert "nvidia.com/gpu" not in policy["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert policy["rayStartParams"]["resources"] == """'{"policy": 1}'"""  # one CPU rank per pod


def test_generation_service_is_headless_over_the_generation_workers():
    service = build_generation_service(job())["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == {"ray.io/cluster": "demo", "grpo.dev/serves-generation": "true"}
    cluster = build_raycluster(job(), SETTINGS)["spec"]
    serving = {
        g["groupName"]
        for g in cluster["workerGroupSpecs"]
        if service["selector"].items() <= {"ray.io/cluster": "demo", **g["template"]["metadata"]["labels"]}.items()
    }
    assert serving == {"generation"}
    assert service["ports"][0]["port"] == 8000


def test_every_ray_process_runs_with_token_auth_and_the_jobs_token():
    j = job()
    cluster = build_raycluster(j, SETTINGS)["spec"]
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay creates the Secret `demo` with the token
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    token = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "demo", "key": "auth_token"}}}
    for template in templates:
        env = template["spec"]["containers"][0]["env"]
        assert {"name": "RAY_AUTH_MODE", "value": "token"} in env and token in env
        assert all(var.get("value") != "disabled" for var in env)


def test_ray_pods_mount_no_api_token_and_write_only_to_their_volumes():
    cluster = build_raycluster(job(), SETTINGS)["spec"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]  # Ray's session directory, /tmp/ray
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def colocated_job(**overrides):
    one_each = {"replicas": 2, "gpusPerReplica": 1}
    return job(generation=one_each, training=one_each, **overrides)


def test_an_on_policy_job_whose_engines_match_its_ranks_is_colocated_in_one_gpu_group():
    cluster = build_raycluster(colocated_job(), SETTINGS)["spec"]
    (group,) = cluster["workerGroupSpecs"]
    assert (group["groupName"], group["replicas"]) == ("colocated", 2)
    # Each pod offers Ray one engine and one policy rank, which share its one GPU.
    assert group["rayStartParams"]["resources"] == """'{"generation": 1, "policy": 1}'"""
    container = group["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["ports"] == [{"name": "http", "containerPort": 8000}]  # it serves generation
    split = build_raycluster(colocated_job(placement="split"), SETTINGS)["spec"]["workerGroupSpecs"]
    policy = next(g for g in split if g["groupName"] == "policy")["template"]["spec"]["containers"][0]
    assert container["volumeMounts"] == policy["volumeMounts"]  # the policy's claims, as a policy pod mounts them
    # The generation Service selects the pods that serve, whatever the placement: here the colocated pod. It is
    # one Service for both, so a job suspended and resumed with the other placement keeps finding its engines.
    assert group["template"]["metadata"]["labels"]["grpo.dev/serves-generation"] == "true"
    assert build_generation_service(colocated_job()) == build_generation_service(colocated_job(placement="split"))


def test_asynchronous_grpo_and_a_split_placement_keep_engines_on_gpus_of_their_own():
    asynchronous = colocated_job(grpo={"maxOffPolicySteps": 1})
    for j in (asynchronous, colocated_job(placement="split")):
        groups = [g["groupName"] for g in build_raycluster(j, SETTINGS)["spec"]["workerGroupSpecs"]]
        assert groups == ["generation", "policy"]
    assert asynchronous.spec.resolved_placement == "split"
    # A share of the GPU set for an engine of its own (stored by older versions, 0.9) keeps the job split.
    stored = {"replicas": 2, "gpusPerReplica": 1, "gpuMemoryUtilization": 0.9}
    assert job(generation=stored, training={"replicas": 2, "gpusPerReplica": 1}).spec.resolved_placement == "split"
    assert colocated_job().spec.engine_memory_share(shares_gpu=True) == 0.35


def test_worker_pods_fit_a_one_gpu_node_of_8_cpus_and_32_gib_by_default():
    (group,) = build_raycluster(colocated_job(), SETTINGS)["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1"}
    assert resources["limits"] == {"memory": "24Gi", "nvidia.com/gpu": "1"}  # no CPU limit: no throttling
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_worker_pods_take_cpu_memory_and_shared_memory_from_the_spec():
    sized = {"replicas": 2, "gpusPerReplica": 1, "resources": {"cpu": "6", "memory": "60Gi", "sharedMemory": "20Gi"}}
    j = job(generation={"replicas": 2, "gpusPerReplica": 1, "resources": {"cpu": "1"}}, training=sized)
    (group,) = build_raycluster(j, SETTINGS)["spec"]["workerGroupSpecs"]  # colocated: the policy's resources
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "6", "memory": "60Gi", "nvidia.com/gpu": "1"}
    shm = next(v for v in group["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["sizeLimit"] == "20Gi"
    split = {
        g["groupName"]: g
        for g in build_raycluster(
            job(**{**j.spec.model_dump(by_alias=True, exclude_none=True), "placement": "split"}), SETTINGS
        )["spec"]["workerGroupSpecs"]
    }
    generation = split["generation"]["template"]["spec"]["containers"][0]["resources"]
    assert generation["requests"] == {"cpu": "1", "memory": "24Gi", "nvidia.com/gpu": "1"}  # defaults for the rest


def test_a_pods_shared_memory_never_defaults_to_more_than_its_memory():
    small = {"replicas": 1, "gpusPerReplica": 1, "resources": {"memory": "4Gi"}}
    (group,) = build_raycluster(job(generation={"replicas": 1, "gpusPerReplica": 1}, training=small), SETTINGS)["spec"][
        "workerGroupSpecs"
    ]
    shm = next(v for v in group["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["sizeLimit"] == "4Gi"
