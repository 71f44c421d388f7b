"""The fetch planner (DESIGN §5): decides, does nothing else."""
