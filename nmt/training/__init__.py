"""Training: what nmt-train's loop (nmt.commands.train) builds on: the loss and the schedule,
checkpoints, processes and collectives, the run's state, statistics, validation, resuming,
stopping and its logs."""
