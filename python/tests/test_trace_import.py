"""Trace importers, the restricted unpickler, the Trace model and trace format v1."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import struct
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest_trace as ct  # noqa: E402

ct.import_vramkit_pure()

from vramkit.trace import (  # noqa: E402
    Trace, TraceWriter, default_trace_path, detect_format, iter_records, load_trace, read_v1,
    snapshot_to_trace, write_v1,
)
from vramkit.trace import safe_pickle, v1  # noqa: E402

SHARED = ct.shared_traces()
need_shared = pytest.mark.skipif(SHARED is None, reason="VRAMKIT_SHARED_TRACES is not set (folder of the real traces)")

# Peak live requested bytes of the real traces (the anchors' figures).
ANCHORS = {
    "gpt2_train.trace.csv.gz": 13594206920,
    "bert_dynamic_infer.trace.csv.gz": 755556864,
    "mixed_streams.trace.csv.gz": 251133952,
    "resnet50_train.trace.csv.gz": 6057040912,
    "mixed_streams.snapshot.pickle": 251133952,
}
# Operation counts of the anchors' .ops files (leftover allocations freed at the end).
ANCHOR_OPS = {"gpt2_train": 12358, "bert_dynamic_infer": 29724, "mixed_streams": 1200, "resnet50_train": 7168}


def write(path, data: bytes | str):
    mode = "w" if isinstance(data, str) else "wb"
    with open(path, mode) as f:
        f.write(data)
    return path


# -- real traces -----------------------------------------------------------------------------------
def test_packaged_default_trace():
    path = default_trace_path()
    assert detect_format(path) == "pytorch-trace-csv"
    tr = load_trace(path)
    tr.validate()
    assert tr.name == "bert_dynamic_infer"
    assert tr.peak_live_bytes() == 755556864
    assert len(tr) == 29722 and tr.n_allocs == 14862 and tr.left_live == 2
    assert tr.replay_ops().shape == (ANCHOR_OPS["bert_dynamic_infer"], 3)
    assert tr.metadata["events"]["free_completed"] == 14860


@need_shared
@pytest.mark.parametrize("fname", sorted(ANCHORS))
def test_real_traces_match_anchor_peaks(fname):
    path = SHARED / fname
    tr = load_trace(path)
    tr.validate()
    assert tr.peak_live_bytes() == ANCHORS[fname]
    assert tr.skipped_frees == 0
    name = fname.split(".")[0]
    assert tr.replay_ops().shape[0] == ANCHOR_OPS[name]
    assert detect_format(path) == ("pytorch-snapshot" if fname.endswith(".pickle") else "pytorch-trace-csv")


@need_shared
def test_snapshot_and_csv_of_the_same_run_agree():
    a = load_trace(SHARED / "mixed_streams.snapshot.pickle")
    b = load_trace(SHARED / "mixed_streams.trace.csv.gz")
    assert np.array_equal(a.ops, b.ops)
    assert a.streams == b.streams and len(a.streams) == 2
    assert np.array_equal(a.t_us, b.t_us)
    assert a.metadata["from"] == "device_traces"


# -- PyTorch trace CSV -----------------------------------------------------------------------------
CSV_HEAD = "t_us,action,addr,size,stream\n"


def test_csv_plain_and_gzip(tmp_path):
    body = CSV_HEAD + "".join([
        "1,segment_alloc,4096,2097152,0\n",
        "2,alloc,4096,100,0\n",
        "3,alloc,8192,300,7\n",
        "4,free_requested,4096,100,0\n",
        "5,free_completed,4096,100,0\n",
        "6,alloc,4096,50,0\n",
        "7,snapshot,0,350,0\n",
        "8,oom,0,1048576,0\n",
    ])
    for path in (write(tmp_path / "a.csv", body), write(tmp_path / "b.bin", gzip.compress(body.encode()))):
        assert detect_format(path) == "pytorch-trace-csv"
        tr = load_trace(path)
        tr.validate()
        assert tr.ops.tolist() == [[0, 0, 100, 0, 0], [0, 1, 300, 1, 0], [1, 0, 100, 0, 0], [0, 2, 50, 0, 0]]
        assert tr.streams == [0, 7]
        assert tr.t_us.tolist() == [2, 3, 4, 6]
        assert tr.peak_live_bytes() == 400 and tr.left_live == 2
        assert tr.metadata["events"] == {"segment_alloc": 1, "alloc": 3, "free_requested": 1,
                                         "free_completed": 1, "snapshot": 1, "oom": 1}


def test_csv_skipped_frees_and_address_reuse(tmp_path):
    body = CSV_HEAD + "1,free_requested,999,10,0\n2,alloc,16,10,0\n3,alloc,16,20,0\n4,free_requested,16,20,0\n"
    tr = load_trace(write(tmp_path / "t.csv", body))
    tr.validate()
    assert tr.skipped_frees == 1
    assert tr.metadata["implicit_frees"] == 1
    assert tr.ops[:, 0].tolist() == [0, 1, 0, 1] and tr.left_live == 0


@pytest.mark.parametrize("row, needle", [
    ("5,bogus_action,16,10,0", "line 3: unknown action 'bogus_action'"),
    ("5,alloc,16,ten,0", "line 3: size is not an integer"),
    ("5,alloc,0xZZ,10,0", "line 3: addr is not an integer"),
    ("5,alloc,16,10", "line 3: expected 5 fields"),
    ("5,alloc,16,-4,0", "line 3: negative size"),
])
def test_csv_bad_rows(tmp_path, row, needle):
    path = write(tmp_path / "bad.csv", CSV_HEAD + "1,alloc,8,10,0\n" + row + "\n")
    with pytest.raises(ValueError) as exc:
        load_trace(path)
    assert needle in str(exc.value) and "bad.csv" in str(exc.value)


def test_empty_and_blank_files(tmp_path):
    for path in (write(tmp_path / "empty.csv", b""), write(tmp_path / "empty.gz", gzip.compress(b""))):
        with pytest.raises(ValueError, match="empty"):
            load_trace(path)
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(write(tmp_path / "blank.csv", "\n\n\n"))


def test_unknown_format(tmp_path):
    for i, data in enumerate([b"hello world\n1,2,3\n", bytes(range(256)), b"PK\x03\x04zipfile", b"VKTR"]):
        with pytest.raises(ValueError, match="unknown trace format"):
            load_trace(write(tmp_path / f"u{i}.trace.csv.gz", data))


def test_truncated_gzip(tmp_path):
    data = open(default_trace_path(), "rb").read()
    for cut in (10, 1000, len(data) // 2, len(data) - 4):  # inside and beyond the sniffed prefix
        path = write(tmp_path / f"cut{cut}.csv.gz", data[:cut])
        with pytest.raises(ValueError, match="gzip"):
            load_trace(path)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(ValueError):
        load_trace(write(tmp_path / "flipped.csv.gz", bytes(bad)))


def test_non_utf8_csv(tmp_path):
    path = write(tmp_path / "latin.csv", CSV_HEAD.encode() + b"1,alloc,8,10,0\n2,\xff\xfe,8,1,0\n")
    with pytest.raises(ValueError, match="line 3: not UTF-8"):
        load_trace(path)
    # Far into a file (past the text reader's read-ahead), in a gzip too, and after a character cut
    # at a 1 MiB read: the error names the line holding the bad byte.
    rows = b"".join(b"%d,alloc,%d,10,0\n" % (i, 8 * i + 8) for i in range(100000))
    body = CSV_HEAD.encode() + rows + b"5,alloc,8,\xff,0\n"
    bad_line = body.count(b"\n")
    for name, data in (("far.csv", body), ("far.csv.gz", gzip.compress(body))):
        with pytest.raises(ValueError, match=f"line {bad_line}: not UTF-8"):
            load_trace(write(tmp_path / name, data))
    pad = (1 << 20) - len(CSV_HEAD.encode()) - 1  # a two-byte character across the first 1 MiB boundary
    cut = CSV_HEAD.encode() + b"#" * pad + "\u00e9".encode() + b"\n" + b"1,alloc,8,\xff,0\n"
    from vramkit.trace import importers
    assert importers._bad_utf8_line(write(tmp_path / "cut.csv", cut)) == 3


# -- RMM log ---------------------------------------------------------------------------------------
RMM_SAMPLE = """Thread,Time,Action,Pointer,Size,Stream
140573312345856,23:59:59.900000,allocate,0x7f8a40000000,1024,0x0
140573312345856,23:59:59.950000,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345999,23:59:59.960000,allocate failure,(nil),1099511627776,0x0
140573312345856,00:00:00.100000,free,0x7f8a40000000,1024,0x0
140573312345856,00:00:00.200000,free,0x7f8a50000000,64,0x0
140573312345856,00:00:00.300000,allocate,0x7f8a40000000,512,0x7f8a38001020
"""


def test_rmm_log(tmp_path):
    path = write(tmp_path / "rmm_log.dev0.csv", RMM_SAMPLE)
    assert detect_format(path) == "rmm-csv-log"
    tr = load_trace(path)
    tr.validate()
    assert tr.source == "rmm-csv-log"
    assert tr.ops.tolist() == [[0, 0, 1024, 0, 0], [0, 1, 2048, 1, 0], [1, 0, 1024, 0, 0], [0, 2, 512, 1, 0]]
    assert tr.streams == [0, 0x7F8A38001020]
    assert tr.skipped_frees == 1 and tr.left_live == 2
    assert tr.peak_live_bytes() == 3072
    assert tr.metadata["events"]["allocate failure"] == 1 and tr.metadata["threads"] == 2
    day = 24 * 3600 * 1_000_000
    assert tr.t_us.tolist() == [86399_900000, 86399_950000, day + 100000, day + 300000]
    gz = write(tmp_path / "rmm.gz", gzip.compress(RMM_SAMPLE.encode()))
    assert np.array_equal(load_trace(gz).ops, tr.ops)


@pytest.mark.parametrize("line, needle", [
    ("1,12:00:00.0,allocate,0x10,abc,0x0", "Size is not an integer"),
    ("1,noon,allocate,0x10,10,0x0", "Time is not"),
    ("1,12:00:00.0,reallocate,0x10,10,0x0", "unknown action"),
    ("1,12:00:00.0,allocate,0xZZ,10,0x0", "Pointer is not an integer"),
])
def test_rmm_bad_lines(tmp_path, line, needle):
    path = write(tmp_path / "rmm.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + line + "\n")
    with pytest.raises(ValueError, match=needle):
        load_trace(path)


# -- PyTorch snapshots -----------------------------------------------------------------------------
def frames(*files):
    return [{"filename": f, "line": 10 + i, "name": f"fn{i}"} for i, f in enumerate(files)]


def synthetic_snapshot() -> dict:
    """The newest schema: time_us, frames, compile_context, allocator_settings, annotations."""
    torch_frames = frames("/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                          "/home/u/proj/model.py", "/home/u/proj/train.py")
    entries = [
        {"action": "free_requested", "addr": 1, "size": 5, "stream": 0, "time_us": 1},  # ring buffer start
        {"action": "segment_alloc", "addr": 1 << 20, "size": 2 << 20, "stream": 0, "time_us": 2},
        {"action": "alloc", "addr": 1 << 20, "size": 1000, "stream": 0, "time_us": 3,
         "frames": torch_frames, "compile_context": "", "user_metadata": ""},
        {"action": "alloc", "addr": (1 << 20) + 1024, "size": 3000, "stream": 99, "time_us": 4,
         "frames": frames("??", "/x/aten/src/ATen/native/cuda/Copy.cu", "/home/u/proj/data.py")},
        {"action": "alloc", "addr": (1 << 20) + 8192, "size": 7, "stream": 0, "time_us": 5,
         "frames": frames("/site-packages/torch/_tensor.py")},  # only torch frames: the leaf
        {"action": "free_requested", "addr": 1 << 20, "size": 1000, "stream": 0, "time_us": 6},
        {"action": "free_completed", "addr": 1 << 20, "size": 1000, "stream": 0, "time_us": 7},
        {"action": "oom", "device_free": 123, "size": 1 << 30, "stream": 0, "time_us": 8},
        {"action": "snapshot", "addr": 0, "size": 3007, "stream": 0, "time_us": 9},
        {"action": "segment_map", "addr": 1 << 30, "size": 2 << 20, "stream": 0, "time_us": 10},
    ]
    segments = [{
        "device": 0, "address": 1 << 20, "total_size": 2 << 20, "allocated_size": 4096,
        "active_size": 4096, "requested_size": 3007, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [
            {"address": 1 << 20, "size": 1024, "requested_size": 1000, "state": "inactive", "frames": []},
            {"address": (1 << 20) + 1024, "size": 3072, "requested_size": 3000, "state": "active_allocated",
             "frames": frames("/home/u/proj/data.py")},
            {"address": (1 << 20) + 4096, "size": (2 << 20) - 4096, "requested_size": 0, "state": "inactive",
             "frames": []},
        ]}]
    return {"segments": segments, "device_traces": [entries],
            "allocator_settings": {"expandable_segments": False, "roundup_power2_divisions": {"1": 0}},
            "external_annotations": [{"name": "step", "stage": "START", "device": 0, "time_us": 1}]}


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("compress", [False, True])
def test_snapshot_device_traces(tmp_path, protocol, compress):
    data = pickle.dumps(synthetic_snapshot(), protocol=protocol)
    path = write(tmp_path / "snap.pickle", gzip.compress(data) if compress else data)
    assert detect_format(path) == "pytorch-snapshot"
    tr = load_trace(path)
    tr.validate()
    assert tr.source == "pytorch-snapshot" and tr.metadata["from"] == "device_traces"
    assert tr.ops[:, 0].tolist() == [0, 0, 0, 1]
    assert tr.skipped_frees == 1 and tr.left_live == 2
    assert tr.peak_live_bytes() == 4007
    assert tr.streams == [0, 99]
    sites = [tr.sites[s] for s in tr.ops[:, 4]]
    assert sites == ["/home/u/proj/model.py:11", "/home/u/proj/data.py:12",
                     "/site-packages/torch/_tensor.py:10", "/home/u/proj/model.py:11"]
    assert tr.metadata["events"]["oom"] == 1 and tr.metadata["events"]["segment_map"] == 1
    assert tr.metadata["allocator_settings"]["expandable_segments"] is False


def test_snapshot_older_schema_and_devices():
    snap = synthetic_snapshot()
    for e in snap["device_traces"][0]:  # older builds: no time_us, no compile_context
        e.pop("time_us", None)
        e.pop("compile_context", None)
    del snap["allocator_settings"], snap["external_annotations"]
    snap["device_traces"] = [[], snap["device_traces"][0]]
    tr = snapshot_to_trace(snap)
    assert tr.t_us is None and tr.metadata["device"] == 1
    assert tr.peak_live_bytes() == 4007
    with pytest.raises(ValueError):
        snapshot_to_trace({"device_traces": [[{"action": "alloc", "addr": "x", "size": 1, "stream": 0}]]})
    # A device the snapshot holds nothing of, or no device number at all, is an error, not an empty trace.
    for bad, msg in ((5, "nothing of device 5 .devices with events: \\[1\\]; with segments: \\[0\\]"),
                     (-1, "not -1"), (True, "not True"), ("0", "not '0'")):
        with pytest.raises(ValueError, match=msg):
            snapshot_to_trace(snap, device=bad)
    assert snapshot_to_trace(snap, device=0).metadata["from"] == "segments"  # device 0 has segments only


def test_snapshot_state_only_uses_segments(tmp_path):
    snap = synthetic_snapshot()
    snap["device_traces"] = [[]]  # recorded with enabled="state"
    blocks = snap["segments"][0]["blocks"]
    blocks.append({"size": 512, "requested_size": 500, "state": "active_pending_free", "frames": []})
    blocks.append({"size": 512, "requested_size": 500, "state": "active_awaiting_free", "frames": []})
    legacy = {"device": 0, "address": 1 << 30, "total_size": 4096, "stream": 5, "segment_type": "large",
              "blocks": [{"size": 4096, "state": "active_allocated",
                          "history": [{"addr": 1 << 30, "real_size": 4000, "frames": frames("/p/legacy.py")}]}]}
    snap["segments"].append(legacy)
    path = write(tmp_path / "state.pkl", pickle.dumps(snap, protocol=4))
    tr = load_trace(path)
    tr.validate()
    assert tr.metadata["from"] == "segments"
    assert tr.ops[:, 2].tolist() == [3000, 4000] and tr.left_live == 2
    assert [tr.sites[s] for s in tr.ops[:, 4]] == ["/home/u/proj/data.py:10", "/p/legacy.py:10"]
    assert tr.streams == [0, 5]
    bad = pickle.loads(pickle.dumps(snap))
    bad["segments"][0]["blocks"][1]["size"] = -100
    with pytest.raises(ValueError, match=r"segments\[0\]\.blocks\[1\]: negative size -100"):
        snapshot_to_trace(bad)
    # torch.cuda.memory_snapshot() returns the segments list alone
    only = snapshot_to_trace(snap["segments"])
    assert np.array_equal(only.ops, tr.ops)


@need_shared
def test_real_snapshot_file_has_everything():
    obj = safe_pickle.load_file(SHARED / "mixed_streams.snapshot.pickle")
    assert set(obj) >= {"segments", "device_traces", "allocator_settings"}
    state_only = dict(obj, device_traces=[[]])
    tr = snapshot_to_trace(state_only)
    tr.validate()
    assert tr.metadata["from"] == "segments" and tr.n_frees == 0


def test_not_a_snapshot(tmp_path):
    for i, obj in enumerate([[1, 2, 3], {"a": 1}, "text", {"device_traces": "nope"}]):
        with pytest.raises(ValueError):
            load_trace(write(tmp_path / f"n{i}.pickle", pickle.dumps(obj, protocol=4)))


# -- hostile pickles -------------------------------------------------------------------------------
class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", range(0, 6))
def test_hostile_pickle_refused_without_running(tmp_path, protocol):
    marker = tmp_path / "PWNED"
    payload = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": _RunsCode(marker)}]]}
    path = write(tmp_path / "evil.pickle", pickle.dumps(payload, protocol=protocol))
    with pytest.raises(ValueError, match="refusing pickle: it would import/call") as exc:
        load_trace(path)
    assert "system" in str(exc.value)
    assert not marker.exists()
    gz = write(tmp_path / "evil.pickle.gz", gzip.compress(pickle.dumps(_RunsCode(marker), protocol=protocol)))
    with pytest.raises(ValueError, match="refusing pickle"):
        safe_pickle.load_file(gz)
    assert not marker.exists()


@pytest.mark.parametrize("raw", [
    b"\x80\x04}\x94}b.",  # BUILD on a dict
    b"\x80\x02)R.",  # REDUCE without a global
    b"(i__builtin__\nlist\n.",  # INST
    b"\x80\x02\x82\x01.",  # EXT1
    b"\x80\x02(o.",  # OBJ
    b"\x80\x02N)\x81.",  # NEWOBJ
    b"\x80\x04\x8c\x02os\x8c\x06system\x93.",  # STACK_GLOBAL
    b"\x80\x02Pabc\n.",  # PERSID
    b"\x80\x05\x97.",  # NEXT_BUFFER
])
def test_every_calling_opcode_is_refused(raw):
    with pytest.raises(safe_pickle.UnsafePickleError, match="refusing pickle"):
        safe_pickle.loads(raw)
    with pytest.raises(ValueError):
        safe_pickle.loads(raw)


def test_find_class_always_raises():
    with pytest.raises(ValueError, match="builtins.dict"):
        safe_pickle.SafeUnpickler(b".").find_class("builtins", "dict")


def test_safe_pickle_roundtrips_plain_data():
    rng = random.Random(3)

    def rnd(rich, d=0):
        r = rng.random()
        if d > 3 or r < 0.4:
            leaves = [None, True, False, rng.randint(-2 ** 70, 2 ** 70), rng.randint(-300, 300), rng.random(),
                      "h\u00e9llo\n'\\" * rng.randint(0, 40), ""]
            if rich:  # protocols 0-2 pickle bytes through a call (codecs.encode): refused, rightly
                leaves.append(b"\x00x" * rng.randint(0, 9))
            return rng.choice(leaves)
        if r < 0.6:
            return [rnd(rich, d + 1) for _ in range(rng.randint(0, 4))]
        if r < 0.75:
            return tuple(rnd(rich, d + 1) for _ in range(rng.randint(0, 4)))
        return {f"k{i}": rnd(rich, d + 1) for i in range(rng.randint(0, 4))}

    for _ in range(300):
        shared = [1, 2]
        obj = [rnd(True), shared, shared, {1, 2}, frozenset({3})]
        for proto in (4, 5):
            out = safe_pickle.loads(pickle.dumps(obj, protocol=proto))
            assert out == obj and out[1] is out[2]
        plain = [rnd(False), shared, shared]
        for proto in (0, 1, 2, 3):
            out = safe_pickle.loads(pickle.dumps(plain, protocol=proto))
            assert out == plain and out[1] is out[2]


def test_safe_pickle_damage_is_value_error():
    base = pickle.dumps(synthetic_snapshot(), protocol=4)
    rng = random.Random(5)
    for i in range(400):
        b = bytearray(base)
        if i % 2:
            b = b[:rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            safe_pickle.loads(bytes(b))
        except ValueError:
            pass


# -- the Trace model -------------------------------------------------------------------------------
def small_trace() -> Trace:
    # alloc a(0)=100, alloc b(1)=1024, free a, alloc c(2)=0, alloc d(3)=3000, free d, free b
    ops = np.array([[0, 0, 100, 0, 1], [0, 1, 1024, 1, 0], [1, 0, 100, 0, 1], [0, 2, 0, 0, 0],
                    [0, 3, 3000, 0, 2], [1, 3, 3000, 0, 2], [1, 1, 1024, 1, 0]], dtype=np.int64)
    return Trace("small", "memory", ops, [0, 42], ["", "a.py:1", "b.py:2"], None, 0, 1)


def test_model_methods():
    tr = small_trace()
    tr.validate()
    assert tr.live_bytes().tolist() == [100, 1124, 1024, 1024, 4024, 1024, 0]
    assert tr.peak_live_bytes() == 4024 and tr.peak_index() == 4
    h = tr.size_histogram()
    assert h.lo.tolist() == [0] + [1 << k for k in range(0, 12)]
    assert dict(zip(h.lo.tolist(), h.counts.tolist()))[64] == 1  # 100 in [64, 128)
    assert dict(zip(h.lo.tolist(), h.counts.tolist()))[1024] == 1
    assert dict(zip(h.lo.tolist(), h.counts.tolist()))[2048] == 1  # 3000
    assert h.counts[0] == 1 and h.bytes.sum() == 4124
    top = tr.largest_at_peak(2)
    assert [(b.id, b.size, b.site, b.stream) for b in top] == [(3, 3000, "b.py:2", 0), (1, 1024, "", 42)]
    x, y = tr.live_over_time(3)
    assert len(x) == 3 and 4024 in y.tolist()
    assert tr.replay_ops().tolist()[-1] == [1, 2, 0]  # the zero-byte allocation is freed at the end
    assert tr.summary()["allocs"] == 4


@pytest.mark.parametrize("mutate, needle", [
    (lambda o: o.__setitem__((2, 1), 3), "op 2: free of an id before it is allocated"),
    (lambda o: o.__setitem__((1, 1), 5), "op 1: allocation ids must be dense"),
    (lambda o: o.__setitem__((6, 1), 3), "op 6: second free"),
    (lambda o: o.__setitem__((5, 2), 1), "op 5: free size differs"),
    (lambda o: o.__setitem__((0, 0), 7), "op 0: action"),
    (lambda o: o.__setitem__((3, 3), 9), "op 3: stream index"),
    (lambda o: o.__setitem__((4, 4), 9), "op 4: site index"),
    (lambda o: o.__setitem__((4, 2), -1), "op 4: negative size"),
    (lambda o: o.__setitem__((6, 1), 99), "op 6: free of an id that was never allocated"),
])
def test_model_validate_names_the_op(mutate, needle):
    tr = small_trace()
    mutate(tr.ops)
    with pytest.raises(ValueError, match=needle):
        tr.validate()


# -- trace format v1 -------------------------------------------------------------------------------
def real_or_default_traces():
    if SHARED is not None:
        return [SHARED / f for f in sorted(ANCHORS)]
    return [default_trace_path()]


@pytest.mark.parametrize("path", real_or_default_traces(), ids=lambda p: os.path.basename(str(p)))
def test_v1_roundtrip_real(tmp_path, path):
    tr = load_trace(path)
    out = tmp_path / "t.vktrace"
    write_v1(out, tr, chunk_records=4096)
    assert detect_format(out) == "vramkit-v1"
    back = load_trace(out)
    back.validate()
    assert back.source == "vramkit-v1" and back.name == tr.name
    assert np.array_equal(back.ops, tr.ops) and np.array_equal(back.t_us, tr.t_us)
    assert back.streams == tr.streams and back.sites == tr.sites
    assert back.left_live == tr.left_live and back.peak_live_bytes() == tr.peak_live_bytes()
    assert back.metadata["v1"]["source"] == tr.source
    assert sum(1 for _ in iter_records(out)) == len(tr)
    assert os.path.getsize(out) < os.path.getsize(path) * 1.2


def test_v1_roundtrip_sites_streams_no_times(tmp_path):
    snap = synthetic_snapshot()
    for e in snap["device_traces"][0]:
        e.pop("time_us", None)
    tr = snapshot_to_trace(snap, name="s\u00e9ite")
    write_v1(tmp_path / "s.vktrace", tr, chunk_records=1)
    back = read_v1(tmp_path / "s.vktrace")
    assert back.t_us is None and back.name == "s\u00e9ite"
    assert np.array_equal(back.ops, tr.ops) and back.sites == tr.sites and back.streams == tr.streams
    empty = Trace("empty", "memory", np.zeros((0, 5), dtype=np.int64), [], [""])
    write_v1(tmp_path / "e.vktrace", empty)
    assert len(read_v1(tmp_path / "e.vktrace")) == 0


def test_v1_streaming_writer_with_pointer_ids(tmp_path):
    out = tmp_path / "ptr.vktrace"
    with TraceWriter(out, name="ptrs", device="host", chunk_records=2) as w:
        w.free(0xDEAD, 64, stream=5, t_ns=1)  # tracer attached mid-run: skipped
        w.alloc(0x1000, 100, stream=5, site="m.py:3", t_ns=2)
        w.alloc(0x2000, 200, stream=0, t_ns=3)
        w.free(0x1000, 0, stream=5, t_ns=4)  # size 0: unknown, accepted
        w.alloc(0x1000, 300, stream=5, site="m.py:3", t_ns=5)  # the address is reused
        w.free(0x2000, 200, t_ns=6)
    recs = list(iter_records(out))
    assert len(recs) == 6 and recs[1].id == 0x1000 and recs[1].site == 1
    tr = read_v1(out)
    tr.validate()
    assert tr.name == "ptrs" and tr.skipped_frees == 1 and tr.left_live == 1
    assert tr.ops.tolist() == [[0, 0, 100, 0, 1], [0, 1, 200, 1, 0], [1, 0, 100, 0, 1], [0, 2, 300, 0, 1],
                               [1, 1, 200, 1, 0]]
    assert tr.streams == [5, 0] and tr.sites == ["", "m.py:3"]
    assert tr.t_us.tolist() == [0, 0, 0, 0, 0]  # ns -> us
    assert tr.metadata["v1"]["device"] == "host"


def test_v1_worked_example_bytes(tmp_path):
    """The record bytes of the worked example in docs/trace-format.md."""
    out = tmp_path / "demo.vktrace"
    with TraceWriter(out, name="demo") as w:
        w.alloc(7, 4096, stream=0, site="train.py:42", t_ns=1_500_000)
        w.free(7, 4096, stream=0, t_ns=2_000_000)
    data = open(out, "rb").read()
    magic, version, flags, meta_len, meta_crc = v1.HEADER.unpack_from(data, 0)
    assert (magic, version, flags) == (b"VKTRACE1", 1, 0)
    meta = data[20:20 + meta_len]
    assert zlib.crc32(meta) == meta_crc and json.loads(meta)["name"] == "demo"
    pos = 20 + meta_len
    kind, count, raw_len, comp_len, crc = v1.CHUNK.unpack_from(data, pos)
    comp = data[pos + 20:pos + 20 + comp_len]
    assert (kind, count, raw_len, crc) == (b"RECS", 2, 64, zlib.crc32(comp))
    raw = zlib.decompress(comp)
    assert raw.hex() == ("0001000001000000" "60e3160000000000" "0700000000000000" "0010000000000000"
                         "0101000000000000" "80841e0000000000" "0700000000000000" "0010000000000000")
    pos += 20 + comp_len
    kind, count, raw_len, comp_len, crc = v1.CHUNK.unpack_from(data, pos)
    assert (kind, count, raw_len) == (b"STRM", 1, 8)
    pos += 20 + comp_len
    kind, count, raw_len, comp_len, crc = v1.CHUNK.unpack_from(data, pos)
    assert (kind, count) == (b"SITE", 2)
    assert zlib.decompress(data[pos + 20:pos + 20 + comp_len]) == b"\x00train.py:42\x00"
    pos += 20 + comp_len
    assert data[pos:] == bytes.fromhex("454e4400" "02000000" + "00" * 12)


def test_v1_writer_is_atomic(tmp_path):
    out = tmp_path / "a.vktrace"
    write(out, b"previous content")
    with pytest.raises(RuntimeError):
        with TraceWriter(out) as w:
            w.alloc(1, 10)
            raise RuntimeError("the program died")
    assert open(out, "rb").read() == b"previous content"
    assert sorted(os.listdir(tmp_path)) == ["a.vktrace"]
    w = TraceWriter(tmp_path / "b.vktrace")
    w.alloc(1, 10)
    assert not (tmp_path / "b.vktrace").exists()  # nothing visible before close
    w.close()
    assert read_v1(tmp_path / "b.vktrace").left_live == 1
    with pytest.raises(ValueError):
        w.alloc(2, 10)
    w2 = TraceWriter(tmp_path / "c.vktrace")
    with pytest.raises(ValueError):
        w2.record(3, 1, 1)
    with pytest.raises(ValueError):
        w2.alloc(1, -1)
    with pytest.raises(ValueError):
        w2.alloc(1, 1, site="a\x00b")
    w2.abort()
    assert sorted(os.listdir(tmp_path)) == ["a.vktrace", "b.vktrace"]


def test_v1_writer_refuses_what_its_reader_refuses(tmp_path):
    """The writer checks, before writing, what read_v1 would reject: an alloc of a live id, a free
    whose size differs from its allocation's, values that are not integers. The file it then
    publishes reads back."""
    out = tmp_path / "w.vktrace"
    with TraceWriter(out) as w:
        w.alloc(1, 100)
        for call, msg in ((lambda: w.alloc(1, 50), "alloc of id 1 that is still live"),
                          (lambda: w.free(1, 99), "free of id 1 with size 99, allocated with 100"),
                          (lambda: w.record(0, 2, 1.5), "size must be an integer, not float"),
                          (lambda: w.record(0, True, 1), "id must be an integer, not bool"),
                          (lambda: w.alloc(2, 1, stream="s"), "stream must be an integer"),
                          (lambda: w.alloc(2, 1, site=7), "site must be a string")):
            with pytest.raises(ValueError, match=msg):
                call()
        w.free(1, 100)
        w.alloc(1, 30)  # the id is free again
        w.free(7)  # a free of an id never allocated is kept (a tracer attached mid-run); the reader skips it
        tr = load_trace(default_trace_path())
        small = Trace(tr.name, tr.source, tr.ops[:40].copy(), tr.streams, tr.sites, None)
        small.left_live = small.n_allocs - small.n_frees
        with pytest.raises(ValueError, match="still live .written before this trace"):
            w.write_trace(small)  # its dense ids start at 0 and 1 is live here
        w.free(1, 30)
        w.alloc(2 ** 64 - 1, 8)  # the largest id: still compared with the trace's
        w.write_trace(small)
        left_ids = set(small.ops[small.ops[:, 0] == 0, 1].tolist()) - set(small.ops[small.ops[:, 0] == 1, 1].tolist())
        assert left_ids
        left = min(left_ids)
        with pytest.raises(ValueError, match="still live"):
            w.alloc(left, 1)  # an id the trace left live
    back = read_v1(out)
    assert back.skipped_frees == 1 and back.n_allocs == 3 + small.n_allocs


def test_live_memory_past_2_62_is_refused(tmp_path):
    """Sizes each within int64 whose live sum passes 2^62 would overflow the sums made of them
    (negative live memory, fragmentation below 1): every importer refuses such a trace, naming the op."""
    csv_path = tmp_path / "huge.csv"
    csv_path.write_text("action,addr,size\nalloc,1,%d\nalloc,2,%d\nalloc,3,%d\n" % (2 ** 61, 2 ** 61, 2 ** 61))
    with pytest.raises(ValueError, match="op 2: live memory reaches .* past 2\\^62"):
        load_trace(csv_path)
    with TraceWriter(tmp_path / "huge.vktrace") as w:
        for i in range(3):
            w.alloc(i, 2 ** 61)
    with pytest.raises(ValueError, match="past 2\\^62"):
        read_v1(tmp_path / "huge.vktrace")
    csv_path.write_text("action,addr,size\nalloc,1,%d\nfree_requested,1,%d\nalloc,2,%d\n" % ((2 ** 62,) * 3))
    assert load_trace(csv_path).peak_live_bytes() == 2 ** 62  # up to the limit, and freed in between: fine
    # The columnar reader of long CSV files (4 MiB and more) refuses it too.
    from vramkit.trace import fast_csv
    rows = "".join("alloc,%d,16\nfree_requested,%d,16\n" % (i, i) for i in range(1, 200000))
    big = tmp_path / "big.csv"
    big.write_text("action,addr,size\n" + rows + "alloc,1,%d\nalloc,2,%d\nalloc,3,%d\n" % ((2 ** 61,) * 3))
    assert big.stat().st_size >= fast_csv.FAST_MIN_BYTES
    with pytest.raises(ValueError, match="past 2\\^62"):
        load_trace(big)


def _fuzz_file(tmp_path) -> bytes:
    tr = load_trace(default_trace_path())
    small = Trace(tr.name, tr.source, tr.ops[:300].copy(), tr.streams, tr.sites, tr.t_us[:300].copy())
    small.left_live = small.n_allocs - small.n_frees
    # give it two streams and a site so the tables are not trivial
    small.streams = [0, 77]
    small.sites = ["", "x.py:1"]
    small.ops[::7, 3] = 1
    ids_with_site = small.ops[small.ops[:, 0] == 0, 1][::5]
    small.ops[np.isin(small.ops[:, 1], ids_with_site), 4] = 1
    small.validate()
    write_v1(tmp_path / "f.vktrace", small, chunk_records=64)
    return open(tmp_path / "f.vktrace", "rb").read()


def test_v1_corruption_every_byte_and_every_truncation(tmp_path):
    base = _fuzz_file(tmp_path)
    path = tmp_path / "bad.vktrace"
    rng = random.Random(11)
    for pos in range(len(base)):
        b = bytearray(base)
        b[pos] ^= 1 << rng.randrange(8)
        write(path, bytes(b))
        with pytest.raises(ValueError):
            read_v1(path)
    for cut in range(len(base)):
        write(path, base[:cut])
        with pytest.raises(ValueError):
            load_trace(path) if cut >= 8 else read_v1(path)
    write(path, base + b"\x00")
    with pytest.raises(ValueError, match="after the end marker"):
        read_v1(path)


def test_v1_corruption_random_on_real_trace(tmp_path):
    tr = load_trace(default_trace_path())
    write_v1(tmp_path / "r.vktrace", tr, chunk_records=2048)
    base = open(tmp_path / "r.vktrace", "rb").read()
    path = tmp_path / "bad.vktrace"
    rng = random.Random(12)
    for _ in range(150):
        b = bytearray(base)
        if rng.random() < 0.3:
            b = b[:rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        if bytes(b) == base:
            continue
        write(path, bytes(b))
        with pytest.raises(ValueError):
            load_trace(path)
        with pytest.raises(ValueError):
            for _ in iter_records(path):
                pass


def _raw_v1(records, streams=(0,), sites=(b"",), meta=b"{}"):
    out = [v1.HEADER.pack(v1.MAGIC, 1, 0, len(meta), zlib.crc32(meta)), meta]

    def chunk(kind, count, raw):
        comp = zlib.compress(raw)
        out.append(v1.CHUNK.pack(kind, count, len(raw), len(comp), zlib.crc32(comp)) + comp)

    if records:
        chunk(b"RECS", len(records), b"".join(v1.RECORD.pack(*r) for r in records))
    chunk(b"STRM", len(streams), struct.pack(f"<{len(streams)}q", *streams))
    chunk(b"SITE", len(sites), b"".join(s + b"\x00" for s in sites))
    out.append(v1.CHUNK.pack(b"END\x00", len(records), 0, 0, 0))
    return b"".join(out)


@pytest.mark.parametrize("records, needle", [
    ([(0, 0, 0, 0, 0, 1, 10), (0, 0, 0, 0, 0, 1, 10)], "alloc of id 1 that is still live"),
    ([(0, 0, 0, 0, 0, 1, 10), (1, 0, 0, 0, 0, 1, 11)], "with size 11, allocated with 10"),
    ([(0, 0, 3, 0, 0, 1, 10)], "stream index 3 outside"),
    ([(0, 0, 0, 4, 0, 1, 10)], "site index 4 outside"),
    ([(2, 0, 0, 0, 0, 1, 10)], "bad action"),
    ([(0, 4, 0, 0, 0, 1, 10)], "bad action/flags"),
])
def test_v1_semantic_errors(tmp_path, records, needle):
    path = write(tmp_path / "sem.vktrace", _raw_v1(records))
    with pytest.raises(ValueError, match=needle):
        read_v1(path)


def test_v1_structure_errors(tmp_path):
    ok = _raw_v1([(0, 0, 0, 0, 0, 1, 10)])
    read_v1(write(tmp_path / "ok.vktrace", ok))
    with pytest.raises(ValueError, match="site 0 must be the empty string"):
        read_v1(write(tmp_path / "s.vktrace", _raw_v1([], sites=(b"x",))))
    with pytest.raises(ValueError, match="metadata is not a JSON object"):
        read_v1(write(tmp_path / "m.vktrace", _raw_v1([], meta=b"[1]")))
    no_end = ok[:-20]
    with pytest.raises(ValueError, match="truncated"):
        read_v1(write(tmp_path / "t.vktrace", no_end))
    wrong_version = ok[:8] + b"\x02\x00" + ok[10:]
    with pytest.raises(ValueError, match="unsupported version 2"):
        read_v1(write(tmp_path / "v.vktrace", wrong_version))
