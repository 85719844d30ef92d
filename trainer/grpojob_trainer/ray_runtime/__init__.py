"""Where the trainer runs: the Ray connection and actor placement, the `<job>-endpoints` rendezvous, `grpojob run`'s
local environment processes, the process reaper and loopback networking helpers."""
