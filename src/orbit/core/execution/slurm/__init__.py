"""Slurm clusters as a placement: what a cluster offers (facts), the sbatch script made from a
request (script), what Slurm says of a job (jobs), and how its commands are run (shell).

May import what orbit.core.execution may."""
