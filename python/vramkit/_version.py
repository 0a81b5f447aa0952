"""The version of vramkit: written here only (pyproject.toml and CMakeLists.txt read it)."""
__version__ = "0.1.0"
