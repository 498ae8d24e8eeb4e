"""Functions fit on a screen: none in the project's own C, CUDA and header
files is over 80 lines, from the first line of its signature to its closing
brace. The unit and fuzz tests are left out: their long functions are
tables of checks, read one row at a time.
"""
import re
from pathlib import Path

from conftest import ROOT

LIMIT = 80
FOLDERS = ("llm", "proto", "worker-cpu", "worker-gpu", "gateway", "sdk", "tools")
SUFFIXES = {".c", ".h", ".cu", ".cuh"}
NOT_A_FUNCTION = re.compile(r"^\s*(typedef|struct|union|enum|extern\s+\"\")\b")


def _code(line, in_comment):
    """The line without comments, strings and character literals; whether a
    /* comment is still open at its end."""
    out, i, n = [], 0, len(line)
    while i < n:
        if in_comment:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out), True
            in_comment, i = False, j + 2
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line.startswith("//", i):
            break
        elif line[i] in "\"'":
            q, i = line[i], i + 1
            while i < n and line[i] != q:
                i += 2 if line[i] == "\\" else 1
            out.append('""')
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def long_functions(text, limit=LIMIT):
    """(first line, length, signature) of each function over the limit."""
    found, depth, start, stmt, in_comment, in_macro = [], 0, None, "", False, False
    body_from = None
    for no, line in enumerate(text.split("\n"), 1):
        code, in_comment = _code(line, in_comment)
        s = code.strip()
        if in_macro or (depth == 0 and s.startswith("#")):
            in_macro = s.endswith("\\")
            continue
        if depth == 0 and s and start is None:
            start = no
        if depth == 0:
            stmt += " " + s
        for ch in code:
            if ch == "{":
                if depth == 0 and "(" in stmt and "=" not in stmt.split("{")[0] and not NOT_A_FUNCTION.match(stmt):
                    body_from = start
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    if body_from is not None and no - body_from + 1 > limit:
                        found.append((body_from, no - body_from + 1, stmt.strip()[:60]))
                    body_from, start, stmt = None, None, ""
        if depth == 0 and s.endswith(";"):
            start, stmt = None, ""
    return found


def test_no_function_is_over_80_lines():
    over = []
    for folder in FOLDERS:
        for p in sorted((ROOT / folder).rglob("*")):
            if p.suffix in SUFFIXES:
                for first, n, sig in long_functions(p.read_text(errors="replace")):
                    over.append(f"{p.relative_to(ROOT)}:{first}: {n} lines: {sig}")
    assert not over, "functions over %d lines:\n" % LIMIT + "\n".join(over)


def test_the_check_measures_from_signature_to_brace():
    def function(name, n_body):   # a two-line signature, braces, n_body lines
        body = "\n".join(f"    x += {i};" for i in range(n_body))
        return f"static int {name}(int a,\n             int b)\n{{\n{body}\n}}\n"
    fits, over = function("f", LIMIT - 4), function("g", LIMIT - 3)
    table = "static const int t[] = {\n" + ",\n".join(["1"] * 100) + "\n};\n"
    comment = "/* f(x) { */\nstruct s { int a; };\n"
    assert long_functions(fits) == []
    assert [(first, n) for first, n, _ in long_functions(comment + over)] == [(3, 81)]
    assert long_functions(table) == []
