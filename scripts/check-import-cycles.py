#!/usr/bin/env python3
"""Fails when two or more source files of a crate import each other in a circle.

An import is any path a file names into its own crate: `use crate::...`, `use super::...`,
`use self::...`, `use child::...` (a module the file declares), and the same paths written
inline in code (`crate::app::failures::STUCK`, `child::f()`, or through a module a `use`
named: `use super::budgets;` then `budgets::policy::check()`). Each path goes to the file of the longest
module it names (`crate::app::Applications` is src/app/mod.rs, `crate::app::start::Start`
is src/app/start.rs). Declaring a module (`mod start;`) is not an import, and neither is a
path into the file itself (an inline `mod tests` taking `super::*`). Comments and string
literals are skipped.

Usage: check-import-cycles.py [CRATE_ROOT...]   (default: src/lib.rs src/main.rs)
       check-import-cycles.py --self-test      (small crates with known circles)
Prints every circle with the names each file takes from the next, and exits 1 if any.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The code without comments, string and char literals (each replaced by a space)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif re.match(r'b?r#*"', text[i:i + 8]):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(" " + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" ")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (each as a list of segments)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    depth, start, parts = 0, 0, []
    brace = tree.find("{")
    if brace < 0:
        return [[s for s in tree.split("::") if s]]
    prefix = [s for s in tree[:brace].split("::") if s]
    inner = tree[brace + 1:tree.rfind("}")]
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    paths = []
    for part in parts:
        if part:
            for sub in expand(part):
                paths.append(prefix + sub)
    return paths


class Crate:
    def __init__(self, root):
        self.root = root
        self.files = {}  # module path (tuple) -> file
        self.collect(root, ())
        # Names a file re-exports (`pub use ...`): name -> the path it re-exports.
        self.reexports = {m: self.reexported(m) for m in self.files}

    def reexported(self, module):
        text = strip(open(self.files[module], encoding="utf-8").read())
        names = {}
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for segments in expand(m.group(1)):
                if segments and segments[-1] not in ("*", "self"):
                    names[segments[-1]] = segments
        return names

    def collect(self, path, module):
        self.files[module] = path
        text = strip(open(path, encoding="utf-8").read())
        base = os.path.dirname(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem not in ("lib", "main", "mod"):
            base = os.path.join(base, stem)
        for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;",
                               text, re.M):
            for candidate in (os.path.join(base, name + ".rs"),
                              os.path.join(base, name, "mod.rs")):
                if os.path.exists(candidate):
                    self.collect(candidate, module + (name,))
                    break

    def resolve(self, module, segments, hops=0):
        """The file a path names: the longest module of it that is a file, or the file a
        name re-exported there comes from; None if external."""
        first = segments[0]
        if first == "crate":
            at, rest = (), segments[1:]
        elif first in ("super", "self"):
            at, rest = module, segments
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    if not at:
                        return None
                    at = at[:-1]
                rest = rest[1:]
        elif module + (first,) in self.files:
            at, rest = module, segments
        else:
            return None
        taken = 0
        for seg in rest:
            if at + (seg,) in self.files:
                at = at + (seg,)
                taken += 1
            else:
                break
        # `super::AppError` where the parent only re-exports it from a sibling: the import
        # is of the sibling.
        if taken < len(rest) and hops < 8:
            name = rest[taken]
            origin = self.reexports.get(at, {}).get(name)
            if origin is not None:
                target = self.resolve(at, origin, hops + 1)
                if target is not None:
                    return target
        return at

    def imports(self, module):
        """{imported module: names taken} for one file (inline modules followed)."""
        text = strip(open(self.files[module], encoding="utf-8").read())
        found = {}
        # Inline modules (`mod tests { ... }`): where each opens and closes, so that a
        # `super::` inside one resolves from it.
        spans = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
            depth, i = 1, m.end()
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            spans.append((m.end(), i, m.group(1)))

        def inline_module(pos):
            inner = module
            for start, end, name in spans:
                if start <= pos < end:
                    inner = inner + ("#" + name,)
            return inner

        def add(pos, segments):
            at = inline_module(pos)
            # An inline module's super:: is the file's own module.
            while at and at[-1].startswith("#") and segments and segments[0] == "super":
                at, segments = at[:-1], segments[1:]
                if not segments:
                    return
                if segments[0] != "super":
                    segments = ["self"] + segments
            at = tuple(s for s in at if not s.startswith("#"))
            target = self.resolve(at, segments)
            if target is None or target == module:
                return
            name = segments[-1]
            found.setdefault(target, set()).add(name)

        # Modules a `use` names (`use super::budgets;`): inline paths through them
        # (`budgets::policy::check(…)`) import what they name.
        aliases = {}
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            for segments in expand(m.group(1)):
                if segments:
                    add(m.start(), segments)
                    if segments[-1] not in ("*", "self", "super", "crate"):
                        aliases[segments[-1]] = segments
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)",
                             text):
            add(m.start(), [s.strip() for s in m.group(1).split("::")])
        # Inline paths from a module this file declares (`watch::events(…)` after
        # `mod watch;`) or a module it imported by name.
        for m in re.finditer(r"(?<![\w:])(" + IDENT + r"(?:\s*::\s*" + IDENT + r")+)", text):
            segments = [s.strip() for s in m.group(1).split("::")]
            first = segments[0]
            if first in ("crate", "super", "self"):
                continue
            if module + (first,) in self.files:
                add(m.start(), segments)
            elif first in aliases:
                add(m.start(), aliases[first] + segments[1:])
        return found


def cycles(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def self_test():
    """Small crates whose circles are known: each kind of path must be seen."""
    import tempfile
    cases = {
        "use crate": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use crate::b::B;\n",
                       "b.rs": "use crate::a::A;\n"}, 1),
        "inline child path": ({"lib.rs": "mod watch;\npub struct S;\nfn f() { watch::events(); }\n",
                               "watch.rs": "use super::S;\npub fn events() {}\n"}, 1),
        "path through a used module": ({"lib.rs": "mod app;\nmod config;\n",
                                        "app/mod.rs": "mod options;\n",
                                        "app/options.rs": "use crate::config;\nfn f() { config::load(); }\n",
                                        "config.rs": "use crate::app;\nfn g() { app::options::h(); }\n"}, 1),
        "no circle": ({"lib.rs": "mod a;\nmod b;\nfn f() { a::x(); }\n", "a.rs": "use crate::b;\nfn x() { b::y(); }\n",
                       "b.rs": "// use crate::a;\nfn y() { let _ = \"crate::a::x\"; }\n"}, 0),
    }
    failed = 0
    for name, (files, expected) in cases.items():
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text)
            crate = Crate(os.path.join(root, "lib.rs"))
            found = len(cycles({m: crate.imports(m) for m in crate.files}))
        if found != expected:
            failed += 1
            print(f"self-test {name!r}: {found} circle(s), expected {expected}")
    print(f"self-test: {len(cases) - failed} of {len(cases)} cases right")
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    roots = sys.argv[1:] or ["src/lib.rs", "src/main.rs"]
    failed = 0
    for root in roots:
        found = failed
        crate = Crate(root)
        graph = {m: crate.imports(m) for m in crate.files}
        for component in cycles(graph):
            failed += 1
            members = set(component)
            print(f"import circle in {root}:")
            for m in component:
                for target, names in sorted(graph[m].items()):
                    if target in members:
                        print(f"  {crate.files[m]} -> {crate.files[target]}: "
                              + ", ".join(sorted(names)))
        print(f"{root}: {len(crate.files)} files, {failed - found} import circle(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
