"""Our images, built here from our Dockerfiles (grpojob_testing.images), run as their pods run
them: a numeric non-root user, a read-only root filesystem and a writable /tmp. The first test to run
builds whatever is not cached (several minutes cold; `make images` does it ahead)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from grpojob_operator.children.pod import NON_ROOT_UID
from grpojob_testing import images
from grpojob_trainer.net.loopback import free_port, wait_until_healthy

TOOLS = ("buildah", "podman", "debootstrap", "runc")
OPERATOR_USER = "65532:65532"
"""The operator pod's runAsUser:runAsGroup (charts/grpojob/values.yaml podSecurityContext)."""

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="building and running images needs root (rootful podman)"),
    pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in TOOLS),
        reason=f"needs {', '.join(TOOLS)}: run make image-tools",
    ),
    pytest.mark.timeout(1800),
]


@pytest.fixture(scope="module")
def archives() -> dict[str, Path]:
    """Every image built (or taken from the cache) and loaded into podman's storage; their archives."""
    return images.build_all()


def image_name(key: str) -> str:
    return next(image.name for image in [*images.images(), images.gpu_image()] if image.key == key)


def podman_run(key: str, *command: str, user: str, options: tuple[str, ...] = (), timeout: float = 120) -> str:
    """Run `command` in image `key` as its pod would; return its output, failing on a non-zero exit."""
    pod_like = ["--rm", f"--user={user}", "--read-only", "--tmpfs=/tmp:rw,exec,mode=1777", "--shm-size=1g"]
    result = subprocess.run(
        ["podman", "run", *images.run_flags(), *pod_like, *options, image_name(key), *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def test_the_operator_image_runs_the_operator_as_its_pod_user(archives: dict[str, Path]):
    output = podman_run("operator", "--help", user=OPERATOR_USER)
    assert "usage:" in output and "--namespace" in output


def test_the_trainer_image_has_ray_torch_and_the_trainer_for_uid_1000(archives: dict[str, Path]):
    check = (
        "import getpass, ray, torch, transformers, grpojob_trainer; "
        "print(getpass.getuser(), ray.__version__, torch.__version__, float(torch.ones(2, 2).sum()))"
    )
    user, ray, torch, total = podman_run("trainer-cpu", "python", "-c", check, user=str(NON_ROOT_UID)).split()[-4:]
    # PyPI's Linux torch is the CUDA build (2.15.0+cu132); without a GPU it runs on the CPU.
    assert (user, ray, torch.split("+")[0], total) == ("ray", "2.60.0", "2.15.0", "4.0")


def test_the_gpu_trainer_image_holds_the_versions_measured_on_the_h200_and_runs_the_cli_for_uid_1000():
    if not images.gpu_image_built():
        pytest.skip("the GPU trainer image is not built from this tree: make gpu-image")
    check = (
        "import getpass, os, sysconfig, ray, torch, transformers, vllm, grpojob_trainer.generation; "
        "headers = os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')); "
        "print(getpass.getuser(), vllm.__version__, torch.__version__, torch.version.cuda, "
        "transformers.__version__, ray.__version__, headers)"
    )
    output = podman_run("trainer-gpu", "python", "-c", check, user=str(NON_ROOT_UID), timeout=300)
    # vLLM imports without a GPU; torch is PyPI's CUDA 13.0 build, as measured on the H200.
    assert output.split()[-7:] == ["ray", "0.26.0", "2.11.0+cu130", "13.0", "5.17.0", "2.60.0", "True"], output
    # Triton and vLLM compile their C helpers with the image's gcc when they first run on a GPU.
    assert "gcc" in podman_run("trainer-gpu", "gcc", "--version", user=str(NON_ROOT_UID))
    assert "usage:" in podman_run("trainer-gpu", "grpojob", "--help", user=str(NON_ROOT_UID))


def test_the_trainer_image_trains_the_tiny_model_with_grpojob_run(archives: dict[str, Path], tmp_path: Path):
    job = yaml.safe_load((images.REPO / "examples" / "tiny.yaml").read_text())
    job["spec"]["model"]["path"] = "/tmp/model"
    job["spec"]["dataset"]["path"] = "/tmp/data/train.jsonl"
    job["spec"]["grpo"]["maxSteps"] = 3
    job["spec"]["checkpointing"] = {"path": "/tmp/checkpoints", "interval": 100}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    for path in (tmp_path, tmp_path / "job.yaml"):
        path.chmod(0o755)  # readable by the container's UID 1000
    script = (
        "grpojob tiny-model /tmp/model"
        " && grpojob dataset arithmetic --rows 64 --out /tmp/data/train.jsonl"
        " && grpojob run /job/job.yaml --out /tmp/out --no-progress --no-tensorboard"
        " && echo METRICS && cat /tmp/out/metrics.jsonl"
    )
    options = (f"--volume={tmp_path}:/job:ro", "--env=HF_HUB_OFFLINE=1", "--env=RAY_DISABLE_USAGE_STATS=1")
    output = podman_run("trainer-cpu", "sh", "-c", script, user=str(NON_ROOT_UID), options=options, timeout=900)
    metrics = [json.loads(line) for line in output.split("METRICS\n", 1)[1].splitlines() if line.startswith("{")]
    assert [record["step"] for record in metrics] == [1, 2, 3], output[-4000:]
    assert all(0.0 <= record["rollout/reward/mean"] <= 1.0 for record in metrics)


def test_the_environments_image_serves_its_health_route(archives: dict[str, Path]):
    port, name = free_port(), f"grpojob-test-{uuid.uuid4().hex[:8]}"
    pod_like = [f"--user={NON_ROOT_UID}", "--read-only", "--tmpfs=/tmp:rw,mode=1777", f"--env=PORT={port}"]
    pod_like.append("--env=POLICY_BASE_URL=http://127.0.0.1:9/v1")  # not called: only the health route is
    subprocess.run(
        ["podman", "run", "--detach", f"--name={name}", *images.run_flags(), *pod_like, image_name("environments")],
        capture_output=True,
        check=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        try:
            wait_until_healthy(url, 60, interval_s=0.5)
        except TimeoutError as error:
            logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
            pytest.fail(f"{error}; the container's log:\n{logs.stdout}{logs.stderr}")
        with urllib.request.urlopen(url, timeout=2) as response:
            assert json.loads(response.read()) == {"status": "ok"}
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


def test_the_environments_image_serves_reward_functions_with_the_built_in_verifiers(archives: dict[str, Path]):
    """The reward server as an environment pod runs it (the image's entrypoint with `rewards`, GRPOJOB_REWARDS as
    the operator writes it): math-verify is in the image, and the code checker's sandbox works under the
    container's own seccomp profile, refusing the network."""
    port, name = free_port(), f"grpojob-test-{uuid.uuid4().hex[:8]}"
    config = {"functions": [{"builtin": "math"}, {"builtin": "code"}], "sandbox": {"cpuSeconds": 2}}
    pod_like = [f"--user={NON_ROOT_UID}", "--read-only", "--tmpfs=/tmp:rw,mode=1777", f"--env=PORT={port}"]
    pod_like += ["--env=POLICY_BASE_URL=http://127.0.0.1:9/v1", f"--env=GRPOJOB_REWARDS={json.dumps(config)}"]
    image = image_name("environments")
    subprocess.run(
        ["podman", "run", "--detach", f"--name={name}", *images.run_flags(), *pod_like, image, "rewards"],
        capture_output=True,
        check=True,
    )

    def verify(text: str, **columns: object) -> dict:
        answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        body = {"responses_create_params": {"input": "q"}, "response": {"output": [answer]}, **columns}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/verify", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    try:
        try:
            wait_until_healthy(f"http://127.0.0.1:{port}/", 120, interval_s=0.5)
        except TimeoutError as error:
            logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
            pytest.fail(f"{error}; the container's log:\n{logs.stdout}{logs.stderr}")
        boxed = verify("So \\boxed{\\frac{144}{2}}", expected_answer="#### 72")
        code = "def add(a, b):\n    return a + b"
        network = "import socket\nsocket.create_connection(('127.0.0.1', 9))\n" + code
        passed = verify(code, tests="assert add(1, 2) == 3")
        refused = verify(network, tests="assert add(1, 2) == 3")
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)

    assert boxed["reward_functions"] == {"math": 1.0, "code": None}
    assert passed["reward_functions"] == {"math": None, "code": 1.0}
    assert refused["reward_functions"] == {"math": None, "code": 0.0}


PYTHON_AND_RAY = "import sys, ray; print('%d.%d' % sys.version_info[:2], ray.__version__)"


def test_the_images_of_a_job_s_ray_cluster_share_one_python_and_one_ray(archives: dict[str, Path]):
    trainer = podman_run("trainer-cpu", "python", "-c", PYTHON_AND_RAY, user=str(NON_ROOT_UID)).split()[-2:]
    options = ("--entrypoint=python",)
    nemo_gym = podman_run("nemo-gym", "-c", PYTHON_AND_RAY, user=str(NON_ROOT_UID), options=options).split()[-2:]
    assert trainer == nemo_gym == ["3.13", "2.60.0"]


def nemo_gym_logs(name: str) -> str:
    logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
    return logs.stdout + logs.stderr


def test_the_nemo_gym_image_starts_its_servers_offline_and_stops_them_on_sigterm(archives: dict[str, Path]):
    """NeMo Gym's example (single-tool-call resources server, simple agent, vllm_model) as its pod runs
    it, without any network: every server's environment is in the image, nothing installs at start.
    Without ray_head_node_address NeMo Gym starts a Ray head of its own in the container."""
    name = f"grpojob-test-{uuid.uuid4().hex[:8]}"
    pod_like = [f"--user={NON_ROOT_UID}", "--read-only", "--tmpfs=/tmp:rw,exec,mode=1777", "--shm-size=1g"]
    flags = [f"--runtime={images.RUNTIME}", *images.ulimits(), "--network=none"]
    configs = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        "responses_api_models/vllm_model/configs/vllm_model.yaml",
    ]
    # Not called: the servers only have to start (the model server is a client of this address).
    policy = ["+policy_base_url=http://127.0.0.1:9/v1", "+policy_api_key=none", "+policy_model_name=tiny"]
    command = [f"+config_paths=[{','.join(configs)}]", *policy]
    run = ["podman", "run", "--detach", f"--name={name}", *flags, *pod_like, image_name("nemo-gym"), *command]
    try:
        # Ray gives a new node 30 s to register with its GCS; on this shared 2-core machine under load a
        # start may miss that. Only that failure is retried, twice.
        for _attempt in range(3):
            subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)
            subprocess.run(run, capture_output=True, check=True)
            started = wait_for_nemo_gym(name)
            if RAY_START_TIMEOUT not in started:
                break
        assert "All 3 / 3 servers ready!" in started, started[-6000:]
        # The kubelet's stop: SIGTERM, then SIGKILL after the grace period (60 s here; the image stops
        # its servers within GRPOJOB_STOP_SECONDS, 20).
        subprocess.run(["podman", "stop", "--time=60", name], capture_output=True, check=True)
        exit_code = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.ExitCode}}", name], capture_output=True, text=True, check=True
        ).stdout.strip()
        stopped = nemo_gym_logs(name)
        assert exit_code == "0", stopped[-6000:]
        assert "SIGTERM: stopping" in stopped and "NeMo Gym finished!" in stopped, stopped[-6000:]
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


RAY_START_TIMEOUT = "The current node timed out during startup"


def wait_for_nemo_gym(name: str) -> str:
    """The container's logs once its servers are ready or it has exited (or after 10 minutes)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        logs = nemo_gym_logs(name)
        state = subprocess.run(["podman", "inspect", "--format", "{{.State.Running}}", name], capture_output=True)
        if "servers ready!" in logs or state.stdout.strip() != b"true":  # not "0 / 3 servers ready. Waiting"
            return logs
        time.sleep(2)
    return nemo_gym_logs(name)


@pytest.fixture
def containerd() -> Iterator[Path]:
    """A private containerd (Debian's) with its own root, state and socket; its socket."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("needs containerd and ctr: make node-packages")
    scratch = Path(tempfile.mkdtemp(prefix="grpojob-ctrd-"))
    (scratch / "config.toml").write_text("version = 2\n")
    socket_path = scratch / "containerd.sock"
    daemon = ["containerd", "--config", str(scratch / "config.toml"), "--address", str(socket_path)]
    places = ["--root", str(scratch / "root"), "--state", str(scratch / "state")]
    process = subprocess.Popen([*daemon, *places], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert socket_path.exists(), "containerd did not start"
        yield socket_path
    finally:
        process.terminate()
        process.wait(timeout=30)
        subprocess.run(["umount", "--recursive", "--lazy", str(scratch / "root")], capture_output=True, check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def test_an_image_archive_loads_into_containerd_and_runs_there(archives: dict[str, Path], containerd: Path):
    names = images.load_into_containerd(archives["operator"], containerd)
    assert names == [image_name("operator")]
    ctr = ["ctr", "--address", str(containerd), "--namespace", "k8s.io"]
    listed = subprocess.run([*ctr, "images", "ls", "--quiet"], capture_output=True, text=True, check=True).stdout
    assert image_name("operator") in listed.split()
    # Its layer blobs are gone once unpacked (the snapshots remain): only manifest and config, under a megabyte.
    content = subprocess.run([*ctr, "content", "ls"], capture_output=True, text=True, check=True).stdout
    sizes = [row.split()[1] for row in content.splitlines()[1:]]
    assert sizes and not [size for size in sizes if size.endswith(("MB", "GB", "MiB", "GiB"))], content
    # ctr runs the image's own user (USER 65532:65532), as the kubelet does when the pod names none.
    run = [*ctr, "run", "--rm", "--read-only", image_name("operator"), f"t-{uuid.uuid4().hex[:8]}"]
    result = subprocess.run([*run, "grpojob-operator", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stdout + result.stderr
