"""python -m opspec.codegen plugin FOLDER: the plugin's per-op sources (the plugin's CMake build runs it)."""
import sys
from pathlib import Path

from . import write_plugin_sources

if len(sys.argv) != 3 or sys.argv[1] != "plugin":
    sys.exit("usage: python -m opspec.codegen plugin FOLDER")
write_plugin_sources(Path(sys.argv[2]))
