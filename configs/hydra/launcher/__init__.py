"""hydra/launcher=slurm: SLURM through hydra-submitit-launcher (the slurm extra)."""
