"""Orchard Env benchmarks: `make bench` (or `python -m bench.run`). Every figure is printed beside a peer
measured in the same run on the same machine, and written to `bench/results/` and `docs/BENCHMARKS.md`."""
