"""Side-by-side benchmarks of patchreg against the peers; ``python -m benchmarks [--quick] [--out PATH]``.

Benchmarks, not tests: nothing here asserts a time. Each section returns rows for the
markdown report (``benchmarks/RESULTS.md``), with the target and pass/miss per row.
"""
