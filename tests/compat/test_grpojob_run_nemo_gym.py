"""`grpojob run` of examples/nemo-gym-format.yaml: NeMo Gym's format_verification server from our NeMo Gym
image, started by `grpojob run` itself under podman, rewards the tiny model for answers that start with a
number; the rewards vary within groups and GRPO raises them. An image podman does not have is refused
before anything starts, naming the field."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpojob_api import nemo_gym

pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "nemo-gym-format.yaml"
STEPS = 24
RUN_TIMEOUT_S = 900


def example_job(tmp_path: Path, model: Path, image: str) -> Path:
    """The example, with this test's model, its rows by absolute path and the image under test."""
    job = yaml.safe_load(EXAMPLE.read_text())
    spec = job["spec"]
    spec["model"]["path"] = str(model)
    spec["dataset"]["path"] = str(REPO / spec["dataset"]["path"])
    spec["checkpointing"]["path"] = str(tmp_path / "checkpoints")
    assert spec["grpo"]["maxSteps"] == STEPS
    if image != nemo_gym.DEFAULT_IMAGE:
        spec["environments"][0]["image"] = image
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def start_grpojob_run(job: Path, out: Path) -> subprocess.Popen[str]:
    """`grpojob run JOB --out OUT`, in a session of its own, its output piped, with podman's own settings (as a
    user runs it: no containers.conf of ours, though this machine's limits are below podman's defaults)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    env.pop("CONTAINERS_CONF", None)
    command = [sys.executable, "-m", "grpojob_trainer.cli", "run", str(job), "--out", str(out), "--no-progress"]
    return subprocess.Popen(
        command,
        cwd=job.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def grpojob_run(job: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`grpojob run JOB --out OUT` to the end (killed, and the test failed, after `RUN_TIMEOUT_S`)."""
    process = start_grpojob_run(job, out)
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)  # its cleanup stops the NeMo Gym container
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"grpojob run did not finish in {RUN_TIMEOUT_S}s:\n{output[-4000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, output)


def containers_named(prefix: str, owner: int | None = None) -> list[str]:
    """The containers (running or not) whose name starts with ``prefix``, of one `grpojob run` if ``owner``."""
    from grpojob_trainer.local.nemo_gym_containers import OWNER_LABEL

    command = ["podman", "ps", "--all", "--format", "{{.Names}}"]
    if owner is not None:
        command.append(f"--filter=label={OWNER_LABEL}={owner}")
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split() if name.startswith(prefix)]


def test_a_killed_grpojob_run_leaves_no_nemo_gym_container_behind(
    nemo_gym_image: str, tiny_model_dir: Path, tmp_path: Path
):
    """podman's containers are not the run's descendants; its reaper removes them by their owner label."""
    job = example_job(tmp_path, tiny_model_dir, nemo_gym_image)
    process = start_grpojob_run(job, tmp_path / "out")
    try:
        deadline = time.monotonic() + 300
        while not containers_named("grpojob-gym-format-", process.pid):
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no NeMo Gym container within 300 s"
            time.sleep(1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # as when the machine's OOM killer or `kill -9` ends it
        process.communicate()

    deadline = time.monotonic() + 120
    while containers_named("grpojob-gym-format-", process.pid) and time.monotonic() < deadline:
        time.sleep(1)
    assert containers_named("grpojob-gym-format-", process.pid) == []


def test_grpojob_run_trains_on_nemo_gyms_format_verification_and_the_reward_rises(
    nemo_gym_image: str, tiny_model_dir: Path, tmp_path: Path
):
    out = tmp_path / "out"

    run = grpojob_run(example_job(tmp_path, tiny_model_dir, nemo_gym_image), out)

    assert run.returncode == 0, run.stdout[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [r["rollout/reward/mean"] for r in records]
    assert len(curve) == STEPS, run.stdout[-3000:]
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    print(f"format_verification rewards by step: {[round(r, 3) for r in curve]}")
    assert last > first + 0.1, f"reward did not rise: {curve}"
    # NeMo Gym's /verify reward reached the samples: rollouts of a row got different rewards in most steps.
    varied = [int(r["rollout/groups_with_varied_reward"]) for r in records]
    assert sum(v > 0 for v in varied) >= STEPS // 2, varied
    lines = re.findall(r"step (\d+)/24 reward .* failed rollouts 0/64 groups with varied rewards \d/8", run.stdout)
    assert [int(step) for step in lines] == list(range(1, STEPS + 1)), run.stdout[-3000:]
    # NeMo Gym's own log is kept, and its container is gone.
    log = (out / "environments" / "format.log").read_text()
    assert "freeform_formatting" in log, log[-2000:]
    assert containers_named("grpojob-gym-format-") == []


def test_an_image_podman_does_not_have_is_refused_naming_the_field_before_anything_starts(
    nemo_gym_image: str, tiny_model_dir: Path, tmp_path: Path
):
    missing = "localhost/grpojob/no-such-nemo-gym:0"

    run = grpojob_run(example_job(tmp_path, tiny_model_dir, missing), tmp_path / "out")

    assert run.returncode == 2, run.stdout[-3000:]
    assert run.stdout.strip().splitlines()[-1] == (
        f"grpojob: spec.environments[0].image: podman has no image {missing}: `podman pull {missing}`, or build it "
        f"from this repository (`podman build -f images/nemo-gym/Dockerfile -t {missing} .`)"
    )
    assert "Ray is up" not in run.stdout
