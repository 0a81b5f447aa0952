"""The restricted pickle reader against the attacks aimed at the other design (a pickle.Unpickler
whose find_class allows what a snapshot needs): names such a list would let through, and damage
that would make a C unpickler allocate or recurse. vramkit keeps its opcode interpreter, which
never resolves a name at all; every case must end in a ValueError that names the problem."""
from __future__ import annotations

import struct

import pytest

import conftest_trace as ct

ct.import_vramkit_pure()

from vramkit.trace import load_trace, safe_pickle  # noqa: E402

REFUSED = {
    # Names a "restricting globals" allow-list for snapshots might contain, or be tricked into.
    "builtins.dict through REDUCE": b"cbuiltins\ndict\n)R.",
    "collections.OrderedDict": b"\x80\x02ccollections\nOrderedDict\n)R.",
    "builtins.getattr": b"cbuiltins\ngetattr\n.",
    "torch.load by STACK_GLOBAL": b"\x80\x04\x8c\x05torch\x8c\x04load\x93.",
    "STACK_GLOBAL with non-str names": b"\x80\x04K\x01K\x02\x93.",
    "os.system": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",
    "BINPERSID": b"\x80\x02K\x01Q.",
    "EXT2": b"\x80\x02\x83\x01\x00.",
    "EXT4": b"\x80\x02\x84\x01\x00\x00\x00.",
    "NEWOBJ_EX": b"\x80\x04N)}\x92.",
    "READONLY_BUFFER": b"\x80\x05\x98.",
}
DAMAGED = {
    "LONG4 claims 2 GiB": b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"\x00" * 10 + b".",
    "LONG4 negative length": b"\x80\x02\x8b" + struct.pack("<i", -5) + b".",
    "BINUNICODE8 claims 2**60": b"\x80\x04\x8d" + struct.pack("<Q", 2**60) + b"abc.",
    "BINBYTES8 claims 2**63": b"\x80\x04\x8e" + struct.pack("<Q", 2**63) + b"abc.",
    "list as a dict key": b"\x80\x04}]K\x01s.",
    "list in a set": b"\x80\x04\x8f(]\x90.",
    "SETITEMS on a list": b"\x80\x04](K\x01K\x02u.",
    "memo key never stored": b"\x80\x04j\xff\xff\xff\xff.",
    "marks never closed": b"\x80\x04(((((.",
    "100k-digit INT": b"I" + b"9" * 100000 + b"\n.",
    "protocol 6": b"\x80\x06}.",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_names_and_calls_are_refused(name):
    with pytest.raises(safe_pickle.UnsafePickleError, match="refusing pickle"):
        safe_pickle.loads(REFUSED[name])


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damage_is_a_value_error(name):
    with pytest.raises(ValueError, match="corrupt pickle"):
        safe_pickle.loads(DAMAGED[name])


def test_deep_nesting_neither_recurses_nor_crashes(tmp_path):
    depth = 100_000
    raw = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces" + b"(" * depth + b"l" * depth + b"u."
    obj = safe_pickle.loads(raw)  # iterative: no RecursionError however deep
    assert isinstance(obj["device_traces"], list)
    p = tmp_path / "deep.pickle"
    p.write_bytes(raw)
    assert load_trace(p).n_allocs == 0  # nested lists hold no allocation event: read, not crashed
