"""Non-allocation proofs: an LD_PRELOAD allocator shim, a seccomp filter and tracemalloc,
run in child processes against any step callable (see docs/many.md, "Non-allocation proofs").
"""
