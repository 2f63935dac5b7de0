"""Shared code of the reliability suite: kills, corruption, full disks, hostile packs, many readers.

The CI tests (``tests/reliability/test_reliability_*.py``) call these functions with small counts;
``benchmarks/reliability.py`` calls the very same functions with the full counts and prints the
figures that RELIABILITY.md records. Each check returns plain data (counts and a list of
problems); an empty problem list is a pass.

One module a job: ``packs`` (sources, small packs, the command line), ``crafted`` (hand-made
hostile packs), ``kills``, ``checker`` and ``corruption``, ``hostile``, ``decoder_fuzz``,
``full_disk`` and ``many_readers``. Nothing here imports torch at module level: the SIGKILL and
checker child processes import only what they need, so they start fast.
"""
