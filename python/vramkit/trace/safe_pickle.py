"""A pickle reader that can only build plain data.

PyTorch memory snapshots are pickles of dicts, lists, tuples, strings, ints, floats and bools.
A pickle is a small program: opcodes like ``GLOBAL``/``STACK_GLOBAL`` import any callable and
``REDUCE``/``BUILD``/``INST``/``OBJ``/``NEWOBJ`` call things, so ``pickle.load`` on a file from
someone else runs their code. This module is an interpreter for the *data* subset of the pickle
opcodes only. Every opcode that could import or call is refused before anything happens to it,
and an opcode the interpreter does not know is refused too (an allow-list, not a deny-list).

Accepted: dict, list, tuple, set, frozenset, str, bytes (bytearray becomes bytes), int, float,
bool and None, with the memo (shared references), protocols 0 to 5 (no out-of-band buffers).

Errors are ``ValueError``: :class:`UnsafePickleError` (a subclass) when the pickle would import
or call, a plain ``ValueError`` naming the byte offset when it is truncated or malformed.
"""
from __future__ import annotations

import codecs
import os
import struct
import zlib
from typing import Any, Callable

__all__ = ["UnsafePickleError", "SafeUnpickler", "loads", "load_file"]

_UNPACK_I = struct.Struct("<i").unpack_from
_UNPACK_UI = struct.Struct("<I").unpack_from
_UNPACK_UH = struct.Struct("<H").unpack_from
_UNPACK_Q = struct.Struct("<Q").unpack_from
_UNPACK_D = struct.Struct(">d").unpack_from

# Opcodes that import or call something; named in the refusal message.
_UNSAFE = {
    ord("c"): "GLOBAL (imports a module attribute)",
    0x93: "STACK_GLOBAL (imports a module attribute)",
    ord("R"): "REDUCE (calls a callable)",
    ord("b"): "BUILD (calls __setstate__ / sets attributes)",
    ord("i"): "INST (imports and calls a class)",
    ord("o"): "OBJ (calls a class)",
    0x81: "NEWOBJ (calls cls.__new__)",
    0x92: "NEWOBJ_EX (calls cls.__new__)",
    0x82: "EXT1 (imports through the copyreg extension registry)",
    0x83: "EXT2 (imports through the copyreg extension registry)",
    0x84: "EXT4 (imports through the copyreg extension registry)",
    ord("P"): "PERSID (calls persistent_load)",
    ord("Q"): "BINPERSID (calls persistent_load)",
    0x97: "NEXT_BUFFER (out-of-band buffer)",
    0x98: "READONLY_BUFFER (out-of-band buffer)",
}


class UnsafePickleError(ValueError):
    """The pickle would import or call something; nothing was executed."""


class SafeUnpickler:
    """Interpret a pickle held in memory, building plain data only.

    Parameters
    ----------
    data : bytes
        The whole pickle.
    name : str
        Used in error messages (a file name).
    """

    def __init__(self, data: bytes, name: str = "<pickle>") -> None:
        self._data = bytes(data)
        self._name = name
        self._pos = 0
        self._stack: list[Any] = []
        self._marks: list[int] = []  # stack lengths at each MARK
        self._memo: dict[int, Any] = {}
        self._dispatch: dict[int, Callable[[], None]] = self._build_dispatch()

    # -- the one way a pickle could reach a callable: always refused --------------------------
    def find_class(self, module: str, name: str) -> Any:
        """Refuse: this unpickler never imports anything."""
        raise UnsafePickleError(
            f"refusing pickle: it would import/call {module}.{name} (in {self._name}); nothing was "
            "run; only plain data (dict, list, tuple, str, bytes, int, float, bool, None) is accepted")

    def load(self) -> Any:
        """Run the pickle and return the object it describes."""
        data = self._data
        n = len(data)
        dispatch = self._dispatch
        stack = self._stack  # one flat list for the whole run; marks are positions in it
        memo = self._memo
        push = stack.append
        unpack_i = _UNPACK_I
        pos = self._pos
        start = pos
        op = -1
        try:
            while True:
                start = pos
                if pos >= n:
                    raise _Malformed(pos, "truncated: no STOP opcode")
                op = data[pos]
                pos += 1
                # The most frequent opcodes of snapshot pickles run inline; each only builds data.
                if op == 0x94:  # MEMOIZE
                    memo[len(memo)] = stack[-1]
                elif op == 0x8C:  # SHORT_BINUNICODE
                    end = pos + 1 + data[pos]
                    if end > n:
                        raise _Malformed(start, "truncated string")
                    push(data[pos + 1:end].decode("utf-8", "surrogatepass"))
                    pos = end
                elif op == 0x4B:  # BININT1
                    push(data[pos])
                    pos += 1
                elif op == 0x68:  # BINGET
                    push(memo[data[pos]])
                    pos += 1
                elif op == 0x71:  # BINPUT
                    memo[data[pos]] = stack[-1]
                    pos += 1
                elif op == 0x4A:  # BININT
                    if pos + 4 > n:
                        raise _Malformed(start, "truncated integer")
                    push(unpack_i(data, pos)[0])
                    pos += 4
                elif op == 0x28:  # MARK
                    self._marks.append(len(stack))
                elif op == 0x7D:  # EMPTY_DICT
                    push({})
                elif op == 0x2E:  # STOP
                    if len(stack) != 1 or self._marks:
                        raise _Malformed(start, "the stack does not hold exactly one object at STOP")
                    self._pos = pos
                    return stack.pop()
                else:
                    fn = dispatch.get(op)
                    if fn is None:
                        self._refuse(op, start)
                    self._pos = pos
                    fn()
                    pos = self._pos
        except UnsafePickleError:
            raise
        except _Malformed as exc:
            raise ValueError(f"corrupt pickle {self._name} at offset {exc.offset}: {exc.what}") from None
        except (IndexError, KeyError, TypeError, ValueError, OverflowError, struct.error,
                UnicodeDecodeError, MemoryError, RecursionError) as exc:
            what = "truncated" if isinstance(exc, IndexError) and start >= n - 9 else str(exc)
            raise ValueError(f"corrupt pickle {self._name} at offset {start}: "
                             f"{_opname(op)}: {what}") from None

    # -- helpers ---------------------------------------------------------------------------------
    def _refuse(self, op: int, offset: int) -> None:
        what = _UNSAFE.get(op)
        if what is None:
            raise _Malformed(offset, f"unknown opcode 0x{op:02x}")
        if op in (ord("c"), ord("i")):
            # Show what it would have imported, then refuse through find_class.
            line1 = self._peek_line(offset + 1)
            line2 = self._peek_line(offset + 2 + len(line1))
            self.find_class(line1, line2)
        if op == 0x93 and len(self._stack) >= 2 and all(isinstance(x, str) for x in self._stack[-2:]):
            self.find_class(self._stack[-2], self._stack[-1])
        raise UnsafePickleError(
            f"refusing pickle: it would import/call something (opcode {what} at offset {offset} "
            f"in {self._name}); nothing was run; only plain data (dict, list, tuple, str, bytes, "
            "int, float, bool, None) is accepted")

    def _peek_line(self, pos: int) -> str:
        end = self._data.find(b"\n", pos, pos + 256)
        raw = self._data[pos:end if end >= 0 else pos + 64]
        return raw.decode("ascii", "replace")

    def _read(self, k: int) -> bytes:
        pos = self._pos
        if k < 0 or pos + k > len(self._data):
            raise ValueError(f"truncated: needs {k} bytes at offset {pos}, file has {len(self._data) - pos}")
        self._pos = pos + k
        return self._data[pos:pos + k]

    def _readline(self) -> bytes:
        pos = self._pos
        end = self._data.find(b"\n", pos)
        if end < 0:
            raise ValueError(f"truncated: text argument at offset {pos} has no end of line")
        self._pos = end + 1
        return self._data[pos:end]

    def _pop_mark(self) -> list[Any]:
        if not self._marks:
            raise ValueError("malformed: no MARK on the stack")
        m = self._marks.pop()
        if m > len(self._stack):
            raise ValueError("malformed: the stack shrank below a MARK")
        items = self._stack[m:]
        del self._stack[m:]
        return items

    def _push(self, value: Any) -> None:
        self._stack.append(value)

    # -- opcode implementations ----------------------------------------------------------------
    def _build_dispatch(self) -> dict[int, Callable[[], None]]:
        s = self
        d: dict[int, Callable[[], None]] = {}

        def op_proto() -> None:
            proto = s._read(1)[0]
            if proto > 5:
                raise ValueError(f"unsupported pickle protocol {proto}")

        def op_frame() -> None:
            s._read(8)  # frame length: only a read-ahead hint

        def op_mark() -> None:
            s._marks.append(len(s._stack))

        def op_pop() -> None:
            if s._marks and s._marks[-1] == len(s._stack):
                s._pop_mark()
            else:
                s._stack.pop()

        def op_pop_mark() -> None:
            s._pop_mark()

        def op_dup() -> None:
            s._push(s._stack[-1])

        def op_int() -> None:
            text = s._readline()
            if text == b"00":
                s._push(False)
            elif text == b"01":
                s._push(True)
            else:
                s._push(int(text))

        def op_long() -> None:
            text = s._readline()
            if text.endswith(b"L"):
                text = text[:-1]
            s._push(int(text))

        def op_long_n(width: int) -> Callable[[], None]:
            def f() -> None:
                raw = s._read(1)[0] if width == 1 else _UNPACK_I(s._read(4))[0]
                if raw < 0:
                    raise ValueError("negative length")
                s._push(int.from_bytes(s._read(raw), "little", signed=True))
            return f

        def op_float() -> None:
            s._push(float(s._readline()))

        def op_string() -> None:
            text = s._readline()
            if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
                raise ValueError("STRING argument is not quoted")
            s._push(_py2_str(codecs.escape_decode(text[1:-1])[0]))

        def op_unicode() -> None:
            s._push(s._readline().decode("raw-unicode-escape"))

        def sized(kind: str, width: int) -> Callable[[], None]:
            def f() -> None:
                if width == 1:
                    k = s._read(1)[0]
                elif width == 4:
                    k = _UNPACK_UI(s._read(4))[0]
                else:
                    k = _UNPACK_Q(s._read(8))[0]
                raw = s._read(k)
                if kind == "str":
                    s._push(str(raw, "utf-8", "surrogatepass"))
                elif kind == "py2":
                    s._push(_py2_str(raw))
                else:
                    s._push(raw)
            return f

        def op_tuple_n(k: int) -> Callable[[], None]:
            def f() -> None:
                if k == 0:
                    s._push(())
                    return
                if len(s._stack) < k:
                    raise ValueError("stack underflow")
                items = tuple(s._stack[-k:])
                del s._stack[-k:]
                s._push(items)
            return f

        def op_tuple() -> None:
            s._push(tuple(s._pop_mark()))

        def op_list() -> None:
            s._push(s._pop_mark())

        def op_append() -> None:
            value = s._stack.pop()
            _as(s._stack[-1], list).append(value)

        def op_appends() -> None:
            items = s._pop_mark()
            _as(s._stack[-1], list).extend(items)

        def op_dict() -> None:
            items = s._pop_mark()
            if len(items) % 2:
                raise ValueError("odd number of items for DICT")
            s._push({items[i]: items[i + 1] for i in range(0, len(items), 2)})

        def op_setitem() -> None:
            value = s._stack.pop()
            key = s._stack.pop()
            _as(s._stack[-1], dict)[key] = value

        def op_setitems() -> None:
            items = s._pop_mark()
            if len(items) % 2:
                raise ValueError("odd number of items for SETITEMS")
            target = _as(s._stack[-1], dict)
            for i in range(0, len(items), 2):
                target[items[i]] = items[i + 1]

        def op_additems() -> None:
            items = s._pop_mark()
            _as(s._stack[-1], set).update(items)

        def op_frozenset() -> None:
            s._push(frozenset(s._pop_mark()))

        def memo_index(width: int) -> int:
            # GET/PUT carry the memo key as a text line; BINGET/BINPUT as one byte; LONG_BIN* as four.
            if width == 0:
                return int(s._readline())
            if width == 1:
                return s._read(1)[0]
            return _UNPACK_UI(s._read(4))[0]

        def get_n(width: int) -> Callable[[], None]:
            def f() -> None:
                idx = memo_index(width)
                if idx not in s._memo:
                    raise ValueError(f"memo key {idx} was never stored")
                s._push(s._memo[idx])
            return f

        def put_n(width: int) -> Callable[[], None]:
            def f() -> None:
                idx = memo_index(width)
                if idx < 0:
                    raise ValueError("negative memo key")
                s._memo[idx] = s._stack[-1]
            return f

        def op_memoize() -> None:
            s._memo[len(s._memo)] = s._stack[-1]

        d[0x80] = op_proto
        d[0x95] = op_frame
        d[ord("(")] = op_mark
        d[ord("0")] = op_pop
        d[ord("1")] = op_pop_mark
        d[ord("2")] = op_dup
        d[ord("N")] = lambda: s._push(None)
        d[0x88] = lambda: s._push(True)
        d[0x89] = lambda: s._push(False)
        d[ord("I")] = op_int
        d[ord("J")] = lambda: s._push(_UNPACK_I(s._read(4))[0])
        d[ord("K")] = lambda: s._push(s._read(1)[0])
        d[ord("M")] = lambda: s._push(_UNPACK_UH(s._read(2))[0])
        d[ord("L")] = op_long
        d[0x8A] = op_long_n(1)
        d[0x8B] = op_long_n(4)
        d[ord("F")] = op_float
        d[ord("G")] = lambda: s._push(_UNPACK_D(s._read(8))[0])
        d[ord("S")] = op_string
        d[ord("T")] = sized("py2", 4)
        d[ord("U")] = sized("py2", 1)
        d[ord("V")] = op_unicode
        d[ord("X")] = sized("str", 4)
        d[0x8C] = sized("str", 1)
        d[0x8D] = sized("str", 8)
        d[ord("B")] = sized("bytes", 4)
        d[ord("C")] = sized("bytes", 1)
        d[0x8E] = sized("bytes", 8)
        d[0x96] = sized("bytes", 8)  # BYTEARRAY8: returned as bytes
        d[ord("]")] = lambda: s._push([])
        d[ord("a")] = op_append
        d[ord("e")] = op_appends
        d[ord("l")] = op_list
        d[ord(")")] = op_tuple_n(0)
        d[ord("t")] = op_tuple
        d[0x85] = op_tuple_n(1)
        d[0x86] = op_tuple_n(2)
        d[0x87] = op_tuple_n(3)
        d[ord("}")] = lambda: s._push({})
        d[ord("d")] = op_dict
        d[ord("s")] = op_setitem
        d[ord("u")] = op_setitems
        d[0x8F] = lambda: s._push(set())
        d[0x90] = op_additems
        d[0x91] = op_frozenset
        d[ord("g")] = get_n(0)
        d[ord("h")] = get_n(1)
        d[ord("j")] = get_n(4)
        d[ord("p")] = put_n(0)
        d[ord("q")] = put_n(1)
        d[ord("r")] = put_n(4)
        d[0x94] = op_memoize
        # By construction: no entry above imports or calls; _UNSAFE opcodes have none.
        assert not set(d) & set(_UNSAFE)
        return d


class _Malformed(Exception):
    def __init__(self, offset: int, what: str) -> None:
        super().__init__(what)
        self.offset = offset
        self.what = what


def _as(obj: Any, kind: type) -> Any:
    if type(obj) is not kind:
        raise TypeError(f"expected a {kind.__name__} on the stack, found {type(obj).__name__}")
    return obj


def _py2_str(raw: bytes) -> Any:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return raw


def _opname(op: int) -> str:
    import pickletools
    for info in pickletools.opcodes:
        if ord(info.code) == op:
            return info.name
    return f"0x{op:02x}"


def loads(data: bytes, *, name: str = "<pickle>") -> Any:
    """Build the plain data described by ``data`` (a pickle) without importing or calling.

    Raises
    ------
    UnsafePickleError
        The pickle would import or call something (nothing was run).
    ValueError
        The pickle is truncated or malformed (the message names the offset).
    """
    return SafeUnpickler(data, name).load()


def load_file(path: str | os.PathLike[str]) -> Any:
    """Read a pickle file (plain or gzip-compressed) with :func:`loads`, refusing one that is
    (or decompresses to) more than :func:`vramkit.trace.limits.max_bytes`."""
    from . import limits
    name = os.path.basename(os.fspath(path))
    limit = limits.max_bytes()
    limits.check_regular_file(path)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(wbits=31)
        out = bytearray()
        try:
            rest = data
            while rest and not d.eof:  # concatenated members: gzip allows them, PyTorch does not write them
                out += d.decompress(rest, limit + 1 - len(out))
                if len(out) > limit:
                    raise limits.too_many_bytes(name, limit)
                rest = d.unconsumed_tail
            if not d.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{name}: corrupt or truncated gzip data: {exc}") from None
        data = bytes(out)
    if len(data) > limit:
        raise limits.too_many_bytes(name, limit)
    if not data:
        raise ValueError(f"{name}: empty file")
    return loads(data, name=name)
