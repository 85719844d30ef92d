"""The model judges a manifest as the API server does: strict types, int64 integers, nulls of fields
that are not nullable as absent; every cross-field rule also a CEL rule of the CRD; quantities by
Kubernetes' grammar. (tests/integration/operator/test_admission.py holds both verdicts equal on the
real API server.)"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from grpojob_api import crd, paths
from grpojob_api import v1alpha1 as api
from grpojob_api.admission import describe, parse_job
from grpojob_api.quantity import parse_quantity
from grpojob_operator.children.trainer import render_job_config
from grpojob_trainer.commands.job import load_job
from grpojob_trainer.errors import UsageError

ROOT = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
JOB: dict[str, Any] = {
    "apiVersion": api.API_VERSION,
    "kind": api.KIND,
    "metadata": {"name": "demo"},
    "spec": {
        "model": {"path": "/models/tiny"},
        "dataset": {"path": "rows.jsonl"},
        "environments": [{"name": "arith"}],
        "generation": {"maxModelLen": 2048, "maxNewTokens": 64},
    },
}


def with_spec(path: str, value: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(JOB)
    *parents, last = path.split(".")
    node = manifest["spec"]
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return manifest


def refusal(manifest: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as error:
        parse_job(manifest)
    return describe(error.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("grpo.maxSteps", "3"),
        ("grpo.maxSteps", 2.5),
        ("grpo.seed", 2**63),
        ("suspend", "yes"),
        ("suspend", 1),
        ("generation.temperature", "1.0"),
        ("model.path", 3),
    ],
)
def test_types_are_as_strict_as_the_api_servers(path, value):
    assert f"spec.{path}" in refusal(with_spec(path, value))


def test_numbers_are_read_as_the_api_server_decodes_them():
    assert parse_job(with_spec("grpo.maxSteps", 3.0)).spec.grpo.max_steps == 3
    assert parse_job(with_spec("grpo.seed", 2**63 - 1)).spec.grpo.seed == 2**63 - 1
    assert parse_job(with_spec("generation.temperature", 1)).spec.generation.temperature == 1.0


def test_a_null_is_an_absent_field_unless_the_field_is_nullable():
    job = parse_job(with_spec("generation", None))
    assert job.spec.generation == api.GenerationSpec()
    assert parse_job(with_spec("suspend", None)).spec.suspend is False
    assert parse_job(with_spec("grpo.importanceSamplingCap", None)).spec.grpo.importance_sampling_cap is None
    assert "spec.model" in refusal(with_spec("model", None))
    nullable = [path for path, node in _walk(ROOT) if node.get("nullable")]
    assert nullable == [".spec.grpo.importanceSamplingCap"]


def test_the_trainer_config_keeps_a_null_that_means_something(tmp_path):
    job = parse_job(with_spec("grpo.importanceSamplingCap", None))
    config = tmp_path / "job.yaml"
    config.write_text(render_job_config(job))
    assert load_job(config).spec == job.spec


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("generation.temperature", 0, "spec.generation.temperature"),
        ("generation", {"maxModelLen": 512}, "spec.generation.maxNewTokens must be smaller"),
        ("generation", {"backend": "vllm", "gpusPerReplica": 0}, "spec.generation.backend: vllm needs"),
        ("dataset", {"path": "x", "configMap": {"name": "rows"}}, "spec.dataset: set exactly one"),
        ("dataset", {"pvc": {"claimName": "c"}, "configMap": {"name": "rows"}}, "spec.dataset: pvc needs path"),
        ("dataset", {"id": "org/rows", "split": "train", "path": "x"}, "spec.dataset: set exactly one of path"),
        ("dataset", {"id": "org/rows"}, "spec.dataset: id needs split"),
        ("dataset", {"id": "org/rows/x", "split": "train"}, "spec.dataset.id"),
        ("dataset", {"id": "org/rows", "split": "train x"}, "spec.dataset.split"),
        ("dataset", {"path": "x", "split": "train"}, "spec.dataset: revision, split, config, files, tokenSecret"),
        ("dataset", {"path": "x", "offline": True}, "spec.dataset: revision, split, config, files, tokenSecret"),
        ("dataset", {"id": "org/rows", "split": "train", "files": ["../x"]}, "spec.dataset.files[0]"),
        ("dataset", {"id": "org/rows", "split": "train", "files": ["/x"]}, "spec.dataset.files[0]"),
        ("dataset", {"sources": []}, "spec.dataset.sources"),
        ("dataset", {"sources": [{"path": "x", "weight": 0}]}, "spec.dataset.sources[0].weight"),
        ("dataset", {"sources": [{"path": "x", "weight": -1}]}, "spec.dataset.sources[0].weight"),
        ("dataset", {"sources": [{"id": "org/rows"}]}, "spec.dataset.sources[0]: id needs split"),
        ("dataset", {"sources": [{"path": "x"}], "path": "y"}, "spec.dataset: set exactly one of path, configMap"),
        ("dataset", {"sources": [{"path": "x", "sources": []}]}, "spec.dataset.sources[0].sources"),
        (
            "dataset",
            {"sources": [{"path": "x"}], "mapping": {"promptField": "q", "environment": "arith"}},
            "spec.dataset: mapping goes on each of sources",
        ),
        (
            "dataset",
            {"path": "x", "mapping": {"promptField": "q", "environment": "other"}},
            "spec.dataset.mapping.environment must name one of spec.environments",
        ),
        (
            "dataset",
            {"sources": [{"path": "x", "mapping": {"promptField": "q", "environment": "other"}}]},
            "spec.dataset.sources[0].mapping.environment must name one of spec.environments",
        ),
        (
            "dataset",
            {"path": "x", "mapping": {"promptField": "q", "environment": "arith", "fields": {"agent_ref": "a"}}},
            "spec.dataset.mapping.fields: responses_create_params and agent_ref are written by the mapping",
        ),
        ("dataset", {"path": "x", "mapping": {"environment": "arith"}}, "spec.dataset.mapping.promptField"),
        ("environments.0.env", [{"name": "A"}], "spec.environments[0].env[0]"),
        (
            "environments.0.rewards",
            {"path": "r.py", "functions": [{"name": "f", "builtin": "math"}]},
            "spec.environments[0].rewards.functions[0]: set exactly one of name",
        ),
        ("environments.0.rewards", {"path": "r.py", "functions": []}, "spec.environments[0].rewards.functions"),
        (
            "environments.0.rewards",
            {"functions": [{"name": "accuracy"}]},
            "spec.environments[0].rewards: functions that name a function of the reward file need path or configMap",
        ),
        (
            "environments.0.rewards",
            {"path": "r.py", "functions": [{"name": "f"}, {"name": "f"}]},
            "spec.environments[0].rewards: each function appears once",
        ),
        (
            "environments.0.rewards",
            {"pvc": {"claimName": "c"}, "functions": [{"builtin": "math"}]},
            "spec.environments[0].rewards: pvc needs path",
        ),
        (
            "environments.0.rewards",
            {"path": "r.py", "pvc": {"claimName": "c"}, "configMap": {"name": "m"}, "functions": [{"name": "f"}]},
            "spec.environments[0].rewards: set pvc or configMap, not both",
        ),
        ("environments.0.rewards", {"functions": [{"builtin": "regex"}]}, "spec.environments[0].rewards.functions[0]"),
        (
            "environments.0.rewards",
            {"functions": [{"builtin": "math"}], "timeoutSeconds": 0},
            "spec.environments[0].rewards.timeoutSeconds",
        ),
        (
            "environments",
            [{"name": "arith", "command": ["python", "x.py"], "rewards": {"functions": [{"builtin": "math"}]}}],
            "spec.environments[0]: environment arith: command, args and nemoGym must be unset with rewards",
        ),
        ("environments", [{"name": "arith"}, {"name": "arith"}], "spec.environments: duplicate names"),
        ("checkpointing.path", "runs/../etc", "spec.checkpointing.path"),
        ("model.pvc", {"claimName": "c", "path": "a/.."}, "spec.model.pvc.path"),
        ("model", {"path": "/m", "id": "Qwen/Qwen2.5-0.5B"}, "spec.model: set exactly one of path"),
        ("model", {"servedModelName": "x"}, "spec.model: set exactly one of path"),
        ("model", {"id": "Qwen/Qwen2.5-0.5B", "pvc": {"claimName": "c"}}, "spec.model.pvc needs spec.model.path"),
        ("model", {"path": "/m", "revision": "main"}, "spec.model: revision, tokenSecret and offline go"),
        ("model", {"path": "/m", "offline": True}, "spec.model: revision, tokenSecret and offline go"),
        ("model", {"path": "/m", "cache": {"claimName": "c"}}, "spec.model.cache (the job's Hugging Face cache)"),
        ("model", {"id": "not a model id"}, "spec.model.id"),
        ("model", {"id": "a/b/c"}, "spec.model.id"),
        ("model", {"id": "org/m", "cache": {"size": "lots"}}, "spec.model.cache.size"),
        ("output.path", "models/../x", "spec.output.path"),
        ("output.dtype", "float16", "spec.output.dtype"),
        ("environments.0.resources", {"requests": {"gpu": "1"}}, "spec.environments[0].resources.requests"),
        ("environments.0.resources", {"requests": {"memory": "1.5m"}}, "whole bytes"),
        ("environments.0.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "must not exceed"),
        ("environments.0.resources", {"requests": {"nvidia.com/gpu": "1"}}, "the same limit"),
        ("grpo", {"maxOffPolicySteps": 1, "importanceSamplingCap": None}, "spec.grpo.maxOffPolicySteps: rollouts"),
        ("grpo.maxOffPolicySteps", 17, "spec.grpo.maxOffPolicySteps"),
        ("grpo.maxOffPolicySteps", -1, "spec.grpo.maxOffPolicySteps"),
        ("logging", {"tensorboard": True}, "spec.logging.tensorboard needs a claim"),
        ("logging.path", "logs/../../x", "spec.logging.path"),
        ("logging.wandb", {"project": "p"}, "spec.logging.wandb.apiKeySecret is needed in online mode"),
        ("logging.mlflow", {"experiment": "e"}, "spec.logging.mlflow.trackingUri"),
        ("scheduling.trainer.labels", {"grpo.dev/job": "x"}, "spec.scheduling.trainer.labels"),
        ("scheduling.trainer.labels", {"team": "rl team"}, "spec.scheduling.trainer.labels.team"),
        ("scheduling.head.labels", {"kueue.x-k8s.io/queue-name": "q"}, "must not use the keys the operator sets"),
        ("scheduling.policy.tolerations", [{"operator": "Exists", "value": "x"}], "Exists takes no value"),
        ("scheduling.policy.tolerations", [{"value": "x"}], "an empty key needs operator Exists"),
        ("scheduling.generation.tolerations", [{"key": "k", "tolerationSeconds": 5}], "needs effect NoExecute"),
        ("scheduling.environments.priorityClassName", "High", "spec.scheduling.environments.priorityClassName"),
        ("scheduling.head.affinity", {"nodeAffinity": {}, "other": {}}, "spec.scheduling.head.affinity.other"),
        ("progressDeadlineSeconds", 0, "spec.progressDeadlineSeconds"),
        ("training.lora", {"rank": 0}, "spec.training.lora.rank"),
        ("training.lora", {"rank": 1024}, "spec.training.lora.rank"),
        ("training.lora", {"dropout": 1.0}, "spec.training.lora.dropout"),
        ("training.lora", {"alpha": 0}, "spec.training.lora.alpha"),
        ("training.lora", {"targetModules": []}, "spec.training.lora.targetModules"),
        ("training.lora", {"targetModules": ["q_proj", "q_proj"]}, "duplicate module names ['q_proj']"),
        ("training.lora", {"targetModules": ["model.layers.0.q_proj"]}, "spec.training.lora.targetModules[0]"),
        ("output.format", "adapter", "spec.output.format: adapter needs spec.training.lora"),
        ("output.format", "gguf", "spec.output.format"),
        ("output.select", "bestEvaluation", "spec.output.select: bestEvaluation needs spec.evaluation"),
        ("output.select", "best", "spec.output.select"),
        ("evaluation", {"everySteps": 5}, "spec.evaluation.dataset"),
        ("evaluation", {"dataset": {"path": "t.jsonl"}, "everySteps": 0}, "spec.evaluation.everySteps"),
        ("evaluation", {"dataset": {"path": "t.jsonl"}, "k": 0}, "spec.evaluation.k"),
        ("evaluation", {"dataset": {"path": "t.jsonl"}, "temperature": -0.1}, "spec.evaluation.temperature"),
        ("evaluation", {"dataset": {"path": "t.jsonl"}, "topP": 0}, "spec.evaluation.topP"),
        ("evaluation", {"dataset": {"path": "t.jsonl"}, "maxRows": 0}, "spec.evaluation.maxRows"),
        ("evaluation", {"dataset": {"id": "org/rows"}}, "spec.evaluation.dataset: id needs split"),
        ("evaluation", {"dataset": {"sources": [{"path": "t.jsonl"}]}}, "spec.evaluation.dataset.sources"),
        (
            "evaluation",
            {"dataset": {"path": "t.jsonl", "mapping": {"promptField": "q", "environment": "x"}}},
            "spec.evaluation.dataset.mapping.environment must name one of spec.environments",
        ),
        ("evaluation", {"dataset": {}}, "spec.evaluation.dataset: set exactly one of path, configMap or id"),
        ("model", {"id": "org/model", "cache": {"size": "0"}}, "spec.model.cache.size: '0' must be greater than zero"),
        ("model", {"id": "org/model", "cache": {"size": "-1Gi"}}, "spec.model.cache.size"),
    ],
)
def test_what_the_trainer_or_operator_would_refuse_is_refused_naming_the_field(path, value, named):
    assert named in refusal(with_spec(path, value))


def test_datasets_by_id_with_a_mapping_and_weighted_sources_are_admitted_and_reach_the_trainer_as_written(tmp_path):
    mapping = {"promptField": "question", "systemPrompt": "Digits only.", "environment": "arith", "fields": {"a": "b"}}
    hub = {"id": "org/rows", "split": "train[:10%]", "config": "main", "files": ["data/*.parquet"], "mapping": mapping}
    manifest = with_spec("dataset", {"sources": [{"path": "a.jsonl", "weight": 2.5}, hub]})
    manifest["spec"]["evaluation"] = {"dataset": {"id": "org/rows", "split": "test", "mapping": mapping}}
    manifest["spec"]["model"]["cache"] = {"claimName": "hf"}  # the job's Hugging Face cache, for its datasets
    job = parse_job(manifest)

    assert job.spec.dataset.weights() == [2.5, 1.0]
    assert [field for field, _ in job.spec.hub_datasets()] == ["spec.dataset.sources[1]", "spec.evaluation.dataset"]
    config = tmp_path / "job.yaml"
    config.write_text(render_job_config(job))
    assert load_job(config).spec == job.spec
    single = parse_job(with_spec("dataset", {"id": "org/rows", "split": "train"}))
    assert single.spec.dataset.all_sources() == [single.spec.dataset] and single.spec.dataset.source_fields() == [
        "spec.dataset"
    ]


def test_tensorboard_takes_the_checkpoint_claim_when_the_logs_have_none():
    manifest = with_spec("logging", {"tensorboard": True})
    manifest["spec"]["checkpointing"] = {"pvc": {"claimName": "runs"}}
    job = parse_job(manifest)
    assert job.spec.log_claim == api.PvcSource(claim_name="runs")
    assert paths.log_dir(job) == "logs/demo"


@pytest.mark.parametrize("name", ["a.b", "1job", "Job", "a" * 41])
def test_job_names_are_dns_labels(name):
    manifest = copy.deepcopy(JOB)
    manifest["metadata"]["name"] = name
    assert "metadata.name" in refusal(manifest)


def test_every_cross_field_rule_is_also_a_cel_rule():
    rules = {path: [r["rule"] for r in node.get("x-kubernetes-validations", [])] for path, node in _walk(ROOT)}
    spec = ".spec"

    def has_rule(path: str, text: str) -> bool:
        return any(text in rule for rule in rules[path])

    assert has_rule(f"{spec}.generation", "self.maxNewTokens < self.maxModelLen")
    assert has_rule(f"{spec}.generation", "self.backend != 'vllm' || self.gpusPerReplica >= 1")
    assert has_rule(f"{spec}.dataset", "(has(self.path) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.id)")
    assert has_rule(f"{spec}.grpo", "self.maxOffPolicySteps == 0 || has(self.importanceSamplingCap)")
    assert has_rule(f"{spec}.model", "has(self.path) != has(self.id)")
    assert has_rule(f"{spec}.model", "!has(self.pvc) || has(self.path)")
    assert has_rule(f"{spec}.model", "has(self.id) || !(has(self.revision)")
    assert has_rule(spec, "!has(self.model.cache) || has(self.model.id) || has(self.dataset.id)")
    assert has_rule(f"{spec}.environments[].env[]", "has(self.value) != has(self.secretKeyRef)")
    assert has_rule(f"{spec}.environments[].resources", "quantity(self.requests[k]).compareTo")
    assert has_rule(f"{spec}.environments[]", "!has(self.rewards) || (!has(self.nemoGym)")
    assert has_rule(f"{spec}.environments[].rewards", "!has(self.pvc) || has(self.path)")
    assert has_rule(f"{spec}.environments[].rewards", "!has(self.pvc) || !has(self.configMap)")
    assert has_rule(f"{spec}.environments[].rewards", "self.functions.all(f, !has(f.name))")
    assert has_rule(f"{spec}.environments[].rewards", "self.functions.exists_one(")
    assert has_rule(f"{spec}.environments[].rewards.functions[]", "has(self.name) != has(self.builtin)")
    assert has_rule(spec, "self.logging.tensorboard || has(self.logging.pvc)")
    assert has_rule(f"{spec}.logging.wandb", "self.mode != 'online' || has(self.apiKeySecret)")
    assert has_rule(spec, "self.output.format != 'adapter' || (has(self.training) && has(self.training.lora))")
    assert has_rule(spec, "self.output.select != 'bestEvaluation' || has(self.evaluation)")
    assert has_rule(f"{spec}.evaluation.dataset", "(has(self.path) ? 1 : 0) + (has(self.configMap) ? 1 : 0)")
    for source in (f"{spec}.dataset", f"{spec}.dataset.sources[]", f"{spec}.evaluation.dataset"):
        assert has_rule(source, "!has(self.id) || has(self.split)"), source
        assert has_rule(source, "has(self.id) || !(has(self.revision) || has(self.split)"), source
        assert has_rule(f"{source}.files[]", "[.][.]"), source
        assert has_rule(f"{source}.mapping.fields", "!('responses_create_params' in self)"), source
    assert has_rule(f"{spec}.dataset", "!has(self.sources) || !has(self.mapping)")
    assert has_rule(spec, "!has(self.dataset.mapping) || self.environments.exists(e, e.name ==")
    assert has_rule(spec, "self.dataset.sources.all(s, !has(s.mapping) || self.environments.exists(")
    assert has_rule(spec, "!has(self.evaluation.dataset.mapping) || self.environments.exists(")
    weight = ROOT["properties"]["spec"]["properties"]["dataset"]["properties"]["sources"]["items"]["properties"]
    assert weight["weight"]["minimum"] == 0 and weight["weight"]["exclusiveMinimum"] is True
    lora = ROOT["properties"]["spec"]["properties"]["training"]["properties"]["lora"]
    assert lora["properties"]["targetModules"]["x-kubernetes-list-type"] == "set"  # no duplicates
    volume_paths = (".model.pvc.path", ".dataset.pvc.path", ".checkpointing.path", ".checkpointing.pvc.path")
    for volume_path in (*volume_paths, ".logging.path", ".logging.pvc.path", ".output.path"):
        assert has_rule(spec + volume_path, "[.][.]"), volume_path
    assert has_rule("", "metadata.name.matches")
    for role in ("head", "generation", "policy", "environments", "trainer"):
        assert has_rule(f"{spec}.scheduling.{role}.labels", "!k.startsWith('grpo.dev/')")
        assert has_rule(f"{spec}.scheduling.{role}.tolerations[]", "self.operator != 'Exists'")
        assert has_rule(f"{spec}.scheduling.{role}.tolerations[]", "self.effect == 'NoExecute'")
    environments = ROOT["properties"]["spec"]["properties"]["environments"]
    assert environments["x-kubernetes-list-type"] == "map" and environments["x-kubernetes-list-map-keys"] == ["name"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Pi", Decimal(2**50)),
        ("1e3", Decimal(1000)),
        (".5", Decimal("0.5")),
        ("1.", Decimal(1)),
        ("+2Ki", Decimal(2048)),
        ("500m", Decimal("0.5")),
        ("1E3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("2e-3", Decimal("0.002")),
    ],
)
def test_quantities_follow_kubernetes_grammar(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1GB", "1 Gi", "", "1K", "Ki", "1e", "1.2.3", "0x10", "1e3.5"])
def test_what_is_not_a_quantity_is_refused(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_a_quantity_that_yaml_reads_as_a_number_is_refused_as_kubectl_refuses_it(tmp_path):
    text = yaml.safe_dump(with_spec("environments.0.resources", {"requests": {"cpu": ".5", "memory": "1e9"}}))
    path = tmp_path / "job.yaml"
    path.write_text(text)  # PyYAML writes 1e9 unquoted: a string to YAML 1.1, a number to kubectl
    with pytest.raises(UsageError, match=r"resources\.requests\.memory: Input should be a valid string"):
        load_job(path)
    path.write_text(text.replace("1e9", "'1e9'"))
    assert load_job(path).spec.environments[0].resources.requests == {"cpu": ".5", "memory": "1e9"}


@pytest.mark.parametrize(("written", "seed"), [("1e17", 10**17), ("9.2e18", 9_200_000_000_000_000_000), ("1.5e2", 150)])
def test_a_whole_float_is_read_as_the_integer_kubectl_sends(tmp_path, written, seed):
    """kubectl's JSON (Go's) writes a whole float below 1e21 without an exponent: the API server reads an integer."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(with_spec("grpo.seed", 3)).replace("seed: 3", f"seed: {written}"))
    assert load_job(path).spec.grpo.seed == seed


@pytest.mark.parametrize("written", ["9.3e18", "1e21", "2.5"])
def test_a_float_kubectl_sends_as_no_int64_is_refused_in_an_integer_field(tmp_path, written):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(with_spec("grpo.seed", 3)).replace("seed: 3", f"seed: {written}"))
    with pytest.raises(UsageError, match=r"spec\.grpo\.seed"):
        load_job(path)


def _walk(node: dict[str, Any], path: str = ""):
    """Every schema node of the CRD by path: `.spec.environments[].env[]`."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_grpojob_run_reads_plain_scalars_as_kubectl(tmp_path):
    text = yaml.safe_dump(JOB).replace("maxNewTokens: 64", "maxNewTokens: 6.4e1")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    job = yaml.safe_load(text)
    assert job["spec"]["generation"]["maxNewTokens"] == "6.4e1"  # YAML 1.1 reads a string here; kubectl a number
    assert load_job(path).spec.generation.max_new_tokens == 64


def test_the_trainer_config_keeps_strings_kubectl_would_read_as_numbers(tmp_path):
    job = parse_job(with_spec("environments.0.env", [{"name": "A", "value": "y"}, {"name": "B", "value": "1e9"}]))
    config = tmp_path / "job.yaml"
    config.write_text(render_job_config(job))
    assert load_job(config).spec == job.spec


def test_a_model_is_named_by_path_or_by_hub_id():
    by_id = parse_job(with_spec("model", {"id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "v1.0"}))
    assert (by_id.spec.model.id, by_id.spec.model.revision, by_id.spec.model.path) == (
        "Qwen/Qwen2.5-0.5B-Instruct",
        "v1.0",
        None,
    )
    assert parse_job(JOB).spec.model.id is None


def test_output_defaults_to_a_directory_named_after_the_job():
    job = parse_job(JOB)
    assert paths.output_dir(job) == "models/demo"
    assert (job.spec.output.dtype, job.spec.output.every_checkpoint) == ("bfloat16", False)
    assert paths.output_dir(parse_job(with_spec("output.path", "out/x"))) == "out/x"


def test_a_refusal_is_worded_with_the_manifests_field_names():
    with pytest.raises(ValidationError) as field:
        parse_job(with_spec("environments.0.port", 80))
    with pytest.raises(ValidationError) as cross_field:
        parse_job(with_spec("logging.tensorboard", True))

    assert describe(field.value) == "spec.environments[0].port: Input should be greater than or equal to 1024"
    assert describe(cross_field.value) == (
        "spec.logging.tensorboard needs a claim for the logs: spec.logging.pvc or spec.checkpointing.pvc"
    )
