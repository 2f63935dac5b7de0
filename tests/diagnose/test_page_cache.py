"""What the page cache holds of a file, and emptying it (``packload.diagnose.page_cache``)."""

from __future__ import annotations

import os

import pytest

from packload.diagnose.page_cache import evict, resident_fraction, resident_pages, warm
from tests.machine_files import in_memory


# -- page cache ------------------------------------------------------------------------------------
def test_page_cache_eviction_is_checked(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(2 << 20))
    (tmp_path / "empty.bin").write_bytes(b"")
    assert resident_pages(tmp_path / "empty.bin") == (0, 0)
    warm([str(path)])
    assert resident_fraction([str(path)]) > 0.9
    eviction = evict([str(path)])
    assert eviction.files == 1 and eviction.failed == 0 and eviction.before > 0.9
    if in_memory(tmp_path):
        assert eviction.verified is False  # nothing to evict to: the report must say so
    elif not eviction.verified:
        pytest.skip(f"this filesystem kept the pages cached ({eviction.after:.0%}); nothing to check here")
    else:
        assert eviction.after <= 0.05
