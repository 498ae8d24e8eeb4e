"""The layers point one way: llm/ <- proto/ <- the workers, gateway, sdk, tools.

Every `#include` in the C, CUDA and header files of those folders is resolved
as the compiler resolves it (the including file's folder first, then the
repository root, which the Makefile passes as -I.; the generated protobuf
header lives in the build folder) and must land in a folder its own folder
may include. docs/architecture.md describes the same table.
"""
import re
from pathlib import Path

from conftest import ROOT

# Folder -> the folders its files may include. A folder always may include
# itself. The generated protobuf header (spillway.pb-c.h) belongs to proto/.
ALLOWED = {
    "llm": {"llm"},
    "proto": {"llm", "proto"},
    "worker-cpu": {"llm", "proto", "worker-cpu"},
    "worker-gpu": {"llm", "proto", "worker-gpu"},
    "gateway": {"llm", "proto", "gateway"},
    "sdk": {"llm", "proto", "sdk"},
    "tools": {"llm", "proto", "tools"},
}
SOURCE_SUFFIXES = {".c", ".h", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def _generated(name):
    """True for a header protoc-c writes into the build folder."""
    return name.endswith(".pb-c.h")


def _target_layer(root, src, quote, name):
    """The folder an include lands in, "proto" for a generated protobuf
    header, None for a system header, or "?" when a quoted include resolves
    to nothing in the tree (the check then cannot tell where it goes)."""
    candidates = [src.parent / name, root / name] if quote == '"' else [root / name]
    for c in candidates:
        if c.is_file():
            rel = c.resolve().relative_to(root.resolve())
            return rel.parts[0] if len(rel.parts) > 1 else "."
    if _generated(Path(name).name):
        return "proto"
    return "?" if quote == '"' else None


def layer_violations(root):
    """Every include under root that crosses the layers the wrong way, as
    "file:line: message" strings (paths relative to root), in file order."""
    root = Path(root)
    found = []
    for layer in sorted(ALLOWED):
        folder = root / layer
        if not folder.is_dir():
            continue
        for src in sorted(folder.rglob("*")):
            if src.suffix not in SOURCE_SUFFIXES or not src.is_file():
                continue
            rel = src.relative_to(root)
            text = src.read_text(encoding="utf-8", errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                quote, name = m.groups()
                where = f"{rel}:{n}: #include {quote}{name}{'>' if quote == '<' else quote}"
                if layer == "llm" and _generated(Path(name).name):
                    found.append(f"{where}: llm/ must not include a generated protobuf header")
                    continue
                target = _target_layer(root, src, quote, name)
                if target is None or target in ALLOWED[layer]:
                    continue
                if target == "?":
                    found.append(f"{where}: resolves to no file in the tree")
                else:
                    found.append(f"{where}: {layer}/ may not include {target}/ "
                                 f"(allowed: {', '.join(sorted(ALLOWED[layer]))})")
    return found


def test_includes_follow_the_layers():
    bad = layer_violations(ROOT)
    assert not bad, "includes that cross the layers the wrong way:\n  " + "\n  ".join(bad)


def _write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_the_check_finds_a_wrong_include(tmp_path):
    # A small tree that is right except for one include of the other worker.
    _write(tmp_path, "llm/quant.h", "#pragma once\n")
    _write(tmp_path, "llm/gguf.h", '#include "quant.h"\n#include <stdint.h>\n')
    _write(tmp_path, "proto/wire.h", '#include "llm/gguf.h"\n#include "spillway.pb-c.h"\n')
    _write(tmp_path, "worker-cpu/engine.h", '#include "proto/wire.h"\n')
    _write(tmp_path, "worker-gpu/scheduler.c",
           '#include "worker-gpu/scheduler.h"\n'
           "/* one line of code */\n"
           '#include "worker-cpu/engine.h"\n')
    _write(tmp_path, "worker-gpu/scheduler.h", '#include "llm/gguf.h"\n')
    assert layer_violations(tmp_path) == [
        'worker-gpu/scheduler.c:3: #include "worker-cpu/engine.h": worker-gpu/ may not '
        "include worker-cpu/ (allowed: llm, proto, worker-gpu)"]


def test_the_check_finds_each_kind_of_crossing(tmp_path):
    _write(tmp_path, "llm/generate.h", '#include "spillway.pb-c.h"\n')
    _write(tmp_path, "llm/chat.h", '#include "proto/wire.h"\n')
    _write(tmp_path, "proto/wire.h", '#include "gateway/gw.h"\n')
    _write(tmp_path, "gateway/gw.h", '#include "worker-cpu/engine.h"\n')
    _write(tmp_path, "worker-cpu/engine.h", '#include <gateway/gw.h>\n')
    _write(tmp_path, "sdk/client.c", '#include "nowhere.h"\n')
    _write(tmp_path, "tools/loadgen.c", '  #  include "../gateway/gw.h"\n')
    bad = layer_violations(tmp_path)
    assert [b.split(":")[0] + ":" + b.split(":")[1] for b in bad] == [
        "gateway/gw.h:1", "llm/chat.h:1", "llm/generate.h:1", "proto/wire.h:1",
        "sdk/client.c:1", "tools/loadgen.c:1", "worker-cpu/engine.h:1"]
    assert "generated protobuf header" in bad[2]
    assert "resolves to no file" in bad[4]
