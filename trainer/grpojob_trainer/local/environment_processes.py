"""Environment servers as local processes, for `grpojob run`: the same command each pod would run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from grpojob_api import endpoints, rewards
from grpojob_api import v1alpha1 as api
from grpojob_trainer.errors import EnvironmentNotReady, UsageError
from grpojob_trainer.net.loopback import free_ports, wait_until_healthy

START_TIMEOUT_S = 120.0


DEFAULT_ENTRYPOINT = ("python", "-m", "grpojob_trainer.environments")


def environment_command(env: api.EnvironmentSpec) -> list[str]:
    """What the environment's container runs: its command (else the environment image's entrypoint) and
    its args (else the environment's name), or the reward server of `env.rewards`. A leading `python` is this
    interpreter, so the venv runs it."""
    if env.rewards is not None:
        command = list(rewards.SERVER_COMMAND)
    else:
        command = [*(env.command or DEFAULT_ENTRYPOINT), *(env.args or ([] if env.command else [env.name]))]
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    return command


class EnvironmentProcesses:
    """Start every environment of a job, ``replicas`` processes of each, every one on a free loopback port and
    each calling one of the engines at ``policy_base_urls`` in turn (as the generation Service spreads the
    pods' calls over the engines); stop them on exit. Entering gives each environment's replica URLs (the
    driver spreads rollouts over them, as a Service spreads them over an environment's pods). A server that
    exits during start-up, or does not answer within ``start_timeout_s``, raises `EnvironmentNotReady`
    naming it."""

    def __init__(
        self,
        environments: list[api.EnvironmentSpec],
        *,
        policy_base_urls: list[str],
        policy_model_name: str,
        gcs_address: str,
        log_dir: Path,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.environments = environments
        self.start_timeout_s = start_timeout_s
        self.policy_base_urls = policy_base_urls
        self.common_env = {
            endpoints.POLICY_MODEL_NAME: policy_model_name,
            endpoints.RAY_GCS_ADDRESS: gcs_address,
        }
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen] = {}
        """Keyed by replica name: the environment's name, then ``<name>-1``, ``<name>-2``, ... ."""
        self.urls: dict[str, str] = {}

    def __enter__(self) -> dict[str, list[str]]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            # Chosen together: a replica started a moment before may not listen on its port yet.
            ports = free_ports(sum(env.replicas for env in self.environments))
            started = 0
            for index, env in enumerate(self.environments):
                for replica in range(env.replicas):
                    engine = self.policy_base_urls[started % len(self.policy_base_urls)]
                    self._start(index, env, replica_name(env.name, replica), engine, ports[started])
                    started += 1
            for env in self.environments:
                for replica in range(env.replicas):
                    self._wait_healthy(env, replica)
        except BaseException:
            self.__exit__()
            raise
        return {
            env.name: [self.urls[replica_name(env.name, replica)] for replica in range(env.replicas)]
            for env in self.environments
        }

    def _start(self, index: int, env: api.EnvironmentSpec, name: str, policy_base_url: str, port: int) -> None:
        variables = {}
        for position, var in enumerate(env.env):
            if var.value is None:
                raise UsageError(
                    f"spec.environments[{index}].env[{position}] ({var.name}): secretKeyRef only works on Kubernetes; "
                    "give a value for `grpojob run`"
                )
            variables[var.name] = var.value
        if env.rewards is not None:
            variables.update(local_rewards_env(index, env.rewards))
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.processes[name] = subprocess.Popen(
            environment_command(env),
            env={
                **os.environ,
                **self.common_env,
                **variables,
                endpoints.POLICY_BASE_URL: policy_base_url,
                endpoints.PORT: str(port),
                endpoints.HOST: "127.0.0.1",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.urls[name] = f"http://127.0.0.1:{port}"

    def _wait_healthy(self, env: api.EnvironmentSpec, replica: int) -> None:
        name = replica_name(env.name, replica)
        log = self.log_dir / f"{name}.log"
        what = f"environment {env.name}" + (f" (replica {replica + 1} of {env.replicas})" if env.replicas > 1 else "")

        def running() -> None:
            if self.processes[name].poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise EnvironmentNotReady(f"{what} exited during start-up; end of its log {log}:\n{tail}")

        try:
            wait_until_healthy(self.urls[name] + "/", self.start_timeout_s, check=running)
        except TimeoutError as error:
            raise EnvironmentNotReady(f"{what}: {error}; its log: {log}") from None

    def __exit__(self, *_: object) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def local_rewards_env(index: int, spec: api.RewardsSpec) -> dict[str, str]:
    """The reward server's configuration under `grpojob run`: the reward file is `path` on this machine (a
    ConfigMap or a claim is Kubernetes'), as an absolute path."""
    if spec.path is None:
        if any(function.name is not None for function in spec.functions):
            raise UsageError(
                f"spec.environments[{index}].rewards.path: `grpojob run` reads the reward file from path (configMap "
                "is read on Kubernetes); give the file's local path too"
            )
        return rewards.server_env(spec, None)
    file = Path(spec.path).resolve()
    if not file.is_file():
        raise UsageError(f"spec.environments[{index}].rewards.path: {spec.path} is not a file")
    return rewards.server_env(spec, str(file))


def replica_name(environment: str, replica: int) -> str:
    """A replica's name in logs and errors: the environment's for the first, ``<environment>-<n>`` after."""
    return environment if replica == 0 else f"{environment}-{replica}"
