"""Code generation: kernel arguments, the barrier, the projection, lowering and nvcc."""
