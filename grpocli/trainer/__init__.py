"""The training loop (Accelerate), batching, checkpoints and resume."""
