"""NeMo Gym environments for `grpojob run`: the job's NeMo Gym image under podman, as its pods run it.

Each replica of a `nemoGym` environment is one container of the environment's image (`image`, else the
operator's default, `grpojob_api.nemo_gym.DEFAULT_IMAGE`) with the config the operator would render
(`grpojob_api.nemo_gym`), placed on this machine: on the host network, the policy is the local generation
server, the agent listens on a free loopback port and NeMo Gym starts a Ray head of its own inside the
container (the image's Python 3.13 and its Ray cannot join this Python's head, and its servers need nothing
from the job's cluster). The container runs as a pod does: UID 1000, a read-only root, a tmpfs working
directory, the image's supervisor, which stops every server when the container is stopped. Same image,
same servers, same config: the cluster's versions. Its open-file and process limits are this process's own
(`ulimit_flags`): podman's defaults (1,048,576 each) are more than runc may set on a machine whose hard limits
are lower, as in many containers and CI runners.

Without podman, or without the image, `grpojob run` stops before anything starts, naming the field and the
command that gets what is missing.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import uuid
from pathlib import Path

from grpojob_api import nemo_gym as gym
from grpojob_api import v1alpha1 as api
from grpojob_trainer.errors import EnvironmentNotReady, UsageError
from grpojob_trainer.local.environment_processes import replica_name
from grpojob_trainer.net.loopback import free_ports, wait_until_healthy

PODMAN = "podman"
START_TIMEOUT_S = 300.0
"""NeMo Gym starts its Ray head and every server (each a Python process importing its framework): about a
minute on 2 cores."""
STOP_SECONDS = 30
USER = "1000:100"
OWNER_LABEL = "grpo.dev/grpojob-run"
"""Every container `grpojob run` starts carries the run's process id here, so that whatever is left of them
when it dies (SIGKILL included) is removed by its reaper (`remove_command`)."""
SHM_SIZE = "2g"
LOG_TAIL_CHARACTERS = 3000


def nemo_gym_environments(spec: api.GRPOJobSpec) -> list[tuple[int, api.EnvironmentSpec]]:
    """The job's NeMo Gym environments, with their index in ``spec.environments``."""
    return [(index, env) for index, env in enumerate(spec.environments) if env.nemo_gym is not None]


def image_of(env: api.EnvironmentSpec) -> str:
    """The image an environment's pods run, and so its containers here."""
    return env.image or gym.DEFAULT_IMAGE


def check_can_run(spec: api.GRPOJobSpec, podman: str | None = None) -> None:
    """Raise `UsageError` naming the field when this machine cannot start the job's NeMo Gym environments:
    no podman, or an image podman does not have (it is not pulled: `grpojob run` reads nothing from the
    network on its own)."""
    wanted = nemo_gym_environments(spec)
    if not wanted:
        return
    podman = podman or shutil.which(PODMAN)
    first = f"spec.environments[{wanted[0][0]}].nemoGym"
    if podman is None:
        raise UsageError(
            f"{first}: `grpojob run` starts NeMo Gym environments in the NeMo Gym image with podman, which is not "
            "on PATH: install it (`apt install podman`, `brew install podman`) and get the image "
            f"(`podman pull {image_of(wanted[0][1])}`)"
        )
    for index, env in wanted:
        image = image_of(env)
        if subprocess.run([podman, "image", "exists", image], capture_output=True, check=False).returncode != 0:
            field = f"spec.environments[{index}].image" if env.image else f"spec.environments[{index}].nemoGym"
            raise UsageError(
                f"{field}: podman has no image {image}: `podman pull {image}`, or build it from this repository "
                f"(`podman build -f images/nemo-gym/Dockerfile -t {image} .`)"
            )


def remove_command(owner: int, podman: str | None = None) -> list[str]:
    """`podman rm` of every container of the `grpojob run` whose process id is ``owner``, stopped first."""
    podman = podman or shutil.which(PODMAN) or PODMAN
    return [podman, "rm", "--force", f"--time={STOP_SECONDS}", f"--filter=label={OWNER_LABEL}={owner}"]


def ulimit_flags() -> list[str]:
    """``--ulimit`` flags that keep a container within this process's hard limits: open files at the hard limit
    (soft raised to it, as podman's default does), processes at the hard limit, capped at the kernel's
    ``pid_max`` (podman caps its own limit there, and runc may not set the container's above it)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc/sys/kernel/pid_max").exists() else None
    if pid_max is not None and (nproc == resource.RLIM_INFINITY or nproc > pid_max):
        nproc = pid_max
    flags = []
    if nofile != resource.RLIM_INFINITY:
        flags.append(f"--ulimit=nofile={nofile}:{nofile}")
    if nproc != resource.RLIM_INFINITY:
        flags.append(f"--ulimit=nproc={nproc}:{nproc}")
    return flags


def container_command(podman: str, name: str, image: str, config_dir: Path, owner: int) -> list[str]:
    """`podman run` of one NeMo Gym container, as the environment's pod runs it, on the host network. The
    container is not removed when it exits (its log says why); `grpojob run` removes it."""
    return [
        podman,
        "run",
        "--detach",
        "--pull=never",
        f"--name={name}",
        f"--label={OWNER_LABEL}={owner}",
        "--network=host",
        f"--user={USER}",
        "--read-only",
        f"--tmpfs={gym.WORK_DIR}:rw,exec,mode=1777",
        f"--shm-size={SHM_SIZE}",
        *ulimit_flags(),
        f"--workdir={gym.WORK_DIR}",
        f"--env=HOME={gym.WORK_DIR}",
        f"--volume={config_dir.resolve()}:{gym.CONFIG_DIR}:ro,z",
        f"--entrypoint={gym.launch_command()[0]}",
        image,
        *gym.launch_command()[1:],
    ]


class NemoGymContainers:
    """Start every replica of the job's NeMo Gym environments, each a container with its agent on a free
    loopback port; stop and remove them on exit. Entering gives each environment's replica URLs. A container
    that exits during start-up, or whose agent does not answer within ``start_timeout_s``, raises
    `EnvironmentNotReady` with the end of its log (a server the image did not prepare says so there)."""

    def __init__(
        self,
        job: api.GRPOJob,
        *,
        policy_base_url: str,
        run_dir: Path,
        podman: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.job = job
        self.policy_base_url = policy_base_url
        self.run_dir = run_dir.resolve()  # podman takes a relative volume source for a named volume
        self.podman = podman or shutil.which(PODMAN) or PODMAN
        self.start_timeout_s = start_timeout_s
        self.containers: dict[str, str] = {}
        """Container name by replica name."""
        self.urls: dict[str, str] = {}
        self.suffix = uuid.uuid4().hex[:6]

    def __enter__(self) -> dict[str, list[str]]:
        environments = [env for _, env in nemo_gym_environments(self.job.spec)]
        try:
            # Chosen together (an agent's and its head server's): a container started a moment before may not
            # listen on its ports yet.
            ports = iter(free_ports(2 * sum(env.replicas for env in environments)))
            for env in environments:
                for replica in range(env.replicas):
                    self._start(env, replica_name(env.name, replica), next(ports), next(ports))
            for env in environments:
                for replica in range(env.replicas):
                    self._wait_healthy(env, replica_name(env.name, replica))
        except BaseException:
            self.__exit__()
            raise
        return {
            env.name: [self.urls[replica_name(env.name, replica)] for replica in range(env.replicas)]
            for env in environments
        }

    def _start(self, env: api.EnvironmentSpec, replica: str, port: int, head_server_port: int) -> None:
        placement = gym.NemoGymPlacement(
            policy_base_url=self.policy_base_url,
            ray_head_node_address=None,
            agent_host="127.0.0.1",
            agent_port=port,
            head_server_port=head_server_port,
        )
        config_dir = self.run_dir / replica
        config_dir.mkdir(parents=True, exist_ok=True)
        config_file = config_dir / gym.CONFIG_FILE
        config_file.write_text(gym.config_yaml(gym.render_config(self.job, env, placement)))
        config_dir.chmod(0o755)  # read by the container's UID 1000
        config_file.chmod(0o644)
        name = f"grpojob-{self.job.metadata.name}-{replica}-{self.suffix}"
        command = container_command(self.podman, name, image_of(env), config_dir, os.getpid())
        self.containers[replica] = name  # before it exists: an interrupted `podman run` may still create it
        started = subprocess.run(command, capture_output=True, text=True, check=False, start_new_session=True)
        if started.returncode != 0:
            raise EnvironmentNotReady(
                f"environment {replica}: podman could not start {image_of(env)}: {started.stderr.strip()}"
            )
        self.urls[replica] = f"http://127.0.0.1:{port}"

    def logs(self, replica: str, tail: int | None = LOG_TAIL_CHARACTERS) -> str:
        """A container's log (stdout and stderr), its last ``tail`` characters unless None."""
        shown = subprocess.run(
            [self.podman, "logs", self.containers[replica]], capture_output=True, text=True, check=False
        )
        text = shown.stdout + shown.stderr
        return text[-tail:] if tail is not None else text

    def _running(self, replica: str) -> bool:
        inspect = [self.podman, "inspect", "--format", "{{.State.Running}}", self.containers[replica]]
        return subprocess.run(inspect, capture_output=True, text=True, check=False).stdout.strip() == "true"

    def _wait_healthy(self, env: api.EnvironmentSpec, replica: str) -> None:
        what = f"NeMo Gym environment {env.name} ({image_of(env)}, container {self.containers[replica]})"

        def running() -> None:
            if not self._running(replica):
                raise EnvironmentNotReady(f"{what} exited during start-up; end of its log:\n{self.logs(replica)}")

        try:
            wait_until_healthy(self.urls[replica] + "/", self.start_timeout_s, check=running, interval_s=1.0)
        except TimeoutError as error:
            raise EnvironmentNotReady(f"{what}: {error}; end of its log:\n{self.logs(replica)}") from None

    def __exit__(self, *_: object) -> None:
        if not self.containers:
            return
        names = list(self.containers.values())
        # Stopped together (SIGTERM: the image's supervisor stops every server), their logs kept, then removed;
        # in sessions of their own, so that a second Ctrl-C does not cut the clean-up short.
        stop = [self.podman, "stop", "--ignore", f"--time={STOP_SECONDS}", *names]
        subprocess.run(stop, capture_output=True, check=False, start_new_session=True)
        for replica in self.containers:
            (self.run_dir / f"{replica}.log").write_text(self.logs(replica, tail=None))
        remove = [self.podman, "rm", "--force", "--ignore", *names]
        subprocess.run(remove, capture_output=True, check=False, start_new_session=True)
        self.containers.clear()
