"""Reliability of the object-store surfaces: the block cache, packs at URLs read and written, and the
network's deadlines. Each check runs against moto's S3 server on 127.0.0.1 behind the fault-injecting
proxy of ``tests/object_store.py`` and returns plain data: counts, and a list of problems (empty: a
pass). The CI test (``tests/reliability/test_reliability_store.py``) runs them with small counts,
``benchmarks/reliability.py --only store`` with the full ones.

* ``cache_ownership``: cache folders holding the user's files (in ``cache_dir``, a shared
  ``PACKLOAD_CACHE``, behind a link), names that look like the cache's own among them, small limits,
  many writes: no file of the user's changed, deleted or followed.
* ``cache_damage``: cached entries damaged between two opens (bytes flipped, cut, grown, another
  entry's bytes with their record, a link to a victim's file, a record damaged or gone): every record
  read afterwards is the pack's, and no victim file changes.
* ``replaced_under_reader``: a pack packed again (or its objects copied over, one shard replaced, one
  deleted) while a reader has it open: every record it gives is the pack it opened, the others raise
  ``PackChangedError``, never a checksum error or another pack's bytes.
* ``destinations``: ``pack``, ``pack --format lmdb``, ``merge`` and the Ray engine's check with
  ``--overwrite`` onto what is not a pack of ours, and failing packs over a pack of ours: refused in
  one line, nothing at the URL changed.
* ``stalls``: a store that never answers, or stops after some bytes, at each kind of request (the
  listing, the manifest, the index, a shard's block, an LMDB object): one line in a bounded time.
* ``faults``: the fuzz: every request of a read drawn at random to go through, be cut halfway, never
  answer, stop after some bytes, or wait; the read gives the pack's records exactly, or one line in
  a bounded time.
* ``redaction``: signed URLs and URLs with a password, good and refused, through ``info``,
  ``verify`` and ``--json``: the signature and the credentials never appear.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TIMEOUT = 0.5  # seconds: the deadline the stall and fault checks configure
BOUND = 20  # a failed read must end within this many deadlines (open and read together)
# The tests judge a bounded time by what bounds it, the attempts a request made (each with its deadline,
# timed on a virtual clock in tests/core/test_remote_deadlines.py); the campaign also times each read
# and counts one past BOUND deadlines as a problem ("overruns": reported, never asserted by a test).
BLOCK = 8192  # a small block size, so a small pack has many blocks


# -- shared helpers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    before = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cli(argv: list[str]) -> tuple[int, str, str]:
    """``packload ARGV`` in this process: (exit code, stdout, stderr)."""
    from packload.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def upload(store: Any, bucket: str, local: Path, key: str) -> str:
    """``local`` (a pack) copied to ``bucket/key``, replacing what was there; its URL."""
    fs = store.filesystem()
    if fs.exists(f"{bucket}/{key}"):
        fs.rm(f"{bucket}/{key}", recursive=True)
    fs.put(str(local), f"{bucket}/{key}", recursive=local.is_dir())
    fs.invalidate_cache()
    return f"s3://{bucket}/{key}"


def objects(store: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``bucket/prefix`` (key -> bytes)."""
    fs = store.filesystem()
    fs.invalidate_cache()
    return {key: fs.cat_file(key) for key in fs.find(f"{bucket}/{prefix}")}


def records(path: str | Path, **options: Any) -> list[bytes]:
    from packload.loaders.read import PackReader

    with PackReader(path, **options) as reader:
        return [bytes(v) for v in reader.payloads(list(range(reader.records)))]


def _tree(root: Path, skip: str | None = None) -> dict[str, tuple[str, Any]]:
    """Every file, folder and link under ``root`` (``skip``: a top-level name left out): its kind and
    content (a file's bytes and times, a link's target)."""
    found: dict[str, tuple[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != skip]
            filenames = [f for f in filenames if f != skip]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = ("dir", None)
            else:
                info = os.stat(path)
                found[rel] = ("file", (Path(path).read_bytes(), info.st_mtime_ns))
    return found


# -- the cache owns only what it wrote -------------------------------------------------------------
def _users_tree(root: Path, rng: random.Random, victim: Path) -> None:
    """The user's files in a cache folder, older than anything cached, with names that look like the
    cache's own among them."""
    names = ["notes.txt", "model.pt", ".lock", "CACHEDIR.TAG", "packload-blocks-old", "0" * 40 + ".blk",
             "1" * 40 + ".rec", "a" * 40 + ".blk.tmp-1-1", "pack-" + "b" * 32, "lmdb-" + "c" * 32, "pip", "torch"]
    for k in range(rng.randint(5, 30)):
        name = rng.choice(names) + ("" if k < len(names) else f"-{k}")
        folder = root / rng.choice(["", "", "pip/http", "torch/hub", "pack-" + "d" * 32])
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # a file of that name is there already
            continue
        path = folder / name
        if os.path.lexists(path):
            continue
        if rng.random() < 0.1:
            path.symlink_to(victim)
        else:
            path.write_bytes(os.urandom(rng.randint(0, 3000)))
            os.utime(path, (1_000_000 + k, 1_000_000 + k))


def cache_ownership(work: Path, runs: int, seed: int = 0) -> dict[str, Any]:
    """See the module's notes."""
    from packload.loaders.read_cache import CACHE_SUBFOLDER, BlockCache, pack_folder_name

    rng = random.Random(seed)
    victim = work / "victim.bin"
    victim.write_bytes(b"the victim's file")
    out: dict[str, Any] = {"runs": runs, "puts": 0, "user_files": 0, "evictions": 0, "problems": []}
    for run in range(runs):
        root = work / f"own-{run}"
        root.mkdir()
        _users_tree(root, rng, victim)
        before = _tree(root)
        out["user_files"] += sum(kind == "file" for kind, _ in before.values())
        how = rng.choice(["cache_dir", "PACKLOAD_CACHE", "link"])
        limit = rng.randint(3000, 30000)
        given: Path | None = root
        if how == "link":
            given = work / f"link-{run}"
            given.symlink_to(root)
        with _environment(PACKLOAD_CACHE=str(root) if how == "PACKLOAD_CACHE" else None):
            cache = BlockCache(None if how == "PACKLOAD_CACHE" else given, limit)
            packs = [pack_folder_name("pack", f"{run}-{k}") for k in range(3)]
            for k in range(rng.randint(20, 80)):
                cache.put(rng.choice(packs), f"entry {k}", os.urandom(rng.randint(100, 3000)))
                out["puts"] += 1
            cache.make_room(limit)
            out["evictions"] += 1
            if cache.used() > limit:
                out["problems"].append(f"run {run} ({how}): {cache.used()} bytes cached, over the limit {limit}")
            cache.close()
        after = _tree(root, skip=CACHE_SUBFOLDER)
        for rel, entry in before.items():
            if after.get(rel) != entry:
                out["problems"].append(f"run {run} ({how}): the user's {rel} was changed or deleted")
        for rel in set(after) - set(before):
            out["problems"].append(f"run {run} ({how}): {rel} written outside packload's folder")
        if victim.read_bytes() != b"the victim's file":
            out["problems"].append(f"run {run} ({how}): written through a link to the victim's file")
            victim.write_bytes(b"the victim's file")
    return out


DAMAGES = ("flip", "cut", "grow", "other entry", "link", "record damaged", "record gone", "record of another")


def _damage(kind: str, blocks: list[Path], rng: random.Random, victim: Path) -> None:
    path = rng.choice(blocks)
    record = path.with_suffix(".rec")
    data = bytearray(path.read_bytes())
    if kind == "flip":
        for _ in range(rng.randint(1, 64)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    elif kind == "cut":
        path.write_bytes(bytes(data[: rng.randrange(len(data))]))
    elif kind == "grow":
        path.write_bytes(bytes(data) + os.urandom(rng.randint(1, 100)))
    elif kind == "other entry":
        other = rng.choice([b for b in blocks if b != path] or [path])
        shutil.copyfile(other, path)
        shutil.copyfile(other.with_suffix(".rec"), record)
    elif kind == "link":
        path.unlink()
        path.symlink_to(victim)
    elif kind == "record damaged":
        raw = bytearray(record.read_bytes())
        raw[rng.randrange(len(raw))] ^= 0x20
        record.write_bytes(bytes(raw))
    elif kind == "record gone":
        record.unlink()
    else:  # "record of another": this entry's record names another entry's bytes
        other = rng.choice([b for b in blocks if b != path] or [path])
        shutil.copyfile(other.with_suffix(".rec"), record)


def cache_damage(store: Any, bucket: str, shards: Path, work: Path, events: int, seed: int = 0) -> dict[str, Any]:
    """See the module's notes. ``shards``: a local shards pack, uploaded here."""
    rng = random.Random(seed)
    url = upload(store, bucket, shards, f"{work.name}-damage.shards")
    expected = records(shards)
    cache = work / "damage-cache"
    victim = work / "damage-victim.bin"
    victim.write_bytes(b"v" * 64)
    options = {"storage_options": store.options, "cache_dir": cache, "block_size": BLOCK}
    out: dict[str, Any] = {"events": events, "by_kind": {}, "refetched": 0, "problems": []}
    if records(url, **options) != expected:
        out["problems"].append("the first read was not the pack")
    for event in range(events):
        blocks = sorted(p for p in cache.rglob("*.blk") if not p.is_symlink())
        kind = DAMAGES[event % len(DAMAGES)]
        _damage(kind, blocks, rng, victim)
        out["by_kind"][kind] = out["by_kind"].get(kind, 0) + 1
        shard_gets = f"/{bucket}/{work.name}-damage.shards/shard-"
        before = store.proxy.count("GET", shard_gets)
        try:
            got = records(url, **options)
        except Exception as exc:  # noqa: BLE001 - any error is a problem here: the pack on the store is whole
            out["problems"].append(f"event {event} ({kind}): {type(exc).__name__}: {exc}")
            continue
        out["refetched"] += store.proxy.count("GET", shard_gets) > before  # the damaged block, fetched again
        if got != expected:
            out["problems"].append(f"event {event} ({kind}): records differ from the pack's")
        if victim.read_bytes() != b"v" * 64:
            out["problems"].append(f"event {event} ({kind}): the victim's file was written")
            victim.write_bytes(b"v" * 64)
    return out


# -- a pack replaced under an open reader ----------------------------------------------------------
REPLACEMENTS = ("pack --overwrite", "objects copied over", "one shard replaced", "one shard deleted")


def replaced_under_reader(store: Any, bucket: str, a: Path, b: Path, b_source: Path, work: Path, runs: int,
                          seed: int = 0) -> dict[str, Any]:
    """See the module's notes. ``a``, ``b``: two local shards packs; ``b_source``: ``b``'s images."""
    from packload.core.errors import ChecksumError, PackChangedError
    from packload.loaders.read import PackReader

    rng = random.Random(seed)
    expected = records(a)
    fs = store.filesystem()
    out: dict[str, Any] = {"runs": runs, "served": 0, "refused": 0, "problems": []}
    for run in range(runs):
        how = REPLACEMENTS[run % len(REPLACEMENTS)]
        key = f"{work.name}-replaced-{run}.shards"
        url = upload(store, bucket, a, key)
        verify = rng.random() < 0.5
        reader = PackReader(url, storage_options=store.options, cache_dir=work / f"replaced-cache-{run % 3}",
                            block_size=rng.choice([4096, 8192, 16384]), check_index=verify)
        try:
            order = list(range(reader.records))
            rng.shuffle(order)
            first = rng.randint(0, len(order) // 2)
            for i in order[:first]:
                bytes(reader.payload(i, verify=verify))
            if how == "pack --overwrite":
                with _environment(AWS_ENDPOINT_URL=store.proxy.endpoint):
                    code, _, err = cli(["pack", str(b_source), url, "--overwrite", "--quiet", "--shard-size", "64K"])
                if code:
                    out["problems"].append(f"run {run}: pack --overwrite failed: {err.strip()}")
            elif how == "objects copied over":
                upload(store, bucket, b, key)
            elif how == "one shard replaced":
                fs.pipe_file(f"{bucket}/{key}/shard-00000.bin", (b / "shard-00000.bin").read_bytes())
            else:
                fs.rm(f"{bucket}/{key}/shard-00001.bin")
            refused = 0
            for i in order:
                try:
                    got = bytes(reader.payload(i, verify=verify))
                except PackChangedError as exc:
                    if isinstance(exc, ChecksumError) or "changed since it was opened" not in str(exc):
                        out["problems"].append(f"run {run} ({how}): record {i}: {exc}")
                    refused += 1
                    continue
                except Exception as exc:  # noqa: BLE001 - any other error is a problem
                    out["problems"].append(f"run {run} ({how}): record {i}: {type(exc).__name__}: {exc}")
                    continue
                if got != expected[i]:
                    out["problems"].append(f"run {run} ({how}, verify={verify}): record {i} is another pack's bytes")
                out["served"] += 1
            out["refused"] += refused
        finally:
            reader.close()
    return out


# -- destinations --------------------------------------------------------------------------------------
def _strangers(store: Any, bucket: str, base: str, work: Path) -> dict[str, str]:
    import lmdb

    fs = store.filesystem()
    path = work / "users.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 22)
    with env.begin(write=True) as txn:
        for k in range(20):
            txn.put(b"key-%d" % k, b"value" * 30)
    env.close()
    made = {
        "notes.txt": {"": b"my notes"},
        "report.pdf": {"": b"%PDF-1.4"},
        "db.lmdb": {"": path.read_bytes()},
        "empty.lmdb": {"": b""},
        "foreign.shards": {"/manifest.json": json.dumps({"format": "other"}).encode(), "/shard-00000.bin": b"x"},
        "nested.shards": {"/manifest.json": b"{}", "/inner/data.bin": b"deep"},
        "named-like-ours.shards": {"/shard-00000.bin": b"not a shard of packload's"},
        "with-notes.shards": {"/index.bin": b"PLIX" + bytes(60), "/notes.txt": b"mine"},
    }
    for name, parts in made.items():
        for suffix, data in parts.items():
            fs.pipe_file(f"{bucket}/{base}/{name}{suffix}", data)
    return {name: f"s3://{bucket}/{base}/{name}" for name in made}


def destinations(store: Any, bucket: str, sources: dict[str, Path], work: Path) -> dict[str, Any]:
    """See the module's notes. ``sources``: ``a`` and ``b`` image folders, and ``broken`` (no image
    that can be packed)."""
    base = f"{work.name}-dest"
    out: dict[str, Any] = {"attempts": 0, "refused": 0, "failed_packs": 0, "problems": []}
    with _environment(AWS_ENDPOINT_URL=store.proxy.endpoint, PACKLOAD_CACHE=str(work / "dest-cache")):
        input_url = f"s3://{bucket}/{base}-input.shards"
        cli(["pack", str(sources["a"]), input_url, "--quiet", "--overwrite"])
        targets = _strangers(store, bucket, base, work)
        before = objects(store, bucket, base)
        for name, url in targets.items():
            for argv in (["pack", str(sources["a"]), url, "--overwrite", "--quiet"],
                         ["pack", str(sources["a"]), url, "--overwrite", "--quiet", "--format", "lmdb"],
                         ["merge", url, input_url, "--overwrite", "--quiet"],
                         ["pack", str(sources["a"]), url, "--engine", "ray", "--overwrite"]):
                out["attempts"] += 1
                code, _, err = cli(argv)
                if code != 2 or "not a pack of packload's" not in err or err.count("\n") != 1:
                    out["problems"].append(f"{' '.join(argv[:1] + argv[3:])} onto {name}: exit {code}: {err.strip()}")
                else:
                    out["refused"] += 1
        if objects(store, bucket, base) != before:
            out["problems"].append("an object at a refused destination changed")
        for backend in ("shards", "lmdb"):
            url = f"s3://{bucket}/{base}-keep.{backend}"
            cli(["pack", str(sources["a"]), url, "--quiet", "--overwrite"])
            kept = objects(store, bucket, f"{base}-keep")
            for argv in (["pack", str(work / "no_such_src"), url, "--overwrite", "--quiet"],
                         ["pack", str(sources["broken"]), url, "--overwrite", "--quiet"]):
                out["failed_packs"] += 1
                code, _, err = cli(argv)
                if code != 2 or objects(store, bucket, f"{base}-keep") != kept:
                    out["problems"].append(f"{argv[1]} over {url}: exit {code}, the pack there changed: {err.strip()}")
    return out


# -- deadlines -----------------------------------------------------------------------------------------
def _too_many_attempts(error: BaseException) -> str | None:
    """What is wrong when ``error`` says a request was tried more than ``RETRIES`` times; None if not."""
    from packload.core.remote_deadlines import RETRIES

    found = re.search(r"after (\d+) attempt\(s\)", str(error))
    if found is not None and int(found.group(1)) > RETRIES:
        return f"{found.group(1)} attempts, more than the {RETRIES} allowed"
    return None


def _timed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - returned for judging
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def stalls(store: Any, bucket: str, shards: Path, lmdb_pack: Path, work: Path) -> dict[str, Any]:
    """See the module's notes."""
    from packload.core.errors import PackloadError
    from packload.loaders.read import PackReader

    shards_url = upload(store, bucket, shards, f"{work.name}-stall.shards")
    lmdb_url = upload(store, bucket, lmdb_pack, f"{work.name}-stall.lmdb")
    shards_key = f"/{bucket}/{work.name}-stall.shards"
    kinds = {"listing": (shards_url, f"/{bucket}?list-type"), "manifest": (shards_url, f"{shards_key}/manifest.json"),
             "index": (shards_url, f"{shards_key}/index.bin"), "block": (shards_url, f"{shards_key}/shard-"),
             "lmdb object": (lmdb_url, f"/{bucket}/{work.name}-stall.lmdb")}
    out: dict[str, Any] = {"cases": [], "problems": [], "overruns": []}
    for kind, (url, path) in kinds.items():
        for after in (None, 100):
            mode = "never answers" if after is None else f"stops after {after} bytes"
            cache = work / f"stall-cache-{kind}-{after}".replace(" ", "-")

            def read(url: str = url, cache: Path = cache) -> None:
                with PackReader(url, storage_options=store.options, cache_dir=cache, block_size=BLOCK,
                                timeout=TIMEOUT) as reader:
                    reader.payloads(list(range(reader.records)))

            store.proxy.stall_next(10_000, "GET", path, after=after)
            try:
                took, error = _timed(read)
            finally:
                store.proxy.release_stalls()
            case = {"kind": kind, "mode": mode, "seconds": round(took, 2), "error": str(error) if error else None}
            out["cases"].append(case)
            if not isinstance(error, PackloadError) or "\n" in str(error):
                out["problems"].append(f"{kind}, {mode}: {type(error).__name__}: {error}")
            elif "did not answer after" not in str(error):
                out["problems"].append(f"{kind}, {mode}: not refused as a deadline passed: {error}")
            elif (many := _too_many_attempts(error)) is not None:
                out["problems"].append(f"{kind}, {mode}: {many}")
            if took > BOUND * TIMEOUT:
                out["overruns"].append(f"{kind}, {mode}: {took:.1f} s, more than {BOUND} x the {TIMEOUT} s deadline")
    return out


def faults(store: Any, bucket: str, shards: Path, work: Path, trials: int, seed: int = 0,
           rate: float = 0.15) -> dict[str, Any]:
    """See the module's notes: each request to the pack's objects meets a fault with chance ``rate``."""
    from packload.core.errors import PackloadError
    from packload.loaders.read import PackReader

    rng = random.Random(seed)
    url = upload(store, bucket, shards, f"{work.name}-faults.shards")
    expected = records(shards)
    prefix = f"/{bucket}/{work.name}-faults.shards"
    out: dict[str, Any] = {"trials": trials, "whole": 0, "refused": 0, "faults": {}, "max_seconds": 0.0,
                           "problems": [], "overruns": []}

    def draw(method: str, path: str) -> tuple[str, Any] | None:
        if not (path.startswith(prefix) or "list-type" in path) or rng.random() >= rate:
            return None
        name, fault = rng.choice([("cut halfway", ("cut", None)), ("never answered", ("stall", None)),
                                  ("stopped mid-body", ("stall", rng.randint(0, 4000))),
                                  ("delayed", ("delay", rng.random() * TIMEOUT * 0.6))])
        out["faults"][name] = out["faults"].get(name, 0) + 1
        return fault

    for trial in range(trials):
        cache = work / f"faults-cache-{trial}"

        def read(cache: Path = cache) -> list[bytes]:
            with PackReader(url, storage_options=store.options, cache_dir=cache, block_size=BLOCK,
                            timeout=TIMEOUT) as reader:
                order = list(range(reader.records))
                rng.shuffle(order)
                got = reader.payloads(order)
                return [bytes(v) for _, v in sorted(zip(order, got, strict=True))]

        store.proxy.fault = draw
        started = time.monotonic()
        try:
            got = read()
            error = None
        except Exception as exc:  # noqa: BLE001 - judged below
            got, error = None, exc
        finally:
            store.proxy.fault = None
            store.proxy.release_stalls()
        took = time.monotonic() - started
        out["max_seconds"] = max(out["max_seconds"], round(took, 2))
        if error is None:
            if got != expected:
                out["problems"].append(f"trial {trial}: records differ from the pack's")
            out["whole"] += 1
        elif not isinstance(error, PackloadError) or "\n" in str(error):
            out["problems"].append(f"trial {trial}: {type(error).__name__}: {error}")
        elif (many := _too_many_attempts(error)) is not None:
            out["problems"].append(f"trial {trial}: {many}")
        else:
            out["refused"] += 1
        if took > BOUND * TIMEOUT * 2:
            out["overruns"].append(f"trial {trial}: {took:.1f} s, more than {2 * BOUND} x the {TIMEOUT} s deadline")
    return out


# -- credentials in URLs -----------------------------------------------------------------------------
def redaction(store: Any, bucket: str, lmdb_pack: Path, work: Path) -> dict[str, Any]:
    """See the module's notes."""
    upload(store, bucket, lmdb_pack, f"{work.name}-signed.lmdb")
    signed = store.filesystem().sign(f"{bucket}/{work.name}-signed.lmdb", expiration=600)
    query = parse_qs(urlsplit(signed).query)
    secret = (query.get("X-Amz-Signature") or query["Signature"])[0]
    credential = (query.get("X-Amz-Credential") or query["AWSAccessKeyId"])[0].split("/")[0]
    urls = {"signed": signed, "refused signature": signed.replace(secret, "0" * len(secret)),
            "password": signed.replace("://", "://user:hunter2@"),
            "missing, signed": signed.replace("-signed.lmdb", "-none.lmdb")}
    out: dict[str, Any] = {"runs": 0, "problems": []}
    with _environment(PACKLOAD_CACHE=str(work / "signed-cache"), PACKLOAD_TIMEOUT="5"):
        for name, url in urls.items():
            for argv in (["info", url], ["info", url, "--json"], ["verify", url, "--json"], ["verify", url]):
                code, stdout, stderr = cli(argv)
                out["runs"] += 1
                for text in (stdout, stderr):
                    for word in (secret, credential, "hunter2"):
                        if word in text or word.replace("/", "%2F") in text:
                            out["problems"].append(f"{' '.join(argv[:1] + argv[2:])} of the {name} URL shows {word!r}")
    return out


# -- all of it -----------------------------------------------------------------------------------------
def store_suite(work: Path, counts: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Every check above, on packs made here, against a store started here (``counts``: the
    ``store_*`` counts of ``benchmarks/reliability.py``)."""
    from packload.packer.pipeline import pack
    from tests.image_factory import make_image_folder, write_broken_files
    from tests.object_store import ObjectStore

    bucket = "reliability"
    work.mkdir(parents=True, exist_ok=True)
    make_image_folder(work / "a", classes=("ant", "bee", "cow"), per_class=12)
    make_image_folder(work / "b", classes=("dog", "emu"), per_class=15, seed=9)
    write_broken_files(work / "broken" / "x")
    pack(work / "a", work / "a.shards", shard_size=1 << 16, progress=False)
    pack(work / "b", work / "b.shards", shard_size=1 << 16, progress=False)
    pack(work / "a", work / "a.lmdb", progress=False)
    sources = {"a": work / "a", "b": work / "b", "broken": work / "broken"}
    for folder in ("own", "damage", "replaced", "dest", "stall", "faults", "signed"):
        (work / folder).mkdir(exist_ok=True)
    results: dict[str, Any] = {}
    with ObjectStore() as store:
        store.make_bucket(bucket)
        for name, run in (
                ("cache_ownership", lambda: cache_ownership(work / "own", counts["store_caches"], seed)),
                ("cache_damage", lambda: cache_damage(store, bucket, work / "a.shards", work / "damage",
                                                      counts["store_damages"], seed)),
                ("replaced", lambda: replaced_under_reader(store, bucket, work / "a.shards", work / "b.shards",
                                                           work / "b", work / "replaced",
                                                           counts["store_replacements"], seed)),
                ("destinations", lambda: destinations(store, bucket, sources, work / "dest")),
                ("stalls", lambda: stalls(store, bucket, work / "a.shards", work / "a.lmdb", work / "stall")),
                ("faults", lambda: faults(store, bucket, work / "a.shards", work / "faults", counts["store_faults"],
                                          seed)),
                ("redaction", lambda: redaction(store, bucket, work / "a.lmdb", work / "signed"))):
            results[name] = run()
    results["stalls"]["timeout"] = TIMEOUT
    results["problems"] = [f"{name}: {problem}" for name, result in results.items() if isinstance(result, dict)
                           for problem in result.get("problems", []) + result.get("overruns", [])]
    return results
