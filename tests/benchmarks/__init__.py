"""Tests of the benchmarks (``benchmarks/``)."""
