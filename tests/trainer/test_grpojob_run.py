"""`grpojob run` end to end on this machine: local Ray, the environment server as a process, the
transformers backend. GRPO raises the reward; a killed trainer resumes at the right step; a dead
environment ends the run with counted failures instead of a hang."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpojob_trainer.policy.checkpoint import latest_checkpoint, list_checkpoints


def write_job(
    tmp: Path, model: Path, *, steps: int, interval: int, environment: dict | None = None, replicas: int = 1
) -> Path:
    data = tmp / "train.jsonl"
    if not data.exists():
        from grpojob_trainer.environments.dataset import write_rows

        write_rows("arithmetic", 128, data)
    job = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml").read_text())
    job["spec"]["model"]["path"] = str(model)
    job["spec"]["dataset"]["path"] = str(data)
    job["spec"]["grpo"]["maxSteps"] = steps
    job["spec"]["checkpointing"] = {"path": str(tmp / "checkpoints"), "interval": interval}
    job["spec"]["training"]["replicas"] = replicas
    if environment is not None:
        job["spec"]["environments"] = [environment]
        job["spec"]["grpo"] |= {"rolloutTimeoutSeconds": 3, "rolloutRetries": 1, "maxFailedSteps": 2}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def grpojob(*args: str, cwd: Path, hub_cache: Path | None = None) -> subprocess.Popen:
    """The grpojob command in a process session of its own, offline (reading ``hub_cache`` where given)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    return subprocess.Popen(
        [sys.executable, "-m", "grpojob_trainer.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        pytest.fail(f"grpojob run did not finish in {timeout}s:\n{out[-3000:]}")
    return out


def rewards(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["rollout/reward/mean"] for line in lines]


def test_grpo_raises_the_mean_reward_of_the_tiny_model(tiny_model_dir: Path, tmp_path: Path):
    job = write_job(tmp_path, tiny_model_dir, steps=24, interval=100)
    process = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 600)
    assert process.returncode == 0, out[-3000:]
    curve = rewards(tmp_path / "out")
    assert len(curve) == 24
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.05 and last > 1.5 * first, f"reward did not rise: {curve}"
    assert (tmp_path / "out" / "reward.png").stat().st_size > 10_000
    assert list((tmp_path / "out").glob("events.out.tfevents.*"))
    record = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("time/generation", "time/prepare", "time/training", "time/weight_sync", "throughput/tokens_per_s"):
        assert record[key] > 0, key
    assert json.loads((tmp_path / "out" / "progress.json").read_text())["step"] == 24
    # One log line per step: its reward, time and failed rollouts (8 prompts x 8 generations).
    lines = re.findall(r"step (\d+)/24 reward [0-9.e+-]+ time [0-9.]+s \(.*\) failed rollouts 0/64", out)
    assert [int(step) for step in lines] == list(range(1, 25)), out[-3000:]


def test_outside_a_terminal_the_run_prints_one_line_a_step_and_no_bar(tiny_model_dir: Path, tmp_path: Path):
    job = write_job(tmp_path, tiny_model_dir, steps=3, interval=100)
    process = grpojob("run", str(job), "--out", str(tmp_path / "out"), cwd=tmp_path)  # a pipe: no bar asked off
    out = finish(process, 600)
    assert process.returncode == 0, out[-3000:]
    assert re.findall(r"training.loop: step (\d+)/3 reward", out) == ["1", "2", "3"], out[-3000:]
    assert "%|" not in out and "\r" not in out, "no progress bar in a pipe"
    assert "Token authentication is enabled" not in out, "Ray's offer to turn off what the run turned on"
    assert "trained steps 1 to 3" in out, "the end-of-run summary"
    logged = (tmp_path / "out" / "run.log").read_text()
    assert re.findall(r"training.loop: step (\d+)/3 reward", logged) == ["1", "2", "3"]


def test_checkpoints_are_written_beside_training_and_each_step_shows_what_it_waited_for(
    tiny_model_dir: Path, tmp_path: Path
):
    job = write_job(tmp_path, tiny_model_dir, steps=4, interval=1)
    run = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(run, 600)
    assert run.returncode == 0, out[-3000:]

    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all(record["time/checkpoint"] >= 0 for record in records), "the stall each step saw"
    # A step's save waits for the write before it, whose time the step then logs.
    assert ["time/checkpoint_write" in record for record in records] == [False, True, True, True]
    assert re.findall(r"step \d+/4 reward .* checkpoint [0-9.]+s\)", out), out[-3000:]
    written = re.findall(r"checkpoint of step (\d+) written in [0-9.]+s", out)
    assert written == ["1", "2", "3", "4"], out[-3000:]
    assert out.index("checkpoint of step 4 written") < out.index("exported the model of step 4"), (
        "written, then exported"
    )
    checkpoints = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert checkpoints == ["step_00000003", "step_00000004"], "the newest two, and nothing half-written"


def test_a_killed_trainer_resumes_from_its_last_checkpoint(tiny_model_dir: Path, tmp_path: Path):
    job = write_job(tmp_path, tiny_model_dir, steps=8, interval=3)
    first = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    deadline = time.monotonic() + 300
    while not any(step >= 3 for step, _ in list_checkpoints(tmp_path / "checkpoints")):
        assert first.poll() is None, first.communicate()[0][-3000:]
        if time.monotonic() > deadline:
            os.killpg(first.pid, signal.SIGKILL)
            pytest.fail(f"no checkpoint of step 3 after 300s:\n{first.communicate()[0][-3000:]}")
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the trainer dies mid-run, as when its pod is evicted
    out = first.communicate()[0]
    assert first.returncode == -signal.SIGKILL, f"the first run ended before it was killed:\n{out[-3000:]}"
    saved = max(step for step, _ in list_checkpoints(tmp_path / "checkpoints"))
    logged = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert saved < 8

    second = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(second, 600)
    assert second.returncode == 0, out[-3000:]
    assert f"resumed from the checkpoint of step {saved}" in out
    assert f"trained steps {saved + 1} to 8" in out
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps[len(logged) :] == list(range(saved + 1, 9)), (
        "the resumed run continues at the step after the checkpoint"
    )
    final = latest_checkpoint(tmp_path / "checkpoints")
    assert final is not None and json.loads((final / "meta.json").read_text())["step"] == 8


def process_tree(root: int) -> dict[int, str]:
    """Every living process descended from ``root`` (by parent chain) or in its session: pid -> command line."""
    parents, sessions = {}, {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(entry.name)], sessions[int(entry.name)] = int(fields[1]), int(fields[3])
    tree = {pid for pid, session in sessions.items() if session == root and pid != root}
    while grown := {pid for pid, parent in parents.items() if (parent == root or parent in tree) and pid not in tree}:
        tree |= grown
    return {pid: command_line(pid) for pid in tree}


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def listening_ports(pids: set[int]) -> set[int]:
    """The ports the environment servers among ``pids`` serve on (their ``PORT`` variable)."""
    ports = set()
    for pid in pids:
        try:
            variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "grpojob_trainer.environments" in command_line(pid):
            ports |= {int(v.split(b"=", 1)[1]) for v in variables if v.startswith(b"PORT=")}
    return ports


def test_a_sigkilled_grpojob_run_leaves_none_of_its_processes_behind(tiny_model_dir: Path, tmp_path: Path):
    """Only `grpojob run` itself is killed (not its process group, as a terminal would): its environment
    server, in a session of its own, and Ray's processes must go with it."""
    job = write_job(tmp_path, tiny_model_dir, steps=1000, interval=1000)
    run = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    metrics = tmp_path / "out" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        assert run.poll() is None, run.communicate()[0][-3000:]
        time.sleep(0.5)
    children = process_tree(run.pid)
    ports = listening_ports(set(children))
    assert ports, f"no environment server among the children of grpojob run: {children}"
    assert any("raylet" in command for command in children.values()), children

    os.kill(run.pid, signal.SIGKILL)
    run.communicate()

    deadline, left = time.monotonic() + 60, children
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = {pid: command for pid, command in children.items() if command_line(pid) == command and command}
    assert left == {}, "processes of the killed grpojob run still running"
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()


DEAD_ENVIRONMENT = """
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def do_POST(self):
        self.send_response(500); self.end_headers(); self.wfile.write(b'"boom"')
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def test_an_environment_that_only_fails_ends_the_run_with_counted_failures(tiny_model_dir: Path, tmp_path: Path):
    environment = {"name": "arithmetic", "command": ["python", "-c", DEAD_ENVIRONMENT]}
    job = write_job(tmp_path, tiny_model_dir, steps=5, interval=100, environment=environment)
    process = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 300)
    assert process.returncode == 1, out[-3000:]
    assert "every rollout failed in 2 consecutive steps" in out and "Traceback" not in out, out[-3000:]
    failed = [
        json.loads(line)["rollout/failed"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    ]
    assert failed == [64.0, 64.0], "each step's 8 prompts x 8 generations are counted as failed"


def test_two_policy_ranks_on_the_cpu_train_sync_weights_and_hand_their_checkpoint_to_one(
    tiny_model_dir: Path, tmp_path: Path
):
    """training.replicas 2 on the CPU: two gloo ranks (FSDP2) behind the loop; then one rank resumes."""
    job = write_job(tmp_path, tiny_model_dir, steps=2, interval=2, replicas=2)
    two = grpojob("run", str(job), "--out", str(tmp_path / "two"), "--no-progress", cwd=tmp_path)
    out = finish(two, 300)
    assert two.returncode == 0 and "Traceback" not in out, out[-3000:]
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["grad_norm"] > 0 and record["generated_tokens"] > 0
        assert record["weight_sync/version"] >= 1  # the engine took the policy's weights
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000002"

    job = write_job(tmp_path, tiny_model_dir, steps=3, interval=3, replicas=1)
    one = grpojob("run", str(job), "--out", str(tmp_path / "one"), "--no-progress", cwd=tmp_path)
    out = finish(one, 300)
    assert one.returncode == 0 and "resumed from the checkpoint of step 2" in out, out[-3000:]
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000003"


def test_two_colocated_ranks_on_the_cpu_each_train_beside_an_engine_that_takes_their_weights(
    tiny_model_dir: Path, tmp_path: Path
):
    """generation.replicas = training.replicas = 2: colocated, the default for an on-policy job whose engines
    match its ranks; each rank is paired with an engine, the environment's two processes call one engine each,
    and every engine serves the new weights after each step."""
    job_path = write_job(tmp_path, tiny_model_dir, steps=2, interval=2, replicas=2)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["generation"]["replicas"] = 2
    job["spec"]["environments"][0]["replicas"] = 2
    job_path.write_text(yaml.safe_dump(job))
    run = grpojob("run", str(job_path), "--out", str(tmp_path / "run"), "--no-progress", cwd=tmp_path)
    out = finish(run, 300)
    assert run.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert "colocated placement" in out, out[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # The oldest weights any engine serves: both engines took each step's new weights.
    first, second = (r["weight_sync/version"] for r in records)
    assert first >= 1 and second == first + 1


def test_two_lora_policy_ranks_on_the_cpu_gather_and_send_their_adapter(tiny_model_dir: Path, tmp_path: Path):
    """training.replicas 2 with LoRA: the adapter's shards are gathered from both gloo ranks for every push,
    checkpoint and the export (merged, the default)."""
    from transformers import AutoModelForCausalLM

    job_path = write_job(tmp_path, tiny_model_dir, steps=2, interval=2, replicas=2)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["training"]["lora"] = {"rank": 8}
    job["spec"]["output"] = {"path": str(tmp_path / "models")}
    job_path.write_text(yaml.safe_dump(job))
    process = grpojob("run", str(job_path), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 300)
    assert process.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert "weight sync: object-store of the adapter" in out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_sync/version"] for r in records] == [2.0, 3.0]  # the start's push, then one per step
    assert (latest_checkpoint(tmp_path / "checkpoints") / "adapter_model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(tmp_path / "models" / "final")  # a whole model, merged


def test_a_job_naming_its_model_and_a_dataset_by_hub_id_leaves_a_model_transformers_loads(
    tiny_model_dir: Path, tmp_path: Path
):
    """The model, and one of two weighted dataset sources, by their ids from one hub cache filled beforehand
    (offline: no network here; the dataset's plain columns made into rows by its mapping); the trained model
    exported at the end and with each checkpoint, in the output directory the job names, which keeps only
    as many of the checkpoints' models as checkpoints (`spec.checkpointing.keep`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpojob_trainer.environments.dataset import write_rows
    from grpojob_trainer.models.hub import place_in_cache

    cache = tmp_path / "hub"
    place_in_cache(tiny_model_dir, "grpojob-tests/tiny-chat", cache)
    rows = [json.loads(line) for line in write_rows("arithmetic", 64, tmp_path / "plain.jsonl", seed=1).open()]
    questions = [row["responses_create_params"]["input"][0]["content"] for row in rows]
    (tmp_path / "plain" / "data").mkdir(parents=True)
    table = pa.table({"question": questions, "answer": [row["expected_answer"] for row in rows]})
    pq.write_table(table, tmp_path / "plain" / "data" / "train-00000-of-00001.parquet")
    place_in_cache(tmp_path / "plain", "grpojob-tests/arithmetic-plain", cache, repo_type="dataset")
    job_path = write_job(tmp_path, tiny_model_dir, steps=6, interval=2)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["checkpointing"]["keep"] = 2
    job["spec"]["model"] = {"id": "grpojob-tests/tiny-chat", "offline": True, "servedModelName": "tiny"}
    mapping = {"promptField": "question", "environment": "arithmetic", "fields": {"expected_answer": "answer"}}
    plain = {"id": "grpojob-tests/arithmetic-plain", "split": "train", "offline": True, "mapping": mapping}
    job["spec"]["dataset"] = {"sources": [{"path": job["spec"]["dataset"]["path"]}, {**plain, "weight": 3}]}
    job["spec"]["output"] = {"path": str(tmp_path / "models"), "everyCheckpoint": True, "dtype": "float32"}
    job_path.write_text(yaml.safe_dump(job))

    process = grpojob("run", str(job_path), "--out", str(tmp_path / "out"), cwd=tmp_path, hub_cache=cache)
    out = finish(process, 600)

    assert process.returncode == 0, out[-3000:]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["final", "step_00000004", "step_00000006"]
    final = tmp_path / "models" / "final"
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    assert any(not torch_equal(a, b) for a, b in zip(model.parameters(), base.parameters(), strict=True)), "trained"
    assert (
        AutoTokenizer.from_pretrained(final).chat_template
        == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    )
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["outputModel"] == f"{tmp_path / 'models'}/final" and progress["outputModelStep"] == 6
    assert "trained model:" in out
    last = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()][-1]
    drawn = [last[f"data/source_{i}/index"] for i in (1, 0)]  # neither source runs out in 6 steps
    assert sum(drawn) == 6 * job["spec"]["grpo"]["promptsPerStep"] and drawn[0] > drawn[1], drawn  # weights 3 : 1
    assert last["rollout/reward/mean"] >= 0 and last["rollout/failed"] == 0, "the mapped rows ran in the environment"


def torch_equal(left, right) -> bool:
    import torch

    return torch.equal(left, right)


def test_a_lora_policy_raises_the_reward_sending_only_its_adapter_and_exports_both_forms(
    tiny_model_dir: Path, tmp_path: Path
):
    """`spec.training.lora`: the engine receives the adapter alone each step; the checkpoints hold the
    adapter and its optimizer state; the job's output is a PEFT adapter directory (`spec.output.format:
    adapter`) and `grpojob export` merges a checkpoint into a model transformers loads as it is."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    job_path = write_job(tmp_path, tiny_model_dir, steps=24, interval=12)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["training"]["lora"] = {"rank": 16, "alpha": 32}
    job["spec"]["training"]["optimizer"]["learningRate"] = 0.05
    job["spec"]["output"] = {"path": str(tmp_path / "models"), "format": "adapter", "dtype": "float32"}
    job_path.write_text(yaml.safe_dump(job))
    process = grpojob("run", str(job_path), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 600)

    assert process.returncode == 0, out[-3000:]
    assert "weight sync: object-store of the adapter" in out, out[-3000:]
    curve = rewards(tmp_path / "out")
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    # An adapter on the projections of a model this small levels off lower than full fine-tuning (about
    # twice the first steps' reward in 24 steps here, against a flat curve without learning).
    assert last > first + 0.02 and last > 1.4 * first, f"reward did not rise: {curve}"
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert checkpoint is not None and (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists(), "a LoRA checkpoint holds no copy of the frozen base"

    adapter_dir = tmp_path / "models" / "final"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["base_model_name_or_path"] == str(tiny_model_dir)
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)

    merged_dir = tmp_path / "merged"
    export = grpojob("export", str(tmp_path / "checkpoints"), str(merged_dir), "--dtype", "float32", cwd=tmp_path)
    assert export.wait(120) == 0, export.communicate()[0]
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    import torch

    tokens = torch.tensor([[5, 9, 13, 21, 34]])
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens).logits, served(tokens).logits, atol=1e-4, rtol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(tokens).logits
    assert not torch.allclose(merged(tokens).logits, base, atol=1e-3), "the adapter trained"


def test_a_lora_target_the_model_lacks_stops_grpojob_run_with_one_line_naming_it(tiny_model_dir: Path, tmp_path: Path):
    job_path = write_job(tmp_path, tiny_model_dir, steps=1, interval=10)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["training"]["lora"] = {"targetModules": ["q_proj", "qkv"]}
    job_path.write_text(yaml.safe_dump(job))
    process = grpojob("run", str(job_path), "--no-progress", cwd=tmp_path)
    out = finish(process, 300)
    assert process.returncode == 2, out[-3000:]
    assert "grpojob: spec.training.lora.targetModules: LlamaForCausalLM has no linear module named 'qkv'" in out
    assert "Traceback" not in out
