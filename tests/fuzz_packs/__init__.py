"""Field-by-field fuzzing of the read side with hostile packs written from docs/FORMAT.md alone.

An attacker who knows the format takes an intact pack, sets one field (of the index header, an
index entry, a record header, a shard header or the manifest) to an edge value, recomputes every
checksum that would give the change away (the record header's CRC, the entry's payload CRC when the
entry now names other bytes, and the index and shard sha256 in the manifest), and points every read
path at the result. Each case also runs once without that recomputation.

Every read path runs in a worker process: a fork of a server that imported torch once, so that a
worker that dies (a signal) or hangs is replaced in milliseconds, and each pack gets a fresh one
(what one pack's probes leave in a worker never weighs on the next's). A worker's address space is
capped at the server's size plus ``MEMORY_HEADROOM``, and each probe has a wall-time cap. What a
read path returns is compared with ``Reference``, a reader written here from the format document
(plain slicing of the files' bytes, arbitrary-precision arithmetic). A probe fails on a signal, a
hang, an absurd allocation, an exception that is not packload's own (``PackloadError``), or data
that is not what the pack says.

One module a job: ``model`` (the format from the document, the base packs, the editable model),
``cases`` and ``manifest_cases`` (the hostile changes), ``reference`` (the reader from the document),
``judge`` and ``read_paths`` (the probes), ``server`` (the capped worker processes, the sanitizer
build) and ``campaign`` (plan, run, report).

``tests/test_fuzz_pack_fields.py`` runs a representative subset; ``benchmarks/reliability.py --only
fuzz`` and ``pytest -m slow tests/test_fuzz_pack_fields.py`` run the whole grid.
"""
