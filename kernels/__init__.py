"""Triton kernels for the GPU engine, each beside a torch reference of the same math."""
