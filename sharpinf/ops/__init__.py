"""Python launchers for kernels_cu/, one module per kernel family, each with its NumPy reference."""
