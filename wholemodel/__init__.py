"""From a PyTorch model to problems and back (AutoKernel's stages A and C): built-in small
models, loading a user's model file, profiling with an Amdahl plan, writing the top
kernels as problems, and verifying a model with the best kernels plugged in."""
