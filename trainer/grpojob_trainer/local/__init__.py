"""What `grpojob run` starts beside Ray on this machine: environment servers as subprocesses, NeMo Gym's servers
in podman containers, and the reaper that stops them however the run ends."""
