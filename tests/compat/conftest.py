"""The real NeMo Gym 0.4.0 servers against our generation server.

Our generation servers run in this process on loopback: the tiny random model through the transformers
backend, and a scripted backend (`tool_script`) whose text calls the weather tool where it is offered.
NeMo Gym runs from our NeMo Gym image (`grpojob_testing.images`, key ``nemo-gym``) with podman, as its
pod runs it (UID 1000, a read-only root filesystem, a tmpfs /tmp), on the host network so that its
servers reach ours on 127.0.0.1; ``gym env start`` starts a Ray head of its own inside the container.
The servers: the resources servers ``example_single_tool_call``, ``mcqa`` and ``format_verification``'s
``freeform_formatting`` (a regex check of each row's format, whose reward varies), ``vllm_model`` twice (one
for each of our servers, ``return_token_id_information: true``) and a ``simple_agent`` for each pair of
resources server and model, from NeMo Gym's own config files plus the overrides a GRPOJob's environment
pod gets (``policy_base_url``, ``policy_model_name``, ports) and our config for the scripted pairs. One more
``simple_agent`` calls our own reward server (`reward_server`, in this process) with the tiny model: NeMo Gym's
config names it as a resources server instance at its host and port, whose entrypoint (NeMo Gym starts every
instance it knows) is a process that only waits (`IDLE`), run in a prepared server's environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from grpojob_trainer.net.loopback import free_port, free_ports, wait_until_healthy

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOOLS = ("buildah", "podman", "debootstrap", "runc")
IMAGE_KEY = "nemo-gym"
GYM_USER = "1000:100"
TEMPERATURE = 1.0
TOP_P = 1.0
MAX_NEW_TOKENS = 16
SCRIPTED_MAX_NEW_TOKENS = 128
"""Room for the scripted tool call: the tiny model's tokenizer spends a token on each character."""
POLICY_NAME = "tiny-policy"
SCRIPTED_NAME = "scripted-policy"
TOOL_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "sf"}}</tool_call>'
FINAL_ANSWER = "It is cold in sf."
CHOICE = "\\boxed{A}"
CONFIG_PATHS = (
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
    "resources_servers/format_verification/configs/freeform_formatting.yaml",
    "/compat/compat.yaml",
)
"""NeMo Gym's own configs (paths in the package, as ``gym env start`` takes them), then ours."""
SCRIPTED_AGENTS = ("scripted_tool_agent", "scripted_mcqa_agent", "scripted_format_agent")
REWARDS_AGENT = "grpojob_rewards_agent"
IDLE = "import time\nwhile True:\n    time.sleep(3600)\n"
IDLE_ENTRYPOINT = "../" * 12 + "compat/idle.py"
"""From the prepared server's directory (deep under the package), up to the root, then the mounted config."""
REWARD_FILE = """
def answer_length(completions, **kwargs):
    if kwargs.get("explode", [False])[0]:
        raise ValueError("asked to fail")
    return [len(c[-1]["content"]) / 100 for c in completions]
"""
STARTUP_S = 300


def tool_script(prompt: str) -> str:
    """The scripted model: where the weather tool is offered, call it, then answer once its response is in
    the prompt; elsewhere choose answer A."""
    if "get_weather" not in prompt:
        return CHOICE
    return FINAL_ANSWER if "<tool_response>" in prompt else TOOL_CALL


@pytest.fixture(scope="session")
def nemo_gym_image() -> str:
    """The NeMo Gym image, built (or taken from the cache) and loaded into podman's storage."""
    from grpojob_testing import images

    if os.geteuid() != 0:
        pytest.skip("building and running images needs root (rootful podman)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: run make image-tools")

    names = {image.key: image.name for image in images.images()}
    if IMAGE_KEY not in names:
        pytest.fail(f"grpojob_testing.images has no {IMAGE_KEY!r} image (it has {sorted(names)})")
    images.build_all([IMAGE_KEY])
    return names[IMAGE_KEY]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpojob_trainer.models.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def serve(backend, served_name: str, max_new_tokens: int):
    from grpojob_trainer.generation.app import ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer

    config = ServerConfig(served_name, SamplingParams(TEMPERATURE, TOP_P, max_new_tokens))
    return GenerationServer(backend, config, host="127.0.0.1").start()


@pytest.fixture(scope="session")
def policy_server(tiny_model_dir: Path) -> Iterator:
    """Our generation server with the tiny random model (transformers backend), recording what it generates."""
    from grpojob_trainer.generation.transformers_backend import TransformersBackend
    from tests.compat.backends import RecordingBackend

    server = serve(
        RecordingBackend(TransformersBackend(tiny_model_dir, max_model_len=1024, device="cpu")),
        POLICY_NAME,
        MAX_NEW_TOKENS,
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def scripted_server(tiny_model_dir: Path) -> Iterator:
    """Our generation server with the scripted backend (`tool_script`)."""
    from tests.compat.backends import RecordingBackend, ScriptedBackend

    server = serve(
        RecordingBackend(ScriptedBackend(tiny_model_dir, tool_script)), SCRIPTED_NAME, SCRIPTED_MAX_NEW_TOKENS
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reward_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Our reward server (resources routes) with `REWARD_FILE`'s function beside the built-in format check."""
    from grpojob_trainer.environments.app import AgentConfig, create_environment_app
    from grpojob_trainer.environments.rewards import RewardsConfig, RewardsEnvironment
    from grpojob_trainer.net.http import ThreadedServer

    file = tmp_path_factory.mktemp("rewards") / "rewards.py"
    file.write_text(REWARD_FILE)
    functions = [{"name": "answer_length"}, {"builtin": "format", "weight": 0.5}]
    environment = RewardsEnvironment(RewardsConfig(file=str(file), functions=functions, workers=1))
    environment.start()
    port = free_port()
    app = create_environment_app(environment, AgentConfig("http://127.0.0.1:9/v1", f"http://127.0.0.1:{port}"))
    server = ThreadedServer(app, port=port).start()
    yield server.url
    server.stop()
    environment.stop()


@dataclass(frozen=True)
class Gym:
    """The running NeMo Gym servers: the base URL of each agent by name."""

    agents: dict[str, str]
    container: str

    def logs(self) -> str:
        result = subprocess.run(["podman", "logs", self.container], capture_output=True, text=True, check=False)
        return result.stdout + result.stderr


def scripted_agent(resources_server: str, port: int) -> dict:
    """A simple_agent between a resources server and the scripted model."""
    return {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "port": port,
                "resources_server": {"type": "resources_servers", "name": resources_server},
                "model_server": {"type": "responses_api_models", "name": "scripted_model"},
            }
        }
    }


def compat_config(scripted_base_url: str, ports: dict[str, int]) -> dict:
    """Our instances next to NeMo Gym's: a second vllm_model for the scripted server, and its agents; our reward
    server and an agent between it and the policy."""
    rewards_agent = scripted_agent("grpojob_rewards", ports[REWARDS_AGENT])
    rewards_agent["responses_api_agents"]["simple_agent"]["model_server"]["name"] = "policy_model"
    return {
        "grpojob_rewards": {
            "resources_servers": {
                "example_single_tool_call": {
                    "entrypoint": IDLE_ENTRYPOINT,
                    "host": "127.0.0.1",
                    "port": ports["rewards"],
                    "domain": "other",
                }
            }
        },
        REWARDS_AGENT: rewards_agent,
        "scripted_model": {
            "responses_api_models": {
                "vllm_model": {
                    "entrypoint": "app.py",
                    "base_url": scripted_base_url,
                    "api_key": "none",
                    "model": SCRIPTED_NAME,
                    "return_token_id_information": True,
                    "uses_reasoning_parser": False,
                }
            }
        },
        "scripted_tool_agent": scripted_agent("example_single_tool_call", ports["scripted_tool_agent"]),
        "scripted_mcqa_agent": scripted_agent("mcqa", ports["scripted_mcqa_agent"]),
        "scripted_format_agent": scripted_agent("freeform_formatting", ports["scripted_format_agent"]),
    }


def gym_arguments(policy_base_url: str, ports: dict[str, int]) -> list[str]:
    """``gym env start`` overrides: what a GRPOJob's environment pod sets, and fixed ports."""
    return [
        f"+config_paths=[{','.join(CONFIG_PATHS)}]",
        f"+policy_base_url={policy_base_url}",
        "+policy_api_key=none",
        f"+policy_model_name={POLICY_NAME}",
        "+head_server.host=127.0.0.1",
        f"+head_server.port={ports['head']}",
        f"++example_single_tool_call_simple_agent.responses_api_agents.simple_agent.port={ports['tool_agent']}",
        f"++mcqa_simple_agent.responses_api_agents.simple_agent.port={ports['mcqa_agent']}",
    ]


def wait_for_agents(gym: Gym, timeout_s: float) -> None:
    """Wait until every agent answers ``GET /``; fail with the container's log if it exits or time runs out."""

    def still_running() -> None:
        inspect = ["podman", "inspect", "--format", "{{.State.Running}}", gym.container]
        if subprocess.run(inspect, capture_output=True, text=True, check=False).stdout.strip() != "true":
            pytest.fail(f"NeMo Gym exited before its agents answered:\n{gym.logs()[-6000:]}")

    deadline = time.monotonic() + timeout_s
    try:
        for url in gym.agents.values():
            left = max(deadline - time.monotonic(), 0.0)
            wait_until_healthy(f"{url}/", left, check=still_running, interval_s=1.0)
    except TimeoutError as error:
        pytest.fail(f"{error}: NeMo Gym's log:\n{gym.logs()[-6000:]}")


@pytest.fixture(scope="session")
def gym(
    nemo_gym_image: str, policy_server, scripted_server, reward_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gym]:
    """NeMo Gym's servers in our image, started with ``gym env start`` against our generation servers (and
    calling our reward server)."""
    from grpojob_testing import images

    names = ("head", "tool_agent", "mcqa_agent", *SCRIPTED_AGENTS, REWARDS_AGENT)
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    ports["rewards"] = int(reward_server.rsplit(":", 1)[1])
    config_dir = tmp_path_factory.mktemp("nemo-gym-config")
    (config_dir / "compat.yaml").write_text(yaml.safe_dump(compat_config(scripted_server.base_url, ports)))
    config_dir.chmod(0o755)
    (config_dir / "compat.yaml").chmod(0o644)
    (config_dir / "idle.py").write_text(IDLE)
    (config_dir / "idle.py").chmod(0o644)
    container = f"grpojob-compat-{uuid.uuid4().hex[:8]}"
    pod_like = [f"--user={GYM_USER}", "--read-only", "--tmpfs=/tmp:rw,exec,mode=1777", "--shm-size=1g"]
    pod_like.append(f"--volume={config_dir}:/compat:ro")
    start = ["podman", "run", "--detach", f"--name={container}", *images.run_flags(), *pod_like, nemo_gym_image]
    subprocess.run([*start, *gym_arguments(policy_server.base_url, ports)], capture_output=True, check=True)
    agents = {
        "example_single_tool_call_simple_agent": f"http://127.0.0.1:{ports['tool_agent']}",
        "mcqa_simple_agent": f"http://127.0.0.1:{ports['mcqa_agent']}",
        **{name: f"http://127.0.0.1:{ports[name]}" for name in (*SCRIPTED_AGENTS, REWARDS_AGENT)},
    }
    running = Gym(agents, container)
    try:
        wait_for_agents(running, STARTUP_S)
        yield running
    finally:
        # SIGTERM: the image's supervisor stops every server; then the container is removed.
        subprocess.run(["podman", "stop", "--time=30", container], capture_output=True, check=False)
        subprocess.run(["podman", "rm", "--force", container], capture_output=True, check=False)
