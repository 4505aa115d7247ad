"""Check the built HTML docs for what a warning-free Sphinx build lets through.

Run by ``.ci/run`` after the ``sphinx-build -W`` step (and by the tests on their
own build)::

    python docs/_tools/check_built_docs.py docs/_build/html

It fails (exit status 1, one line per problem) on:

* **duplicated section titles**: two sections with the same title under the
  same parent section of a page (a section pasted twice);
* **duplicated options**: two descriptions of one command-line option of one
  program (Sphinx gives the second a numbered id, ``cmdoption-kvcore-plan-0``);
* **duplicated paragraphs**: the same paragraph of 12 words or more twice on
  a page (a module docstring repeated by the page around it);
* **duplicated index entries**: one index entry linking twice to one page;
* **API names not rendered exactly once**: every name in the ``__all__`` of a
  public kvcore module must be described by exactly one object description
  (``dt`` with its id) over all pages, ``NULL_BLOCK`` included;
* **private paths or attrs sentinels** in a rendered API signature or field
  (``kvcore._config...``, ``=NOTHING``).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from bs4 import BeautifulSoup, Tag

MIN_PARAGRAPH_WORDS = 12
_NUMBERED_OPTION = re.compile(r"^cmdoption-.+-(arg-)?\d+$")
_PRIVATE_PATH = re.compile(r"\bkvcore(?:_plugins)?(?:\.\w+)*\._[a-z]\w*")


def pages(html: Path) -> Iterator[tuple[str, BeautifulSoup]]:
    """Every content page of the build (not the search or index machinery)."""
    for path in sorted(html.rglob("*.html")):
        name = path.relative_to(html).as_posix()
        if name.startswith(("_", "search", "py-modindex")):
            continue
        yield name, BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _article(soup: BeautifulSoup) -> Tag:
    return soup.find("article") or soup.body or soup


def _title(section: Tag) -> str:
    heading = section.find(re.compile(r"^h[1-6]$"), recursive=False)
    return heading.get_text(" ", strip=True).rstrip("¶#").strip() if heading else ""


def duplicated_titles(name: str, soup: BeautifulSoup) -> list[str]:
    """Sections with the same title under one parent."""
    problems = []
    for parent in [_article(soup), *_article(soup).find_all("section")]:
        titles = Counter(_title(child) for child in parent.find_all("section", recursive=False))
        problems += [
            f"{name}: section {title!r} appears {count} times under "
            f"{_title(parent) or 'the page'!r}"
            for title, count in titles.items()
            if count > 1 and title
        ]
    return problems


def duplicated_options(name: str, soup: BeautifulSoup) -> list[str]:
    """Option descriptions Sphinx had to give a numbered id, or described twice."""
    problems = []
    seen: Counter[tuple[str, str]] = Counter()
    for dt in _article(soup).select("dl.std.option > dt[id]"):
        option = dt.get_text(" ", strip=True).rstrip("¶#").strip()
        if _NUMBERED_OPTION.match(dt["id"]):
            problems.append(f"{name}: option {option!r} is described twice (id {dt['id']!r})")
        program = dt["id"].removeprefix("cmdoption-")
        seen[(program, option)] += 1
    problems += [
        f"{name}: option id {program!r} ({option!r}) appears {count} times"
        for (program, option), count in seen.items()
        if count > 1
    ]
    return problems


def duplicated_paragraphs(name: str, soup: BeautifulSoup) -> list[str]:
    """Paragraphs of prose that appear twice on one page."""
    texts = Counter(
        " ".join(p.get_text(" ", strip=True).split())
        for p in _article(soup).find_all("p")
        if not p.find_parent(["dl", "table", "nav"])
    )
    return [
        f"{name}: paragraph repeated {count} times: {text[:70]!r}..."
        for text, count in texts.items()
        if count > 1 and len(text.split()) >= MIN_PARAGRAPH_WORDS
    ]


def duplicated_index_entries(html: Path) -> list[str]:
    """Index entries that link twice to the same page."""
    path = html / "genindex.html"
    if not path.exists():
        return []
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    problems = []
    for item in soup.select("table.indextable li"):
        links = [a["href"].split("#")[0] for a in item.find_all("a", recursive=False)]
        outer = item.find_parent("li")
        head = outer.find(string=True, recursive=False) if outer else None
        label = f"{(head or '').strip()} / {item.get_text(' ', strip=True)}".strip(" /")
        problems += [
            f"genindex.html: entry {label[:60]!r} links {count} times to {page}"
            for page, count in Counter(links).items()
            if count > 1
        ]
    return problems


def public_names(package: str = "kvcore") -> dict[str, str]:
    """Every public name → the module path it is imported by, over the public modules.

    A name exported by several modules (a re-export) counts once: under the
    object it is (``kvcore.managers.NULL_BLOCK`` and ``kvcore.managers.NULL_BLOCK`` are
    one constant). Submodules listed in ``__all__`` are skipped: each has a page.
    """
    sys.path.insert(0, str(Path(__file__).parent.parent / "_ext"))
    from kvcore_api import home, public_modules

    names = {}
    for module_name in public_modules(package):
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            if type(getattr(module, name)).__name__ == "module":
                continue
            names[f"{home(module_name, name)}.{name}"] = f"{module_name}.{name}"
    return names


def described_ids(soups: Iterable[tuple[str, BeautifulSoup]]) -> Counter[str]:
    """How often each Python object is described (``dl.py > dt[id]``), over all pages."""
    ids: Counter[str] = Counter()
    for _, soup in soups:
        for dt in _article(soup).select("dl.py > dt[id]"):
            ids[dt["id"]] += 1
    return ids


def api_names_once(soups: list[tuple[str, BeautifulSoup]]) -> list[str]:
    """Every public name described exactly once."""
    ids = described_ids(soups)
    return [
        f"{full} (imported as {imported}) is described {ids[full]} times, not once"
        for full, imported in sorted(public_names().items())
        if ids[full] != 1
    ]


def private_paths(name: str, soup: BeautifulSoup) -> list[str]:
    """Private module paths and attrs' NOTHING in API descriptions."""
    problems = []
    for dl in _article(soup).select("dl.py"):
        dt = dl.find("dt", recursive=False)
        fields = dl.find("dd", recursive=False)
        for part in (dt, *(fields.select("dl.field-list") if fields else ())):
            if part is None:
                continue
            text = part.get_text(" ", strip=True)
            problems += [
                f"{name}: private path {path!r} in {dt.get('id', '?')!r}"
                for path in sorted(set(_PRIVATE_PATH.findall(text)))
            ]
            if re.search(r"=\s*NOTHING\b", text):
                problems.append(f"{name}: attrs' NOTHING in the signature of {dt.get('id')!r}")
    return sorted(set(problems))


def check(html: Path) -> list[str]:
    """Every problem found in the build at ``html``."""
    soups = list(pages(html))
    problems = []
    for name, soup in soups:
        problems += duplicated_titles(name, soup)
        problems += duplicated_options(name, soup)
        problems += duplicated_paragraphs(name, soup)
        problems += private_paths(name, soup)
    problems += duplicated_index_entries(html)
    problems += api_names_once(soups)
    return problems


def main() -> int:
    """Check the build given on the command line; print the problems."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path, help="the built HTML folder")
    html = parser.parse_args().html
    if not (html / "index.html").exists():
        print(f"{html}: no built docs here (run sphinx-build first)", file=sys.stderr)
        return 2
    problems = check(html)
    for problem in problems:
        print(problem)
    print(
        f"checked {sum(1 for _ in pages(html))} pages and {len(public_names())} public "
        f"names: {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
