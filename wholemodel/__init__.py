"""From a PyTorch model to problems and back (AutoKernel's stages A and C): built-in small
models, loading a user's model file, profiling with an Amdahl plan, writing the top
kernels as problems, and verifying a model with the best kernels plugged in."""

# ``kernelarc verify``'s sandbox: how long it may run and what its processes may hold (here,
# not in ``sandboxed``, so that the command's parser reads them without importing torch)
VERIFY_TIMEOUT_S = 3600.0
VERIFY_MEMORY_GB = 16.0
