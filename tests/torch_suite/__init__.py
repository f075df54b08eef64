"""PyTorch's own distributed tests on the "commlab" backend: ``python -m tests.torch_suite``."""
