#!/usr/bin/env python3
"""The source tree's structure, as docs/architecture.md states it.

1. Dependencies point one way. Each module may include only the modules the
   table below lists (from the includes in its .h, .cc, .cu and .cuh files):
   `cli, coordinator, worker -> checkpoint -> job -> hf -> engine`, with
   `scheduler`, `proto`, `transport` and `telemetry` beside them;
   `tokenizer` stands on `common` alone, and so far only `cli` uses it. transport
   knows the Backend interface, never a concrete backend: of engine/ it may
   include only the interface headers and the CUDA error and handle helpers.
2. No source file outside tests/, bench/ and fuzz/ is longer than 600
   lines: a file that grows past that holds more than one concept.

Usage: structure_test.py SOURCE_DIR. Exit 0 when the tree holds to both;
otherwise 1, printing each file and what it breaks.
"""

import os
import re
import sys

# Module -> the modules of ours it may include (besides itself).
ALLOWED = {
    "common": set(),
    "tokenizer": {"common"},
    "scheduler": {"common"},
    "engine": {"common"},
    "transport": {"common", "engine"},
    "proto": {"common", "scheduler"},
    "telemetry": {"common", "scheduler", "proto"},
    "hf": {"common", "engine"},
    "job": {"common", "engine", "hf", "scheduler", "proto"},
    "checkpoint": {"common", "engine", "job", "proto"},
    "coordinator": {"common", "engine", "hf", "job", "scheduler", "proto",
                    "checkpoint", "telemetry", "transport"},
    "worker": {"common", "engine", "hf", "job", "scheduler", "proto",
               "checkpoint", "telemetry", "transport"},
    "cli": {"common", "engine", "hf", "job", "scheduler", "proto",
            "checkpoint", "telemetry", "transport", "tokenizer"},
}
# Generated protobuf headers ("conveyor/v1/...") are the proto module's.
ALIASES = {"conveyor": "proto"}
# What transport may see of engine: the interface, not a backend.
TRANSPORT_ENGINE_HEADERS = {
    "engine/backend.h", "engine/tensor.h", "engine/dtype.h",
    "engine/precision.h", "engine/mesh_collective.h",
    "engine/cuda/cuda_status.h", "engine/cuda/cuda_handles.h",
}
MAX_LINES = 600
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def source_files(root, module):
    for dirpath, _, names in os.walk(os.path.join(root, module)):
        for name in sorted(names):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, name)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems = []
    checked = 0
    for module, allowed in sorted(ALLOWED.items()):
        for path in source_files(root, module):
            checked += 1
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            if len(lines) > MAX_LINES:
                problems.append(f"{rel}: {len(lines)} lines (at most "
                                f"{MAX_LINES}); split it by concept")
            for number, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m or "/" not in m.group(1):
                    continue
                header = m.group(1)
                top = header.split("/", 1)[0]
                top = ALIASES.get(top, top)
                if top not in ALLOWED or top == module:
                    continue  # Not ours (a library's), or its own.
                if top not in allowed:
                    problems.append(f"{rel}:{number}: {module}/ includes "
                                    f"{header}, but {module} may include "
                                    f"only {sorted(allowed) or 'nothing of ours'}")
                elif (module == "transport" and top == "engine" and
                      header not in TRANSPORT_ENGINE_HEADERS):
                    problems.append(f"{rel}:{number}: transport/ includes "
                                    f"{header}; it may know only the Backend "
                                    "interface")
    if checked == 0:
        print(f"no sources under {root}")
        return 1
    for p in problems:
        print(p)
    print(f"{checked} files checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
