"""The trusted code a sandboxed child runs, shipped to it as compiled code objects.

Under bwrap the child sees neither the project directory nor anything else of the machine beyond the
interpreter and its site-packages, so the modules it needs from elsewhere (this package's child side,
an entry function's module and the project modules that one imports, found by reading their import
statements) travel in the request. Modules the child can import itself (the standard library,
site-packages) are not shipped. A package whose `__init__` none of them needs is shipped as an empty
placeholder, so importing a driver does not drag in a package's registry.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import sysconfig
from functools import lru_cache
from types import CodeType

# Always shipped: the bootstrap loads the child from the request, and the child imports seccomp
# lazily (after the finder is in place), whether or not esopt itself lies in site-packages.
CHILD_MODULES = ("esopt.sandbox.child", "esopt.sandbox.seccomp")


def site_dirs() -> list[str]:
    """The site-packages directories on this interpreter's path, in order (they hold numpy)."""
    out: list[str] = []
    for entry in sys.path:
        if os.path.basename(entry.rstrip("/")) in ("site-packages", "dist-packages") and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if real not in out:
                out.append(real)
    return out


def _importable_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")} | set(site_dirs())
    return tuple(r.rstrip("/") + "/" for r in roots)


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # "x is not a package": name is an attribute, not a module
        return None


def _ships(spec, roots: tuple[str, ...]) -> bool:
    """Whether a module must travel in the request (the child cannot import it by itself)."""
    origin = spec.origin
    if not origin or not spec.has_location or not origin.endswith(".py"):
        return False  # built-in, frozen, namespace package or extension module
    return not os.path.realpath(origin).startswith(roots)


def _imports(tree: ast.AST, name: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import statement; names is [] for `import m`."""
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, [alias.name for alias in node.names]))
    return out


def _display_name(name: str, origin: str, is_package: bool) -> str:
    depth = name.count(".") + (1 if is_package else 0)
    parts = os.path.realpath(origin).split(os.sep)
    return "/".join(parts[-(depth + 1):])


@lru_cache(maxsize=None)
def shipped_modules(entry_module: str | None) -> dict[str, tuple[str, bool, CodeType | None]]:
    """name -> (filename shown in tracebacks, is_package, code; None for a placeholder package) of
    every module the child must be sent to run `entry_module` (None: only this package's child side)."""
    roots = _importable_roots()
    full: dict[str, tuple[str, bool, CodeType]] = {}
    queue = [(name, True) for name in CHILD_MODULES]
    if entry_module:
        queue.append((entry_module, False))
    while queue:
        name, always = queue.pop()
        if name in full:
            continue
        spec = _spec(name)
        if spec is None:
            if name == entry_module:
                raise ImportError(f"no module named {name!r} for the sandbox entry")
            continue
        if not always and not _ships(spec, roots):
            continue
        is_package = spec.submodule_search_locations is not None
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        filename = _display_name(name, spec.origin, is_package)
        tree = ast.parse(source, filename)
        full[name] = (filename, is_package, compile(tree, filename, "exec", dont_inherit=True))
        for module, names in _imports(tree, name, is_package):
            module_spec = _spec(module)
            if module_spec is None or not _ships(module_spec, roots):
                continue  # the child imports it from the standard library or site-packages
            if not names:
                queue.append((module, False))
            # `from m import x`: x is a submodule (ship it) or a name m's own code defines (ship m)
            for attr in names:
                if attr != "*" and _spec(f"{module}.{attr}") is not None:
                    queue.append((f"{module}.{attr}", False))
                else:
                    queue.append((module, False))
    shipped: dict[str, tuple[str, bool, CodeType | None]] = dict(full)
    for name in full:
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in shipped:
                shipped[parent] = (parent.replace(".", "/") + "/__init__.py", True, None)
    return shipped
