"""Sphinx extension: API pages generated from ``__all__``, and rendering fixes.

``.. kvcore-api:: MODULE`` documents the names of ``MODULE.__all__``:

* with ``:names: A B C`` only those, in that order (a topic section of a page);
* without it, every name of ``__all__`` that no earlier directive on the page
  documented, in ``__all__`` order. Put one at the end of every module page:
  a name added to ``__all__`` then appears without editing the docs. With
  ``:section: TITLE`` the remaining names get a section of their own (placed
  at the page's top level), and nothing at all when none remain.

Every public name is *described* once, on the page of its **home** module:
the public module that defines it, or, for names defined in a private module,
the first public module exporting it (``kvcore`` before its submodules, then
alphabetical). Other modules exporting the same object list it as a link.
Constants are documented by the ``#:`` comment above their assignment in the
module that defines them (private or not), never by the docstring of ``int``,
``str`` or ``tuple``; a public constant without one is a build warning.

Rendering fixes applied to every page:

* cross-references to where an object is defined (``kvcore._config.KVCacheGroupSpec``,
  ``kvcore_plugins.mamba.spec.MambaSpec``) are pointed at its public name
  (``kvcore.KVCacheGroupSpec``, ``kvcore_plugins.mamba.MambaSpec``), shown short;
* attrs' ``NOTHING`` sentinel never shows in a signature: a ``Factory``
  default shows its value (``frozenset()``), a ``takes_self`` one ``...``;
* a class's fields are listed once: a parameter already listed under
  *Variables* (attrs fields, documented as ``Attributes:``) is dropped from
  *Parameters*;
* a public module of the package that no page documents is a build warning.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from functools import cache
from typing import Any

import attrs
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles
from sphinx.util.typing import restify, stringify_annotation

logger = logging.getLogger(__name__)

#: Packages whose public modules get API pages and whose private paths are
#: rewritten to public ones.
PACKAGES = ("kvcore",)
#: Packages whose private paths are rewritten too (documented elsewhere).
EXTRA_PACKAGES = ("kvcore_plugins",)
#: Values longer than this are not shown in a constant's signature.
MAX_VALUE_CHARS = 200


# -- public modules and homes -----------------------------------------------------------


def _is_private(module_name: str) -> bool:
    return any(part.startswith("_") for part in module_name.split("."))


@cache
def public_modules(package: str) -> tuple[str, ...]:
    """The package and its public submodules, package first, then alphabetical."""
    found = []
    todo = [package]
    while todo:
        name = todo.pop()
        found.append(name)
        module = importlib.import_module(name)
        infos = pkgutil.iter_modules(getattr(module, "__path__", ()), name + ".")
        todo.extend(info.name for info in infos if not _is_private(info.name))
    return (package, *sorted(found[1:]))


@cache
def all_modules(package: str) -> tuple[str, ...]:
    """Every importable module of the package, private ones included."""
    module = importlib.import_module(package)
    infos = pkgutil.walk_packages(module.__path__, package + ".", onerror=lambda _: None)
    # A __main__ module is never imported: that would run the CLI.
    return (package, *(i.name for i in infos if not i.name.endswith(".__main__")))


def exported(module_name: str) -> tuple[str, ...]:
    """``__all__`` of a module (an empty tuple when it has none)."""
    return tuple(getattr(importlib.import_module(module_name), "__all__", ()))


@cache
def attr_docs(module_name: str) -> dict[str, list[str]]:
    """Module-level ``#:`` comments (and docstrings after assignments) by name."""
    try:
        analyzer = ModuleAnalyzer.for_module(module_name)
        docs = analyzer.find_attr_docs()
    except Exception:
        return {}
    return {name: list(lines) for (scope, name), lines in docs.items() if scope == ""}


def _package_of(module_name: str) -> str:
    return module_name.split(".", 1)[0]


def _is_described_object(obj: object) -> bool:
    """Classes and functions: objects that know where they were defined."""
    return inspect.isclass(obj) or inspect.isroutine(obj)


def defining_module(name: str, obj: object, package: str) -> str | None:
    """The module that defines ``obj`` (for constants: the one with its ``#:`` comment)."""
    if _is_described_object(obj):
        return getattr(obj, "__module__", None)
    candidates = [m for m in public_modules(package) if name in exported(m)]
    candidates += [m for m in all_modules(package) if m not in candidates]
    for module_name in candidates:
        if name in attr_docs(module_name):
            return module_name
    return None


def home(module_name: str, name: str) -> str:
    """The public module on whose page ``module_name.name`` is described."""
    package = _package_of(module_name)
    obj = getattr(importlib.import_module(module_name), name)
    exporters = [
        m
        for m in public_modules(package)
        if name in exported(m) and getattr(importlib.import_module(m), name, None) is obj
    ]
    defined_in = defining_module(name, obj, package)
    if defined_in in exporters:
        return defined_in
    return exporters[0] if exporters else module_name


@cache
def public_paths() -> dict[str, str]:
    """Private path → public path of every object a public module exports."""
    paths: dict[str, str] = {}
    for package in PACKAGES + EXTRA_PACKAGES:
        for module_name in public_modules(package):
            for name in exported(module_name):
                obj = getattr(importlib.import_module(module_name), name)
                if not _is_described_object(obj):
                    continue
                where = home(module_name, name)
                private = f"{obj.__module__}.{obj.__qualname__}"
                public = f"{where}.{name}"
                if private != public:
                    paths.setdefault(private, public)
    return paths


# -- the directive ----------------------------------------------------------------------


def _meaningful_bases(cls: type) -> bool:
    return any(base not in (object, typing.Generic) for base in cls.__bases__)


def _value_text(obj: object) -> str | None:
    text = repr(obj)
    if text.startswith("<") or len(text) > MAX_VALUE_CHARS:
        return None
    return text


def _is_type_alias(obj: object) -> bool:
    origin = typing.get_origin(obj)
    return (
        isinstance(obj, typing.TypeVar | types.UnionType)
        or (origin is not None
        and not inspect.isclass(obj))
    )


def _constant_lines(
    module_name: str, name: str, obj: object, package: str
) -> tuple[list[str], str | None]:
    """The rST of a constant, and a warning when it has no ``#:`` comment."""
    defined_in = defining_module(name, obj, package)
    doc = attr_docs(defined_in)[name] if defined_in else []
    lines = [f".. py:data:: {name}", f"   :module: {module_name}"]
    if _is_type_alias(obj):
        doc = [*doc, "", f"Alias of {restify(obj, 'smart')}."]
    else:
        annotation = None
        if defined_in:
            raw = getattr(importlib.import_module(defined_in), "__annotations__", {}).get(name)
            if raw is not None and raw is not typing.Final and raw != "Final":
                annotation = raw if isinstance(raw, str) else stringify_annotation(raw, "smart")
        if annotation:
            lines.append(f"   :type: {annotation}")
        value = _value_text(obj)
        if value is not None:
            lines.append(f"   :value: {value}")
    lines.append("")
    lines += [f"   {line}" if line else "" for line in doc]
    lines.append("")
    warning = None if doc else f"public constant {module_name}.{name} has no '#:' comment"
    return lines, warning


def _object_lines(module_name: str, name: str, obj: object) -> list[str]:
    target = f"{module_name}.{name}"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        lines = [f".. autoexception:: {target}", "   :members:", "   :show-inheritance:"]
    elif inspect.isclass(obj):
        lines = [f".. autoclass:: {target}", "   :members:"]
        if _meaningful_bases(obj):
            lines.append("   :show-inheritance:")
    else:
        lines = [f".. autofunction:: {target}"]
    return [*lines, ""]


def _full_name(module_name: str, name: str) -> str:
    """Where ``module_name.name`` is described: its home's path (a module: its own)."""
    obj = getattr(importlib.import_module(module_name), name)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return f"{home(module_name, name)}.{name}"


class KVCoreAPI(SphinxDirective):
    """``.. kvcore-api:: MODULE``: document the names of ``MODULE.__all__``."""

    required_arguments = 1
    option_spec: typing.ClassVar[dict[str, Any]] = {
        "names": directives.unchanged,
        "section": directives.unchanged,
    }

    def _documented_here(self) -> set[str]:
        """Full names described or listed on this page by earlier directives."""
        objects = self.env.domains["py"].objects
        described = {name for name, entry in objects.items() if entry.docname == self.env.docname}
        return described | self._seen()

    def _seen(self) -> set[str]:
        return self.env.temp_data.setdefault("kvcore_api_seen", set())

    def run(self) -> list[nodes.Node]:
        """Return the nodes documenting the module's names."""
        module_name = self.arguments[0]
        package = _package_of(module_name)
        module = importlib.import_module(module_name)
        if not hasattr(module, "__all__"):
            msg = f"{module_name} has no __all__"
            raise self.error(msg)
        if "names" in self.options:
            names = self.options["names"].split()
            unknown = [n for n in names if n not in module.__all__]
            if unknown:
                msg = f"not in {module_name}.__all__: {', '.join(unknown)}"
                raise self.error(msg)
        else:
            done = self._documented_here()
            names = [n for n in module.__all__ if _full_name(module_name, n) not in done]
        self._seen().update(_full_name(module_name, n) for n in names)
        lines: list[str] = []
        elsewhere: list[str] = []
        submodules: list[str] = []
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                submodules.append(obj.__name__)
            elif (where := home(module_name, name)) != module_name:
                elsewhere.append(f"{where}.{name}")
            elif _is_described_object(obj):
                lines += _object_lines(module_name, name, obj)
            else:
                constant, warning = _constant_lines(module_name, name, obj, package)
                lines += constant
                if warning:
                    logger.warning(warning, location=self.get_location())
        if elsewhere:
            links = ", ".join(f":py:obj:`~{target}`" for target in elsewhere)
            homes = sorted({target.rsplit(".", 1)[0] for target in elsewhere})
            where = ", ".join(f":py:mod:`{h}`" for h in homes)
            lines += [f"Importable from ``{module_name}`` too, documented in {where}: {links}.", ""]
        if submodules:
            links = ", ".join(f":py:mod:`{name}`" for name in submodules)
            lines += [f"Submodules: {links}.", ""]
        if not lines:
            return []
        content = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, self.get_source_info()[0]), content)
        if "section" not in self.options:
            return content.children
        title = self.options["section"]
        name = nodes.fully_normalize_name(title)
        section = nodes.section(ids=[nodes.make_id(title)], names=[name])
        section["kvcore_toplevel"] = True
        section += nodes.title(title, title)
        section += content.children
        self.state.document.note_implicit_target(section)
        return [section]


# -- rendering fixes ----------------------------------------------------------------------


def _hoist_sections(app: Sphinx, doctree: nodes.document) -> None:
    """Move ``:section:`` sections of the directive to the page's top level."""
    top = next(iter(doctree.findall(nodes.section)), None)
    if top is None:
        return
    for section in list(doctree.findall(nodes.section)):
        if section.get("kvcore_toplevel") and section.parent is not top:
            section.parent.remove(section)
            top.append(section)


def _public_target(target: str) -> str | None:
    """The public path of an object referred to by where it is defined, if any."""
    if not target.startswith(PACKAGES + EXTRA_PACKAGES):
        return None
    return public_paths().get(target)


def _rewrite_private_references(app: Sphinx, doctree: nodes.document) -> None:
    """Point references to private paths at the public names, shown short."""
    for ref in doctree.findall(addnodes.pending_xref):
        if ref.get("refdomain") != "py":
            continue
        target = ref.get("reftarget", "")
        public = _public_target(target)
        if public is None:
            continue
        ref["reftarget"] = public
        text = ref.astext()
        if text in (target, target.rsplit(".", 1)[-1]):
            ref.children = [nodes.literal(public, public.rsplit(".", 1)[-1], classes=["xref"])]
            if ref.get("reftype") in ("class", "obj", "exc", "data", "func"):
                ref.children[0]["classes"] += ["py", "py-" + ref["reftype"]]


def _attrs_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """Replace attrs' ``NOTHING`` defaults by what they mean."""
    if what not in ("class", "exception") or not signature or "NOTHING" not in signature:
        return None
    if not attrs.has(obj):
        return None
    for field in attrs.fields(obj):
        default = field.default
        if not isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            continue
        shown = "..." if default.takes_self else repr(default.factory())
        signature = signature.replace(f"{field.alias}=NOTHING", f"{field.alias}={shown}")
    return signature, return_annotation


def _fields_once(app: Sphinx, domain: str, objtype: str, content: addnodes.desc_content) -> None:
    """Drop a class's parameter fields that repeat one of its variable fields.

    Runs after autodoc's type hints are merged (as raw ``param``/``type``
    fields) and before Sphinx groups the fields: an attrs class documents its
    fields once, under *Variables*, with their types.
    """
    if domain != "py" or objtype not in ("class", "exception"):
        return
    for field_list in content.findall(nodes.field_list):
        fields = [f for f in field_list.children if isinstance(f, nodes.field)]
        kinds: dict[tuple[str, str], nodes.field] = {}
        for field in fields:
            parts = field[0].astext().split()
            if len(parts) >= 2:
                kinds[(parts[0], parts[-1])] = field
        variables = {name for kind, name in kinds if kind in ("ivar", "var", "cvar")}
        for (kind, name), field in kinds.items():
            if name not in variables:
                continue
            if kind == "param":
                field_list.remove(field)
            elif kind == "type":
                if ("vartype", name) in kinds:
                    field_list.remove(field)
                else:
                    field[0].children = [nodes.Text(f"vartype {name}")]


#: The order of an entry's fields: parameters, variables, what it returns, what it
#: raises (Sphinx groups raw fields in the order they first appear).
_FIELD_ORDER = {
    "param": 0, "parameter": 0, "arg": 0, "argument": 0, "type": 0,
    "keyword": 0, "kwarg": 0, "kwparam": 0, "kwtype": 0,
    "var": 1, "ivar": 1, "cvar": 1, "vartype": 1,
    "returns": 2, "return": 2, "rtype": 2, "yields": 2, "yield": 2,
    "raises": 3, "raise": 3, "except": 3, "exception": 3,
}


def _fields_in_order(
    app: Sphinx, domain: str, objtype: str, content: addnodes.desc_content
) -> None:
    """Put *Parameters* first and *Raises* last in every entry.

    autodoc appends the parameters it takes from type hints after the fields
    the docstring wrote, so an entry whose docstring has ``Raises:`` but no
    ``Args:`` listed its parameters after what it raises.
    """
    if domain != "py":
        return
    for field_list in content.findall(nodes.field_list):
        fields = [f for f in field_list.children if isinstance(f, nodes.field)]

        def rank(field: nodes.field) -> int:
            words = field[0].astext().split()
            return _FIELD_ORDER.get(words[0].lower(), 2) if words else 2

        ordered = sorted(fields, key=rank)
        if ordered != fields:
            for field in fields:
                field_list.remove(field)
            field_list.extend(ordered)


def _check_every_public_module_has_a_page(app: Sphinx, env: Any) -> None:
    documented = set(env.domains["py"].modules)
    for package in PACKAGES:
        for module_name in public_modules(package):
            if module_name not in documented:
                logger.warning(
                    "public module %s has no API page: add docs/reference/api/%s.rst "
                    "with '.. py:module:: %s' and '.. kvcore-api:: %s'",
                    module_name,
                    module_name.rsplit(".", 1)[-1],
                    module_name,
                    module_name,
                )


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directive and the rendering fixes."""
    app.add_directive("kvcore-api", KVCoreAPI)
    app.connect("doctree-read", _hoist_sections, priority=400)
    app.connect("doctree-read", _rewrite_private_references, priority=400)
    app.connect("autodoc-process-signature", _attrs_signature)
    app.connect("object-description-transform", _fields_once, priority=600)
    app.connect("object-description-transform", _fields_in_order, priority=650)
    app.connect("env-check-consistency", _check_every_public_module_has_a_page)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
