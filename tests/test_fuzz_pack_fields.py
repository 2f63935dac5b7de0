"""Hostile packs, field by field: every field of the index header, index entries, record headers,
shard headers and the manifest set to edge values (checksums recomputed, and not), against every
read path on both backends, each probe in a capped worker process and judged against a reference
reader written from docs/FORMAT.md (``tests/fuzz_packs/``).

The default run takes a representative subset (each field on both backends with two values, four
read paths per pack in turn); ``pytest -m slow`` and ``benchmarks/reliability.py --only fuzz`` run the
whole grid. A failure message lists every failing probe, grouped by cause.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fuzz_packs import campaign, model, read_paths
from tests.fuzz_packs.manifest_cases import MANIFEST_KEYS
from tests.fuzz_packs.reference import Reference
from tests.fuzz_packs.server import JPEG_BOXES_ASAN, ProbeServer, build_sanitized_kernel


def _report(result: dict[str, Any]) -> str:
    return "\n".join([f"{len(result['failures'])} failing probe(s) of {result['probes']}:",
                      *campaign.failure_report(result, limit=50)])


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return campaign.fuzz_fields(tmp_path_factory.mktemp("fuzz"), "quick")


@pytest.mark.long  # the quick fuzz campaign's packs take most of a minute to make
def test_intact_packs_read_cleanly_on_every_path(quick: dict[str, Any]) -> None:
    """The harness's own check: intact packs pass every read path, so each failure is the change's doing."""
    assert quick["control"] == [], _report(quick)
    per_backend = sum(campaign.applicable(p, payload) for p in read_paths.READ_PATHS
                      for payload in model.PAYLOADS)
    paths = len(model.BACKENDS) * per_backend
    assert quick["outcomes"]["control"] == {"ok": paths}
    assert quick["kernel"], "the compiled resize kernel is not in use: the crop probes would not reach it"


@pytest.mark.long
def test_every_field_is_probed_on_both_backends(quick: dict[str, Any]) -> None:
    coverage = quick["coverage"]
    for group, fields in (("index header", model.INDEX_HEADER_FIELDS), ("index entry", model.ENTRY_FIELDS),
                          ("record header", model.RECORD_FIELDS), ("manifest", MANIFEST_KEYS)):
        for name in fields:
            assert sorted(coverage[group].get(name, [])) == sorted(model.BACKENDS), (group, name)
    assert set(coverage["shard header"]) == set(model.SHARD_FIELDS)
    assert quick["cases"]["manifest"]["cases"] >= 400 and quick["cases"]["index entry"]["cases"] >= 100
    # every read path, on hostile packs (not only the intact ones)
    assert {path: n for path, n in quick["paths"].items() if n < 4} == {}
    assert set(quick["paths"]) == set(read_paths.READ_PATHS)


@pytest.mark.long
def test_hostile_fields_subset(quick: dict[str, Any]) -> None:
    assert not [f for f in quick["failures"] if f["kind"] == "harness"], _report(quick)
    assert quick["failures"] == [], _report(quick)


def test_reference_reads_what_packload_reads(tmp_path: Path) -> None:
    """The reference reader agrees with packload's on intact packs: same payloads, labels, paths."""
    from packload import PackReader

    for path in model.make_bases(tmp_path).values():
        ref = Reference(path)
        assert ref.problems() == []
        with PackReader(path) as reader:
            assert [(r.payload, r.label, r.text_path) for r in ref.records] == [
                (bytes(reader.payload(i)), int(reader.entries["label"][i]), reader.path_of(i))
                for i in range(reader.records)]


@pytest.mark.long  # builds the kernel with the sanitizers
def test_sanitized_resize_kernel(tmp_path: Path) -> None:
    """The resize kernel and the batch decoder built with AddressSanitizer and UBSan, loaded in the
    workers (with libasan preloaded) in place of the installed ones: a deliberate over-read is
    reported, then the PackLoader crop runs over hostile index entries of raw and JPEG packs with no
    report."""
    library, why = build_sanitized_kernel(tmp_path / "asan")
    if library is None:
        pytest.skip(f"cannot build the kernel with sanitizers here: {why}")
    with ProbeServer(f"asan:{library}", tmp_path / "canary.log") as server:
        assert server.info["kernel"] == str(library)
        assert server.info["decoder"] == str(library.with_name(JPEG_BOXES_ASAN)), "the batch decoder's build too"
        answer = server.ask({"canary": True})
    assert answer.get("died") == "SIGABRT" and "AddressSanitizer" in answer["log"], answer
    result = campaign.fuzz_fields(tmp_path / "fuzz", "asan", asan_library=library)
    assert result["kernel"] == str(library)
    assert result["probes"] >= 100
    assert result["control"] == [] and result["failures"] == [], _report(result)


@pytest.mark.slow
def test_hostile_fields_full_grid(tmp_path: Path) -> None:
    result = campaign.fuzz_fields(tmp_path, "full")
    assert result["control"] == [] and result["failures"] == [], _report(result)
