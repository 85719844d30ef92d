"""What the operator writes for the pods parses with what the pods read it with (`grpojob_api.endpoints`),
and a key that is missing or renamed is refused by name."""

from __future__ import annotations

import pytest

from grpojob_api import endpoints
from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.endpoints import ContractError, Endpoints, TrainerEnv
from grpojob_operator.children.claims import model_path
from grpojob_operator.children.endpoints import build_endpoints, endpoints_data
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.trainer import build_trainer_job, render_job_config
from grpojob_operator.settings import OperatorSettings
from grpojob_trainer.environments.__main__ import parse_args as environment_args

from ..operator.conftest import job_body

SETTINGS = OperatorSettings(cluster_domain="cluster.example")


def pod_environment(job: api.GRPOJob, container: dict, head_ip: str = "10.0.0.7", attempt: int = 1) -> dict[str, str]:
    """A container's environment as the kubelet assembles it: the endpoints ConfigMap (``envFrom``), then
    its own literal ``env`` entries."""
    assert container["envFrom"] == [{"configMapRef": {"name": f"{job.metadata.name}-endpoints"}}]
    environ = dict(endpoints_data(job, SETTINGS, head_ip, attempt))
    environ.update({var["name"]: var["value"] for var in container["env"] if "value" in var})
    return environ


def test_the_endpoints_the_operator_writes_read_back_as_written():
    job = parse_job(job_body())
    read = Endpoints.from_data(build_endpoints(job, SETTINGS, "10.0.0.7", 3)["data"])
    assert read.ray_gcs_address == f"demo-head-svc.team-a.svc.cluster.example:{endpoints.GCS_PORT}"
    assert read.policy_base_url == f"http://demo-generation.team-a.svc.cluster.example:{endpoints.GENERATION_PORT}/v1"
    assert read.environment_urls == {"math": "http://demo-env-math.team-a.svc.cluster.example:8080"}
    assert (read.ray_head_pod_ip, read.job_name, read.attempt) == ("10.0.0.7", "demo", 3)
    assert Endpoints.from_data(read.data()) == read


def test_the_trainer_pod_finds_everything_it_reads_in_its_environment():
    job = parse_job(job_body())
    container = build_trainer_job(job, SETTINGS, 2)["spec"]["template"]["spec"]["containers"][0]
    environ = pod_environment(job, container, attempt=2)
    assert Endpoints.from_data(environ).attempt == 2
    trainer = TrainerEnv.from_env(environ)
    assert trainer.progress_config_map == "demo-config"
    assert trainer.model_path == model_path(job) == "/models/qwen"
    assert trainer.dataset_paths == ["/data/dataset/train.jsonl"]
    assert any(var["name"] == endpoints.POD_NAMESPACE for var in container["env"])


def test_an_environment_pod_serves_on_its_port_and_calls_the_published_policy(monkeypatch: pytest.MonkeyPatch):
    job = parse_job(job_body())
    env = job.spec.environments[0]
    container = build_environment_deployment(job, env, SETTINGS, 1)["spec"]["template"]["spec"]["containers"][0]
    for name, value in pod_environment(job, container).items():
        monkeypatch.setenv(name, value)
    args = environment_args(["arithmetic"])
    assert args.port == env.port == container["ports"][0]["containerPort"]
    assert args.policy_base_url == "http://demo-generation.team-a.svc.cluster.example:8000/v1"
    assert args.policy_model_name == job.spec.model.served_model_name


@pytest.mark.parametrize("renamed", [None, "RAY_GCS_ADDR"])
def test_a_missing_or_renamed_key_is_refused_by_name(renamed: str | None):
    data = endpoints_data(parse_job(job_body()), SETTINGS, "10.0.0.7", 1)
    value = data.pop(endpoints.RAY_GCS_ADDRESS)
    if renamed:
        data[renamed] = value
    with pytest.raises(ContractError, match=r"<job>-endpoints ConfigMap: RAY_GCS_ADDRESS is missing$"):
        Endpoints.from_data(data)


def test_malformed_values_are_refused_by_name():
    data = endpoints_data(parse_job(job_body()), SETTINGS, "10.0.0.7", 1)
    with pytest.raises(ContractError, match=r"PENGUIN_ENV_URLS: Value error, not JSON.*; GRPOJOB_ATTEMPT: "):
        Endpoints.from_data({**data, endpoints.PENGUIN_ENV_URLS: "math=http://x", endpoints.GRPOJOB_ATTEMPT: "0"})


def test_a_trainer_without_its_paths_says_which_are_missing():
    with pytest.raises(ContractError, match=r"GRPOJOB_MODEL_PATH is missing; GRPOJOB_DATASET_PATH is missing"):
        TrainerEnv.from_env({endpoints.GRPOJOB_PROGRESS_CONFIGMAP: "demo-config", "GRPOJOB_CHECKPOINT_DIR": "/c"})


def test_grpojob_train_without_the_endpoints_exits_2_naming_them(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from grpojob_trainer import cli

    config = tmp_path / "grpojob.yaml"
    config.write_text(render_job_config(parse_job(job_body())))
    for name in endpoints_data(parse_job(job_body()), SETTINGS, "10.0.0.7", 1):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", "--config", str(config)]) == 2
    assert "the <job>-endpoints ConfigMap: RAY_GCS_ADDRESS is missing; RAY_HEAD_POD_IP is missing" in (
        capsys.readouterr().err
    )
