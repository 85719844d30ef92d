"""The trainer Job, its RBAC, its config and what it reads."""

from __future__ import annotations

from grpojob_api.admission import parse_job
from grpojob_operator.children.trainer import build_trainer_job, build_trainer_rbac, render_job_config

from .jobs import SETTINGS, env_of, job


def test_trainer_may_only_touch_its_own_config_map_where_it_reports_progress():
    role = next(m for m in build_trainer_rbac(job()) if m["kind"] == "Role")
    (rule,) = role["rules"]
    assert rule["resources"] == ["configmaps"] and rule["resourceNames"] == ["demo-config"]
    assert rule["verbs"] == ["get", "update", "patch"]


def test_the_trainer_mounts_the_config_file_alone_not_the_progress_it_reports_beside_it():
    volumes = build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["volumes"]
    config = next(v for v in volumes if v["name"] == "config")
    assert config["configMap"] == {"name": "demo-config", "items": [{"key": "grpojob.yaml", "path": "grpojob.yaml"}]}


def test_job_config_renders_the_spec_the_trainer_parses_back():
    j = job()
    rendered = render_job_config(j)
    import yaml

    again = parse_job(yaml.safe_load(rendered))
    assert again.spec == j.spec


def test_the_trainer_serves_its_metrics_on_a_named_port():
    (container,) = build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090}]
    assert env_of(container)["GRPOJOB_TRAINER_METRICS_PORT"]["value"] == "9090"


def test_tracking_credentials_come_from_the_secrets_the_job_names():
    j = job(
        logging={
            "mlflow": {"trackingUri": "http://mlflow:5000", "credentialsSecret": "mlflow-auth"},
            "wandb": {"project": "grpo", "apiKeySecret": {"name": "wandb", "key": "api-key"}},
        }
    )
    (container,) = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": "mlflow-auth"}} in container["envFrom"]
    assert env_of(container)["WANDB_API_KEY"] == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
    }
    (plain,) = build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert "WANDB_API_KEY" not in env_of(plain) and len(plain["envFrom"]) == 1


def grace_period(j, stop_seconds: int | None = None) -> int:
    """The trainer pod's grace period, given what an earlier attempt measured a stop to need."""
    return build_trainer_job(j, SETTINGS, 2, stop_seconds=stop_seconds)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]


def test_an_unset_grace_period_fits_what_a_stop_needs_rounded_up_to_a_minute_and_never_below_two_minutes():
    assert grace_period(job()) == 120, "nothing measured yet"
    assert grace_period(job(), stop_seconds=185) == 240
    assert grace_period(job(), stop_seconds=240) == 240
    assert grace_period(job(), stop_seconds=45) == 120
    assert grace_period(job(), stop_seconds=10**6) == 86400, "a day at most"


def test_a_grace_period_the_user_set_is_the_pods_whatever_a_stop_needs():
    asked = job(checkpointing={"gracePeriodSeconds": 90})
    assert grace_period(asked) == 90
    assert grace_period(asked, stop_seconds=600) == 90
