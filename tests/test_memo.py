"""The file memo every cache key's hashing goes through (nslib.data.paths.StatMemo): a value
computed from a file is reused by a later process while the file is unchanged, computed again
once it changes, and a cache that cannot be written only costs the reuse."""
import os

from nslib.data import paths
from nslib.data.paths import StatMemo, hash_files
from nslib.kernels import measured


def test_a_later_process_reuses_the_value_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "data.csv"
    f.write_text("a,b\n1,2\n")
    calls = []

    def compute():
        calls.append(1)
        return f.read_text().upper()

    first = StatMemo("test-kind")
    assert first.get(f, compute) == "A,B\n1,2\n"
    assert first.get(f, compute) == "A,B\n1,2\n" and len(calls) == 1
    first.flush()
    assert (tmp_path / "cache" / "memo" / "test-kind.json").is_file()
    later = StatMemo("test-kind")   # what the next process loads
    assert later.get(f, compute) == "A,B\n1,2\n" and len(calls) == 1
    f.write_text("a,b\n1,2\n3,4\n")   # new size (and time stamp): a new entry
    assert later.get(f, compute) == "A,B\n1,2\n3,4\n" and len(calls) == 2


def test_an_unwritable_cache_keeps_the_memo_in_the_process(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("NSLIB_CACHE", str(blocker))
    f = tmp_path / "x.txt"
    f.write_text("x")
    memo = StatMemo("test-kind")
    assert memo.get(f, lambda: "v") == "v"
    memo.flush()   # no error: nothing can be written there
    assert memo.get(f, lambda: "other") == "v"


def test_file_hashes_follow_the_content(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "t.csv"
    f.write_text("1\n")
    a = hash_files([f])
    paths._FILE_DIGESTS.flush()
    f.write_text("22\n")
    assert hash_files([f]) != a
    os.remove(f)
    f.write_text("1\n")   # the same bytes again: the same hash, whatever the memo holds
    assert hash_files([f]) == a


def test_table_keys_follow_the_files_within_a_process(data_dir, tmp_path):
    from tests.test_data import _mirror
    _mirror(data_dir / "data", tmp_path / "scripts" / "asplos" / "data")
    key = measured.table_key("softmax", "test", tmp_path)
    assert measured.table_key("softmax", "test", tmp_path) == key
    test_csv = measured.source_files("softmax", "test", tmp_path)[0]
    text = test_csv.read_text()
    test_csv.unlink()   # a link to the read-only data: replace it by an edited copy
    test_csv.write_text(text + text.splitlines()[-1] + "\n")
    assert measured.table_key("softmax", "test", tmp_path) != key
