"""The layer cache's folders on disk (no compiler): whole entries, one per key, trimmed least recently used first,
and the settings the environment gives."""

import json
import os
import subprocess
import sys
import time

import pytest

from prnn_tvm.cache.settings import DEFAULT_MAX_MB, settings
from prnn_tvm.cache.store import INFO, Store, digest
from prnn_tvm.errors import ConfigError


def _writer(size: int):
    return lambda folder: (folder / "layer.so").write_bytes(b"x" * size)


def _put(store, n: int, size: int = 1000):
    return store.put({"n": n}, {"kind": "layer"}, _writer(size))


def test_an_entry_is_found_by_its_key_alone(tmp_path):
    store = Store(tmp_path, 1 << 20)
    assert store.get({"n": 1}) is None
    entry = _put(store, 1)
    assert entry.file("layer.so").read_bytes() == b"x" * 1000 and entry.info["kind"] == "layer"
    assert store.get({"n": 1}).folder == entry.folder and store.get({"n": 2}) is None
    assert entry.digest == digest({"n": 1}) and entry.size > 1000
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing left behind by the write


def test_a_key_with_tuples_is_the_key_json_reads_back(tmp_path):
    store = Store(tmp_path, 1 << 20)
    store.put({"shape": (2, 3)}, {}, _writer(1))
    assert store.get({"shape": (2, 3)}) is not None and store.get({"shape": [2, 3]}) is not None


def test_a_writer_that_fails_leaves_no_entry(tmp_path):
    store = Store(tmp_path, 1 << 20)

    def fail(folder):
        (folder / "layer.so").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        store.put({"n": 1}, {}, fail)
    assert store.get({"n": 1}) is None and store.entries() == [] and list((tmp_path / "tmp").iterdir()) == []


def test_the_first_of_two_stores_of_one_key_wins(tmp_path):
    store = Store(tmp_path, 1 << 20)
    first = store.put({"n": 1}, {"by": "first"}, _writer(10))
    second = store.put({"n": 1}, {"by": "second"}, _writer(20))
    assert second.folder == first.folder and second.info["by"] == "first"
    assert first.file("layer.so").stat().st_size == 10 and len(store.entries()) == 1


def test_a_damaged_or_foreign_entry_is_removed_not_served(tmp_path, caplog):
    store = Store(tmp_path, 1 << 20)
    entry = _put(store, 1)
    entry.file(INFO).write_text("{not json")
    assert store.get({"n": 1}) is None and not entry.folder.exists()
    assert "is damaged" in caplog.text
    entry = _put(store, 2)
    info = json.loads(entry.file(INFO).read_text())
    entry.file(INFO).write_text(json.dumps({**info, "key": {"n": 3}}))  # another key under this digest
    assert store.get({"n": 2}) is None and not entry.folder.exists()


def test_the_least_recently_used_entries_go_first_when_the_bound_is_passed(tmp_path):
    store = Store(tmp_path, 3500)  # room for three entries of ~1 KB
    for n in range(3):
        _put(store, n)
        old = time.time() - 100 + n
        os.utime(store.get({"n": n}).file(INFO), (old, old))
    os.utime(store.entries_dir / digest({"n": 0}) / INFO, (time.time() - 50,) * 2)  # n=0 used after n=1 and n=2
    _put(store, 3)
    kept = {e.info["key"]["n"] for e in store.entries()}
    assert kept == {0, 2, 3}  # n=1, the least recently used, went
    assert store.size() <= 3500


def test_the_entry_just_stored_stays_even_past_the_bound(tmp_path):
    store = Store(tmp_path, 500)
    _put(store, 1)
    entry = _put(store, 2)
    assert [e.folder for e in store.entries()] == [entry.folder]


def test_clear_removes_every_entry(tmp_path):
    store = Store(tmp_path, 1 << 20)
    for n in range(3):
        _put(store, n)
    assert store.clear() == 3 and store.entries() == [] and store.get({"n": 0}) is None


def test_processes_storing_one_key_at_once_leave_one_whole_entry(tmp_path):
    """Eight processes race to store the same key (each writes 1 MB slowly): every one gets the entry, which is
    one writer's whole file, and nothing is left under tmp/."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from prnn_tvm.cache.store import Store\n"
        "def write(folder):\n"
        "    for i in range(16):\n"
        "        with open(folder / 'layer.so', 'ab') as f: f.write(bytes([int(sys.argv[2])]) * 65536)\n"
        "        time.sleep(0.005)\n"
        "entry = Store(Path(sys.argv[1]), 1 << 30).put({'k': 'same'}, {}, write)\n"
        "data = entry.file('layer.so').read_bytes()\n"
        "print(len(data), len(set(data)))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    results = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert results == [["1048576", "1"]] * 8  # whole, and of one writer only
    assert len(Store(tmp_path, 1 << 30).entries()) == 1 and list((tmp_path / "tmp").iterdir()) == []


def test_settings_come_from_the_environment(tmp_path):
    home = settings({"HOME": str(tmp_path)})
    assert home.enabled and home.max_bytes == DEFAULT_MAX_MB << 20
    assert settings({"XDG_CACHE_HOME": str(tmp_path)}).folder == tmp_path / "prnn-tvm"
    assert settings({"XDG_CACHE_HOME": "relative", "PRNN_TVM_CACHE_DIR": str(tmp_path / "c")}).folder == tmp_path / "c"
    assert not settings({"PRNN_TVM_CACHE": "0"}).enabled and not settings({"PRNN_TVM_CACHE": "off"}).enabled
    assert settings({"PRNN_TVM_CACHE_MAX_MB": "0.5"}).max_bytes == 1 << 19


@pytest.mark.parametrize(
    "env, name",
    [
        ({"PRNN_TVM_CACHE": "maybe"}, "PRNN_TVM_CACHE"),
        ({"PRNN_TVM_CACHE_MAX_MB": "-1"}, "PRNN_TVM_CACHE_MAX_MB"),
        ({"PRNN_TVM_CACHE_MAX_MB": "lots"}, "PRNN_TVM_CACHE_MAX_MB"),
    ],
)
def test_a_setting_not_understood_is_refused_by_name(env, name):
    with pytest.raises(ConfigError, match=name):
        settings(env)
