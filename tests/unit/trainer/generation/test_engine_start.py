"""A generation engine that fails to start says why in one line (the job's status), not "see root cause
above": the cause is read from the log the engine's own processes share with ours, or from the container's
out-of-memory kills."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from grpojob_trainer.errors import CannotRun, EngineStartFailed, cannot_run
from grpojob_trainer.generation.engine_start import EngineStartWatch, root_cause

VLLM_FAILED = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")

# What vLLM's engine process writes when it cannot start (its process tag and log prefix on every line).
ENGINE_LOG = """\
(EngineCore_DP0 pid=4242) INFO 12-07 16:12:31 [core.py:93] Initializing a V1 LLM engine (v0.26.0)
(EngineCore_DP0 pid=4242) ERROR 12-07 16:12:40 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 12-07 16:12:40 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 12-07 16:12:40 [core.py:708]   File "vllm/v1/engine/core.py", line 699, in run
(EngineCore_DP0 pid=4242) ERROR 12-07 16:12:40 [core.py:708]     raise ValueError(msg)
(EngineCore_DP0 pid=4242) ERROR 12-07 16:12:40 [core.py:708] ValueError: Free memory on device (20.1/79.1 GiB) \
on startup is less than desired GPU memory utilization (0.35, 27.7 GiB).
Traceback (most recent call last):
  File "vllm/v1/engine/async_llm.py", line 140, in from_engine_args
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_root_cause_is_the_engine_processs_last_exception_not_vllms_see_above():
    assert root_cause(ENGINE_LOG) == (
        "ValueError: Free memory on device (20.1/79.1 GiB) on startup is less than desired GPU memory "
        "utilization (0.35, 27.7 GiB)."
    )
    assert root_cause("INFO starting\nRuntimeError: Engine core initialization failed. See root cause above.") is None


def test_processes_killed_for_memory_while_the_engine_started_are_named_with_the_field_to_raise(tmp_path: Path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    watch = EngineStartWatch.now(oom_files=(events,))
    events.write_text("low 0\nhigh 0\nmax 40\noom 3\noom_kill 3\n")
    failed = watch.explain(VLLM_FAILED)
    assert isinstance(failed, EngineStartFailed)
    assert "killed 2 process(es) of its container for memory" in str(failed)
    assert "spec.training.resources.memory" in str(failed) and "\n" not in str(failed)


def test_without_a_log_or_a_memory_count_the_engines_own_error_is_kept(tmp_path: Path):
    watch = EngineStartWatch(log_offsets={}, oom_kills=None, oom_files=(tmp_path / "absent",))
    assert str(watch.explain(VLLM_FAILED)) == (
        "the vLLM engine did not start: RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )


def test_an_error_that_says_why_itself_is_left_as_it_is(tmp_path: Path):
    # vLLM refusing a configuration in this process (the LoRA fallback looks for these), whatever the log holds.
    log = tmp_path / "worker.err"
    watch = EngineStartWatch(log_offsets={log: 0}, oom_kills=None, oom_files=())
    log.write_text("ModuleNotFoundError: No module named 'flash_attn'\n")
    refused = ValueError("LoRA is not supported for this model")
    assert watch.explain(refused) is refused


def test_vllms_log_on_stdout_and_a_memory_kill_are_both_named(tmp_path: Path):
    # vLLM logs to stdout; a process killed for memory and the exception the engine logged go into one line.
    out, events = tmp_path / "worker.out", tmp_path / "memory.events"
    out.write_text("INFO an earlier engine\nValueError: an earlier failure\n")
    events.write_text("oom_kill 0\n")
    watch = EngineStartWatch(log_offsets={out: out.stat().st_size}, oom_kills=0, oom_files=(events,))
    with out.open("a") as file:
        file.write("(EngineCore_DP0 pid=7) ERROR 12-07 16:12:40 [core.py:708] Exception: compile worker died\n")
    events.write_text("oom_kill 1\n")
    failed = str(watch.explain(RuntimeError("Engine core initialization failed. See root cause above.")))
    assert failed.startswith("the vLLM engine did not start: the kernel killed 1 process(es) of its container")
    assert failed.endswith("; Exception: compile worker died")


def test_a_process_logging_to_a_file_as_a_ray_worker_does_reads_its_engine_processs_cause(tmp_path: Path):
    # The engine's process inherits our stderr, a file (a Ray worker's log); an error logged before the start
    # began is not this start's cause.
    engine_log = tmp_path / "engine.log"
    engine_log.write_text(ENGINE_LOG)
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        from pathlib import Path
        from grpojob_trainer.generation.engine_start import EngineStartWatch
        print("ValueError: an older failure, before this engine", file=sys.stderr, flush=True)
        watch = EngineStartWatch.now(oom_files=(Path({str(tmp_path / "none")!r}),))
        engine = "import sys; sys.stderr.write(open(sys.argv[1]).read())"
        subprocess.run([sys.executable, "-c", engine, {str(engine_log)!r}])
        print(watch.explain(RuntimeError("Engine core initialization failed. See root cause above.")))
        later = EngineStartWatch.now(oom_files=watch.oom_files)  # nothing logged since: no cause of its own
        print(later.explain(RuntimeError("Engine core initialization failed. See root cause above.")))
        """
    )
    log = tmp_path / "worker.err"
    with log.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", script], stderr=stderr, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0, log.read_text()
    assert done.stdout.splitlines() == [
        "the vLLM engine did not start: ValueError: Free memory on device (20.1/79.1 GiB) on startup is less than "
        "desired GPU memory utilization (0.35, 27.7 GiB).",
        "the vLLM engine did not start: RuntimeError: Engine core initialization failed. See root cause above.",
    ]


def test_a_module_the_image_lacks_is_a_start_no_retry_would_mend(tmp_path: Path):
    log = tmp_path / "worker.err"
    log.write_text("")
    watch = EngineStartWatch(log_offsets={log: 0}, oom_kills=None, oom_files=())
    log.write_text(
        "(EngineCore_DP0 pid=9) ERROR 12-07 19:33:02 [core.py:708] ModuleNotFoundError: No module named 'torchvision'\n"
    )
    failed = watch.explain(VLLM_FAILED)
    assert isinstance(failed, CannotRun) and isinstance(failed, EngineStartFailed)
    assert str(failed) == "the vLLM engine did not start: ModuleNotFoundError: No module named 'torchvision'"
    raised_here = watch.explain(ModuleNotFoundError("No module named 'vllm'"))
    assert isinstance(raised_here, CannotRun), "an import that fails in this process is the same"


def test_a_start_that_ran_out_of_memory_may_be_retried_whatever_it_logged(tmp_path: Path):
    log, events = tmp_path / "worker.err", tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    watch = EngineStartWatch(log_offsets={log: 0}, oom_kills=0, oom_files=(events,))
    log.write_text("ImportError: a compile worker died while importing\n")
    events.write_text("oom_kill 1\n")
    failed = watch.explain(VLLM_FAILED)
    assert isinstance(failed, EngineStartFailed) and not isinstance(failed, CannotRun)
    assert not isinstance(
        watch.explain(RuntimeError("Engine core initialization failed. See root cause above.")), CannotRun
    )


def test_a_start_no_retry_would_mend_is_found_behind_the_error_ray_raises_in_the_trainer():
    from ray.exceptions import RayTaskError

    from grpojob_trainer.policy.memory import PolicyDoesNotFit

    refused = PolicyDoesNotFit("the policy does not fit its GPU: it needs 61.0 GiB for micro-batch 8")
    raised = RayTaskError("PolicyWorker.start", "Traceback (most recent call last): ...", refused)
    assert cannot_run(raised.as_instanceof_cause()) is refused
    assert cannot_run(raised) is refused
    assert cannot_run(RayTaskError("f", "...", ValueError("a bug"))) is None
