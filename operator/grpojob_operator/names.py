"""The only place that names a GRPOJob's children and the labels that tie them to it.

Every child has a deterministic name derived from the job's name, so an operator that restarts at
any point finds what it already created instead of creating it again.
"""

from __future__ import annotations

from dataclasses import dataclass

JOB_LABEL = "grpo.dev/job"
# The job's uid: a child left over from a deleted job of the same name is not mistaken for the new
# job's (pods carry labels, not owner references to the GRPOJob, so the label is what can tell).
JOB_UID_LABEL = "grpo.dev/job-uid"
COMPONENT_LABEL = "grpo.dev/component"
HEAD_COMPONENT = "ray-head"
"""The `COMPONENT_LABEL` of the Ray head pod (its workers carry their group's name)."""
ENVIRONMENT_LABEL = "grpo.dev/environment"
SERVES_GENERATION_LABEL = "grpo.dev/serves-generation"
"""On the pods that serve generation (`generation` or `colocated` workers, value "true"): what the
`<job>-generation` Service selects, whatever the placement, so that a Service made for one placement still
finds the engines after the job is suspended and resumed with another."""
ATTEMPT_LABEL = "grpo.dev/attempt"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "grpojob-operator"
# On a NeMo Gym environment's pod template: a hash of what its pods were started with (the rendered
# config and the Ray head), so that a new head rolls the Deployment.
NEMO_GYM_CONFIG_HASH_ANNOTATION = "grpo.dev/nemo-gym-config-hash"

# Kueue's labels on a GRPOJob: the LocalQueue that admits it and its WorkloadPriorityClass. Read from the
# job, never copied onto a child (Kueue would admit that child again: kuberay#4064).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

# KubeRay's labels on the pods it creates.
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"


@dataclass(frozen=True)
class ChildNames:
    """Names of every child of the GRPOJob ``job``."""

    job: str

    @property
    def raycluster(self) -> str:
        return self.job

    @property
    def head_service(self) -> str:
        """The Service KubeRay creates for the head."""
        return f"{self.job}-head-svc"

    @property
    def ray_token_secret(self) -> str:
        """The Secret holding the job's Ray token, which KubeRay creates for the RayCluster (named like it)."""
        return self.raycluster

    @property
    def workload(self) -> str:
        """The Kueue Workload of a job labelled with a queue name (`grpojob_operator.kueue`)."""
        return f"{self.job}-workload"

    @property
    def network_policy(self) -> str:
        """The NetworkPolicy that lets only the job's own pods reach them."""
        return f"{self.job}-network"

    @property
    def config(self) -> str:
        """The trainer's config, and the progress it reports (`grpojob_api.progress`)."""
        return f"{self.job}-config"

    @property
    def generation_service(self) -> str:
        return f"{self.job}-generation"

    @property
    def endpoints(self) -> str:
        return f"{self.job}-endpoints"

    @property
    def trainer(self) -> str:
        """The trainer Job, its ServiceAccount, Role and RoleBinding."""
        return f"{self.job}-trainer"

    @property
    def model_download(self) -> str:
        """The Job that downloads a hub model (`spec.model.id`) into the cache before the Ray pods start."""
        return f"{self.job}-model"

    @property
    def model_cache(self) -> str:
        """The PersistentVolumeClaim the job creates as its hub cache when `spec.model.cache` names none."""
        return f"{self.job}-model-cache"

    @property
    def tensorboard(self) -> str:
        """TensorBoard's Deployment and Service (`spec.logging.tensorboard`)."""
        return f"{self.job}-tensorboard"

    def environment(self, environment: str) -> str:
        """Deployment and Service of one environment."""
        return f"{self.job}-env-{environment}"

    def nemo_gym_config(self, environment: str) -> str:
        """ConfigMap holding the NeMo Gym config that a NeMo Gym environment's pods run `ng_run` with."""
        return f"{self.job}-env-{environment}-nemo-gym"


def job_labels(job: str, uid: str, component: str) -> dict[str, str]:
    """Labels every child and pod carries: which job (name and uid), which part of it, who manages it."""
    return {JOB_LABEL: job, JOB_UID_LABEL: uid, COMPONENT_LABEL: component, MANAGED_BY_LABEL: MANAGED_BY}
