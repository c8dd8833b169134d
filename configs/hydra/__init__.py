"""Hydra config groups of nmt (hydra/launcher=slurm); YAML only, a package for the wheel."""
