"""How the package is put together: no two modules import each other, one version, one byte
formatter (the same digits as the C++ core's messages), and the typing files shipped."""
from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import random
import subprocess
import sys

import vramkit
from vramkit import _vramkit

PKG = pathlib.Path(vramkit.__file__).parent
SOURCE = pathlib.Path(__file__).resolve().parents[1] / "vramkit"


def _module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    mods = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Every vramkit module each module imports, at its top or inside a function."""
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                for a in node.names:
                    found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {m for m in found if m in mods and m != name}
    return out


def test_no_two_modules_import_each_other():
    # The package root is left out: it hands out its submodules lazily (module __getattr__).
    edges = _imports(_module_names(SOURCE))
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a]
                    if "vramkit" not in (a, b) and a in edges.get(b, ())})
    assert not pairs, f"modules that import each other: {pairs}"


def test_one_version():
    assert vramkit.__version__ == importlib.metadata.version("vramkit")
    out = subprocess.run([sys.executable, "-m", "vramkit", "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"vramkit {vramkit.__version__}"
    literal = f'"{vramkit.__version__}"'
    holders = [p.name for p in SOURCE.rglob("*.py") if literal in p.read_text(encoding="utf-8")]
    assert holders == ["_version.py"], holders


def test_one_byte_formatter():
    import vramkit.report
    assert vramkit.report.format_bytes is vramkit.format_bytes
    rng = random.Random(1)
    for n in [0, 1, 1023, 1024, 1536, 10**6, 720 << 30, 3 << 50, 1 << 60] + \
             [rng.randrange(1 << 62) for _ in range(2000)]:
        assert vramkit.format_bytes(n, exact=True) == _vramkit.format_bytes(n)
        assert _vramkit.format_bytes(n).startswith(vramkit.format_bytes(n))


def test_typing_files_are_shipped():
    assert (PKG / "py.typed").is_file()
    package = PKG / "_vramkit" / "__init__.pyi"  # nanobind >= 2.9 writes the submodule's stub too
    stub = (package if package.exists() else PKG / "_vramkit.pyi").read_text(encoding="utf-8")
    for name in ("class Resource", "def replay(", "def alloc(", "def parse_size("):
        assert name in stub
    assert "from vramkit._vramkit import monitor" in stub
    if package.exists():
        assert "class Monitor" in (PKG / "_vramkit" / "monitor.pyi").read_text(encoding="utf-8")
