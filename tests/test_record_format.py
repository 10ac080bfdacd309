"""The kept run records' format (condattn.runs.KeptRecord): `<run name>.json.zst`, a zstd frame with the shipped
dictionary whose id the frame names, the same bytes for the same record; the earlier `<run name>.json.gz` still read,
and rewritten as .json.zst by `python -m condattn.runs compact` with the same content."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import zstandard

import condattn.runs as runs
from condattn.runs import KeptRecord, compact, kept_records

NAME = "t_r_none_small_s0"
FILES = {"config.yaml": "seed: 0\n", "metrics.jsonl": '{"step": 1, "split": "train", "loss": 2.5}\n',
         "summary.json": {"status": "finished", "metrics": {"acc": 0.5}, "finished_at": "2026-01-01T00:00:00"}}


def old_record(root: Path, name: str = NAME, files: dict = FILES) -> Path:
    """A record as the earlier code wrote it: gzip -9, no time stamp, of the same JSON."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(files, sort_keys=True).encode(), 9, mtime=0))
    return path


def test_a_record_round_trips_as_one_zstd_frame_with_the_newest_dictionary(tmp_path):
    KeptRecord.of(tmp_path, NAME).write(FILES)
    rec = KeptRecord.of(tmp_path, NAME)
    assert rec.path == tmp_path / f"{NAME}.json.zst" and rec.name == NAME
    assert KeptRecord(rec.path).files == FILES and rec.finished and rec.unreadable is None
    data = rec.path.read_bytes()
    frame = zstandard.get_frame_parameters(data)
    plain = json.dumps(FILES, sort_keys=True).encode()
    assert frame.dict_id == runs.RECORD_DICT_ID and frame.content_size == len(plain) and not frame.has_checksum
    assert (runs.RECORD_DICTS / f"{runs.RECORD_DICT_ID}.zdict").is_file()  # shipped with the package


def test_the_same_record_gives_the_same_bytes(tmp_path):
    a, b = KeptRecord.of(tmp_path / "a", NAME), KeptRecord.of(tmp_path / "b", NAME)
    a.write(FILES)
    first = a.path.read_bytes()
    a.write(json.loads(json.dumps(FILES)))  # written again, from the decoded JSON
    b.write(FILES)
    assert a.path.read_bytes() == first == b.path.read_bytes()


def test_an_old_gzip_record_reads_and_is_listed_once(tmp_path):
    gz = old_record(tmp_path)
    rec = KeptRecord.of(tmp_path, NAME)
    assert rec.path == gz and rec.name == NAME and rec.files == FILES and rec.finished
    assert [(r.name, r.path) for r in kept_records(tmp_path)] == [(NAME, gz)]


def test_where_both_kinds_are_there_the_zstd_one_is_the_record(tmp_path):
    newer = {**FILES, "summary.json": {**FILES["summary.json"], "metrics": {"acc": 0.9}}}
    KeptRecord.of(tmp_path, NAME).write(newer)
    old_record(tmp_path)  # e.g. a merge brings back the run's .json.gz
    old_record(tmp_path, "a_first_run")  # listed in the order of the file names, beside the other one
    assert KeptRecord.of(tmp_path, NAME).summary["metrics"] == {"acc": 0.9}
    assert [(r.name, r.path.name) for r in kept_records(tmp_path)] == [
        ("a_first_run", "a_first_run.json.gz"), (NAME, f"{NAME}.json.zst")]
    rec = KeptRecord.of(tmp_path, "a_first_run")
    rec.write(FILES)  # writing a run's .json.zst removes its .json.gz: one record a run
    assert rec.path.name == "a_first_run.json.zst" and not (tmp_path / "a_first_run.json.gz").exists()


def test_a_truncated_or_foreign_or_undecodable_record_is_named_in_one_line(tmp_path, monkeypatch):
    rec = KeptRecord.of(tmp_path, NAME)
    rec.write(FILES)
    whole = rec.path.read_bytes()
    rec.path.write_bytes(whole[:20])
    assert KeptRecord(rec.path).unreadable == \
        "not a whole zstd file (ZstdError: decompression error: did not decompress full frame)"
    rec.path.write_bytes(b"")
    assert KeptRecord(rec.path).unreadable.startswith("not a whole zstd file (ZstdError: not enough data")
    rec.path.write_bytes(zstandard.ZstdCompressor().compress(b"{not json"))  # no dictionary: read without one
    assert KeptRecord(rec.path).unreadable.startswith("not JSON inside its zstd frame (")
    rec.path.write_bytes(whole)
    monkeypatch.setattr(runs, "RECORD_DICTS", tmp_path / "no_dicts")  # a record from a newer dictionary
    why = KeptRecord(rec.path).unreadable
    assert why == (f"written with zstd dictionary {runs.RECORD_DICT_ID}, which {tmp_path / 'no_dicts'} does not hold "
                   f"({runs.RECORD_DICT_ID}.zdict: a record from a newer condattn? update it)")
    assert "\n" not in why and KeptRecord(rec.path).files is None


def test_compact_rewrites_old_records_with_the_same_content_and_removes_them(tmp_path, capsys):
    gz = old_record(tmp_path)
    other = {**FILES, "patch_report.json": '{"patched": ["blocks.0.attn"]}'}
    old_record(tmp_path, "t_r_none_small_s1", other)
    (tmp_path / "broken.json.gz").write_bytes(gz.read_bytes()[:30])  # unreadable: left as it is
    assert compact([tmp_path]) == 1
    out = capsys.readouterr().out
    assert f"left {tmp_path / 'broken.json.gz'}: not a whole gzip file" in out
    assert f"{tmp_path}: 2 of 3 .json.gz records rewritten as .json.zst" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.json.gz", f"{NAME}.json.zst", "t_r_none_small_s1.json.zst"]
    assert KeptRecord(tmp_path / f"{NAME}.json.zst").files == FILES
    assert KeptRecord(tmp_path / "t_r_none_small_s1.json.zst").files == other
    # the same bytes as a record written now: the migration and `write` agree
    fresh = KeptRecord.of(tmp_path / "fresh", NAME)
    fresh.write(FILES)
    assert fresh.path.read_bytes() == (tmp_path / f"{NAME}.json.zst").read_bytes()
