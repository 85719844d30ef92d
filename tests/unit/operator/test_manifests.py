"""Children are built as plain dicts from the GRPOJob, with deterministic names and an owner."""

from __future__ import annotations

import json

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_operator import manifests
from grpojob_operator.settings import OperatorSettings

from .conftest import job_body

SETTINGS = OperatorSettings(cluster_domain="cluster.example", ray_image="example/ray:1")


def job(**spec_overrides) -> api.GRPOJob:
    body = job_body()
    body["spec"].update(spec_overrides)
    return parse_job(body)


def test_every_child_is_owned_by_the_job_as_its_controller():
    j = job()
    children = [
        manifests.build_raycluster(j, SETTINGS),
        manifests.build_config_map(j),
        manifests.build_generation_service(j),
        manifests.build_network_policy(j),
        manifests.build_endpoints(j, SETTINGS, "10.0.0.7", 1),
        manifests.build_progress(j),
        manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1),
        manifests.build_environment_service(j, j.spec.environments[0]),
        manifests.build_trainer_job(j, SETTINGS, 1),
        *manifests.build_trainer_rbac(j),
    ]
    for child in children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["kind"] == "GRPOJob" and owner["uid"] == j.metadata.uid and owner["controller"] is True
        assert child["metadata"]["namespace"] == "team-a"
        assert child["metadata"]["labels"]["grpo.dev/job"] == "demo"
    assert [c["metadata"]["name"] for c in children] == [
        "demo",
        "demo-config",
        "demo-generation",
        "demo-network",
        "demo-endpoints",
        "demo-progress",
        "demo-env-math",
        "demo-env-math",
        "demo-trainer",
        "demo-trainer",
        "demo-trainer",
        "demo-trainer",
    ]


def test_raycluster_has_a_cpu_head_and_gpu_groups_sized_from_the_spec():
    cluster = manifests.build_raycluster(job(), SETTINGS)["spec"]
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
    cluster = manifests.build_raycluster(job(training={"gpusPerReplica": 0}), SETTINGS)["spec"]
    policy = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "policy")
    assert "nvidia.com/gpu" not in policy["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert policy["rayStartParams"]["resources"] == """'{"policy": 1}'"""  # one CPU rank per pod


def test_endpoints_are_the_addresses_of_the_jobs_services():
    data = manifests.build_endpoints(job(), SETTINGS, "10.0.0.7", 2)["data"]
    assert data == {
        "RAY_GCS_ADDRESS": "demo-head-svc.team-a.svc.cluster.example:6379",
        "RAY_HEAD_POD_IP": "10.0.0.7",
        "RAY_DASHBOARD_URL": "http://demo-head-svc.team-a.svc.cluster.example:8265",
        "POLICY_BASE_URL": "http://demo-generation.team-a.svc.cluster.example:8000/v1",
        "PENGUIN_ENV_URLS": json.dumps({"math": "http://demo-env-math.team-a.svc.cluster.example:8080"}),
        "GRPOJOB_NAME": "demo",
        "GRPOJOB_ATTEMPT": "2",
    }


def test_generation_service_is_headless_over_the_generation_workers():
    service = manifests.build_generation_service(job())["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == {"ray.io/cluster": "demo", "ray.io/group": "generation"}
    assert service["ports"][0]["port"] == 8000


def test_environment_and_trainer_read_the_endpoints_through_env_from():
    j = job()
    deployment = manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)
    trainer = manifests.build_trainer_job(j, SETTINGS, 3)
    for pod in (deployment["spec"]["template"]["spec"], trainer["spec"]["template"]["spec"]):
        assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "demo-endpoints"}}]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert trainer["metadata"]["labels"]["grpo.dev/attempt"] == "3"
    assert trainer["spec"]["template"]["metadata"]["labels"]["grpo.dev/attempt"] == "3"
    assert trainer["spec"]["backoffLimit"] == 0, "the operator, not the Job controller, counts attempts"


def test_secrets_stay_secret_references():
    j = job(
        environments=[
            {"name": "judge", "env": [{"name": "JUDGE_KEY", "secretKeyRef": {"name": "judge", "key": "token"}}]}
        ]
    )
    container = manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert {"name": "JUDGE_KEY", "valueFrom": {"secretKeyRef": {"name": "judge", "key": "token"}}} in container["env"]
    assert not any(var.get("value") for var in container["env"] if var["name"] == "JUDGE_KEY")


def test_trainer_may_only_touch_its_own_progress_config_map():
    role = next(m for m in manifests.build_trainer_rbac(job()) if m["kind"] == "Role")
    (rule,) = role["rules"]
    assert rule["resources"] == ["configmaps"] and rule["resourceNames"] == ["demo-progress"]
    assert rule["verbs"] == ["get", "update", "patch"]


def test_job_config_renders_the_spec_the_trainer_parses_back():
    j = job()
    rendered = manifests.render_job_config(j)
    import yaml

    again = parse_job(yaml.safe_load(rendered))
    assert again.spec == j.spec


def test_every_ray_process_runs_with_token_auth_and_the_jobs_token():
    j = job()
    cluster = manifests.build_raycluster(j, SETTINGS)["spec"]
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay creates the Secret `demo` with the token
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    token = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "demo", "key": "auth_token"}}}
    for template in templates:
        env = template["spec"]["containers"][0]["env"]
        assert {"name": "RAY_AUTH_MODE", "value": "token"} in env and token in env
        assert all(var.get("value") != "disabled" for var in env)


def test_ray_pods_mount_no_api_token_and_write_only_to_their_volumes():
    cluster = manifests.build_raycluster(job(), SETTINGS)["spec"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]  # Ray's session directory, /tmp/ray
        assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_the_network_policy_admits_only_the_jobs_own_pods_to_them():
    j = job()
    policy = manifests.build_network_policy(j)
    assert policy["metadata"]["name"] == "demo-network"
    own = {"grpo.dev/job": "demo", "grpo.dev/job-uid": j.metadata.uid}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": own}}]},
        {"ports": [{"port": 9090}, {"port": 6006}]},  # Prometheus and TensorBoard readers, from anywhere
    ]
    # Every pod of the job is selected (and so may reach the others): they all carry both labels.
    cluster = manifests.build_raycluster(j, SETTINGS)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    templates.append(manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"])
    for template in templates:
        assert own.items() <= template["metadata"]["labels"].items()


def test_checkpoints_live_where_the_policy_actor_writes_them():
    j = job(checkpointing={"pvc": {"claimName": "ckpt"}, "interval": 5})
    cluster = manifests.build_raycluster(j, SETTINGS)["spec"]
    policy = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "policy")["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}} in policy[
        "volumes"
    ]
    trainer_env = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GRPOJOB_CHECKPOINT_DIR", "value": "/data/checkpoints/checkpoints/demo"} in trainer_env


def test_every_pod_carries_the_job_uid_so_leftovers_of_a_same_named_job_are_not_adopted():
    j = job()
    cluster = manifests.build_raycluster(j, SETTINGS)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    templates.append(manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"])
    for template in templates:
        assert template["metadata"]["labels"]["grpo.dev/job-uid"] == j.metadata.uid


def test_a_claim_shared_by_model_dataset_and_checkpoints_is_one_volume_per_pod():
    # The kubelet mounts a claim once per pod: a second volume of it never mounts (found on the real node).
    claim = {"claimName": "grpo-data"}
    j = job(
        model={"path": "tiny-model", "pvc": claim},
        dataset={"path": "train.jsonl", "pvc": claim},
        checkpointing={"pvc": claim, "path": "checkpoints"},
    )
    trainer = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]
    policy = next(
        g for g in manifests.build_raycluster(j, SETTINGS)["spec"]["workerGroupSpecs"] if g["groupName"] == "policy"
    )["template"]["spec"]
    # Both write to it: the policy its checkpoints, the trainer its logs (beside the checkpoints by default).
    for pod in (trainer, policy):
        claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert [v["persistentVolumeClaim"] for v in claims] == [{"claimName": "grpo-data", "readOnly": False}]
        names = {v["name"] for v in pod["volumes"]}
        assert {m["name"] for m in pod["containers"][0]["volumeMounts"]} <= names
    mounts = {m["mountPath"]: m for m in trainer["containers"][0]["volumeMounts"]}
    assert mounts[manifests.MODEL_MOUNT]["readOnly"] and mounts[manifests.DATASET_MOUNT]["readOnly"]
    assert not mounts[manifests.LOG_MOUNT]["readOnly"]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_the_trainer_writes_each_attempts_logs_beside_the_checkpoints_on_their_claim():
    j = job(checkpointing={"pvc": {"claimName": "runs", "path": "team"}})
    (container,) = manifests.build_trainer_job(j, SETTINGS, 2)["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert env["GRPOJOB_LOG_DIR"]["value"] == f"{manifests.LOG_MOUNT}/logs/demo/attempt-2"
    assert env["GRPOJOB_CHECKPOINT_DIR"]["value"] == f"{manifests.CHECKPOINT_MOUNT}/checkpoints/demo"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == manifests.LOG_MOUNT]
    assert mount["subPath"] == "team" and not mount["readOnly"]


def test_logs_go_to_their_own_claim_and_path_and_without_a_claim_stay_in_the_pod():
    j = job(logging={"pvc": {"claimName": "logs"}, "path": "grpo/demo"})
    pod = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]
    assert {"name": "logs", "persistentVolumeClaim": {"claimName": "logs", "readOnly": False}} in pod["volumes"]
    env = _env(pod["containers"][0])
    assert env["GRPOJOB_LOG_DIR"]["value"] == f"{manifests.LOG_MOUNT}/grpo/demo/attempt-1"
    (container,) = manifests.build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert _env(container)["GRPOJOB_LOG_DIR"]["value"] == "/tmp/logs/demo/attempt-1"


def test_the_trainer_serves_its_metrics_on_a_named_port():
    (container,) = manifests.build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090}]
    assert _env(container)["GRPOJOB_TRAINER_METRICS_PORT"]["value"] == "9090"


def test_tracking_credentials_come_from_the_secrets_the_job_names():
    j = job(
        logging={
            "mlflow": {"trackingUri": "http://mlflow:5000", "credentialsSecret": "mlflow-auth"},
            "wandb": {"project": "grpo", "apiKeySecret": {"name": "wandb", "key": "api-key"}},
        }
    )
    (container,) = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": "mlflow-auth"}} in container["envFrom"]
    assert _env(container)["WANDB_API_KEY"] == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
    }
    (plain,) = manifests.build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert "WANDB_API_KEY" not in _env(plain) and len(plain["envFrom"]) == 1


def test_tensorboard_reads_every_attempt_of_the_job_read_only_behind_its_own_service():
    j = job(logging={"pvc": {"claimName": "logs", "path": "team"}, "tensorboard": True})
    deployment = manifests.build_tensorboard_deployment(j, SETTINGS)
    service = manifests.build_tensorboard_service(j)
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "demo-tensorboard"
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == j.metadata.uid
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "example/ray:1"  # the trainer image has TensorBoard
    assert f"--logdir={manifests.LOG_MOUNT}/logs/demo" in container["command"]
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "logs", "readOnly": True}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["name"]]
    assert mount["readOnly"] and mount["subPath"] == "team"
    assert container["securityContext"]["readOnlyRootFilesystem"] and not pod["automountServiceAccountToken"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    trainer_labels = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= trainer_labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 6006, "targetPort": 6006}]


def test_each_roles_scheduling_reaches_its_pods_and_only_its_pods():
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    scheduling = {
        "head": {"nodeSelector": {"pool": "cpu"}, "priorityClassName": "system-head"},
        "generation": {
            "nodeSelector": {"pool": "gen"},
            "tolerations": [gpu],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}},
        },
        "policy": {"nodeSelector": {"pool": "train"}, "schedulerName": "gang", "labels": {"team": "rl"}},
        "environments": {"annotations": {"note": "env"}, "tolerations": [{"key": "spot", "value": "yes"}]},
        "trainer": {"priorityClassName": "trainer-high", "labels": {"team": "rl"}},
    }
    j = job(scheduling=scheduling)
    cluster = manifests.build_raycluster(j, SETTINGS)["spec"]
    head = cluster["headGroupSpec"]["template"]
    groups = {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    trainer = manifests.build_trainer_job(j, SETTINGS, 1)["spec"]["template"]
    environment = manifests.build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"]

    assert head["spec"]["nodeSelector"] == {"pool": "cpu"} and head["spec"]["priorityClassName"] == "system-head"
    assert groups["generation"]["spec"]["nodeSelector"] == {"pool": "gen"}
    assert groups["generation"]["spec"]["tolerations"] == [gpu]
    assert groups["generation"]["spec"]["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}
    }
    assert groups["policy"]["spec"]["schedulerName"] == "gang"
    assert groups["policy"]["metadata"]["labels"]["team"] == "rl"
    assert groups["policy"]["metadata"]["labels"]["grpo.dev/component"] == "policy"  # the operator's labels stay
    assert environment["metadata"]["annotations"] == {"note": "env"}
    assert environment["spec"]["tolerations"] == [{"key": "spot", "value": "yes"}]
    assert trainer["spec"]["priorityClassName"] == "trainer-high" and trainer["metadata"]["labels"]["team"] == "rl"
    # Nothing leaks to another role.
    assert "nodeSelector" not in trainer["spec"] and "tolerations" not in head["spec"]
    assert "affinity" not in groups["policy"]["spec"] and "priorityClassName" not in environment["spec"]


def test_without_scheduling_the_pod_templates_are_unchanged():
    plain = job()
    template = manifests.build_trainer_job(plain, SETTINGS, 1)["spec"]["template"]
    assert manifests.scheduled(template, api.PodScheduling()) == template
    assert (
        not {"nodeSelector", "tolerations", "affinity", "priorityClassName", "schedulerName"} & template["spec"].keys()
    )
