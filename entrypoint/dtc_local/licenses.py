"""The image's licenses: every shipped component's license text, a manifest, and the accepted-license check.

Usage (the image build's last step, with the image's own interpreter, after docker/write-sbom.sh):
    python -m dtc_local.licenses --sbom /opt/dtc/sbom.cdx.json --out /opt/dtc/licenses --flavor cpu|gpu

Reads the components from the image's SBOM (docker/sbom.py: every Python distribution and every
Debian package) and writes, under OUT:

- ``python/<name>-<version>/``: the license files the distribution installed (its ``License-File``
  entries, core metadata 2.4, or any file of its .dist-info named LICENSE*, LICENCE*, COPYING*,
  NOTICE*, AUTHORS* or COPYRIGHT*); where it ships none, its ``METADATA`` when its License field
  holds the text, else Debian's text of a common license it is under
  (``common-licenses/<name>``, from /usr/share/common-licenses: Apache-2.0, MPL-2.0, ...), else
  nothing, and the component needs a ``text_url`` in accepted_licenses.toml (checked);
- ``debian/<package>/copyright``: Debian's copyright file of the package (Debian Policy 12.5);
- ``manifest.json``: one object per component, ``{"name", "version", "kind": "python"|"debian",
  "license", "source", "files"}``, sorted by kind and name; ``license`` is the SPDX expression or
  the names the component declares (a Python distribution's metadata through cyclonedx-py; the
  ``License:`` fields of a machine-readable Debian copyright file, DEP-5), or the one
  accepted_licenses.toml gives it; ``source`` is where its source is (the project's repository
  or PyPI page; sources.debian.org for a Debian package); ``files`` are relative to OUT;
  ``text_url``, only where no file is shipped, where the text is.

Then checks every component against ``accepted_licenses.toml`` (beside this module; ``--accepted``
for another): a Python distribution passes when every license term it declares is accepted there
(an ``OR`` is not resolved for you: each alternative must be acceptable), or when a
``[[component]]`` entry names it (the entry's license replaces what it declares: for a
distribution that declares none, or a proprietary license accepted for that distribution only); a
Debian package passes when it is from Debian's main archive area (DFSG-free: Debian Policy 2.2.1)
or a ``[[component]]`` entry names it. A ``[[component]]`` entry of the flavor that matches nothing
fails too, as in image_sanity_exceptions.toml. Exit 1 with one line per problem, the first saying which file to
change; nothing is written to OUT then.

Raises SystemExit(2) when the SBOM or the accepted file cannot be read.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ACCEPTED = Path(__file__).with_name("accepted_licenses.toml")
LICENSE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|AUTHORS|COPYRIGHT)", re.I)
EXPRESSION_WORDS = {"AND", "OR", "WITH"}


@dataclass(frozen=True)
class Component:
    """One shipped component, as the SBOM lists it: ``kind`` python|debian, ``terms`` the license
    identifiers or names it declares (empty when none), ``declared`` them as one string."""
    name: str
    version: str
    kind: str
    terms: tuple[str, ...]
    declared: str
    source: str
    section: str = ""


@dataclass(frozen=True)
class Accepted:
    """accepted_licenses.toml for one flavor: ``terms`` accepted for any component (term -> why),
    ``components`` (name pattern -> (license, why)) for named components, and ``text_urls`` (name
    pattern -> where the license text is, for a component whose wheel ships none)."""
    terms: dict[str, str]
    components: dict[str, tuple[str, str]]
    text_urls: dict[str, str]


def expression_terms(expression: str) -> tuple[str, ...]:
    """The license identifiers of an SPDX expression, exceptions included, in order, once each:
    ``"Apache-2.0 WITH LLVM-exception OR MIT"`` -> ``("Apache-2.0", "LLVM-exception", "MIT")``."""
    words = re.findall(r"[^\s()]+", expression)
    return tuple(dict.fromkeys(w for w in words if w.upper() not in EXPRESSION_WORDS))


def component_terms(entry: dict) -> tuple[tuple[str, ...], str]:
    """(terms, declared) of a CycloneDX component's ``licenses``."""
    terms, parts = [], []
    for item in entry.get("licenses") or []:
        if "expression" in item:
            terms += expression_terms(item["expression"])
            parts.append(item["expression"])
        else:
            value = item["license"].get("id") or item["license"].get("name", "")
            terms.append(value)
            parts.append(value)
    return tuple(dict.fromkeys(terms)), " AND ".join(dict.fromkeys(parts))


def debian_terms(copyright_text: str) -> tuple[str, ...]:
    """The license short names of a machine-readable Debian copyright file (DEP-5: its
    ``License:`` fields' first lines, expressions split), or () when it is not machine-readable."""
    if not copyright_text.startswith("Format:"):
        return ()
    names = []
    for value in re.findall(r"^License:[ \t]*(\S[^\n]*)$", copyright_text, re.M):
        names += [w for w in re.findall(r"[^\s(),]+", value) if w.lower() not in {"and", "or", "with"}]
    return tuple(dict.fromkeys(names))


def read_accepted(path: Path, flavor: str) -> Accepted:
    """The entries of an accepted_licenses.toml for ``flavor`` (cpu|gpu)."""
    data = tomllib.loads(path.read_text())
    terms = {term: entry["why"] for entry in data.get("license", []) for term in entry["terms"]}
    entries = [entry for entry in data.get("component", []) if flavor in entry.get("flavors", ["cpu", "gpu"])]
    return Accepted(terms, {e["name"]: (e["license"], e["why"]) for e in entries if "license" in e},
                    {e["name"]: e["text_url"] for e in entries if "text_url" in e})


def judge(components: list[Component], accepted: Accepted, accepted_file: str,
          without_text: frozenset[str] = frozenset()) -> list[str]:
    """One line per component whose license is not accepted, per component named in
    ``without_text`` (no license text to ship) that no entry gives a ``text_url``, and per
    [[component]] entry that matches nothing, after a first line naming ``accepted_file``; empty
    when everything shipped is accepted. Pure: no file is read."""
    problems, used = [], set()
    for name in sorted(without_text):
        urls = [pattern for pattern in accepted.text_urls if fnmatch.fnmatchcase(name, pattern)]
        used.update(urls)
        if not urls:
            problems.append(f"{name}: its wheel ships no license text and no common license has it: add a "
                            "[[component]] entry with text_url (where the text is) and why")
    for component in components:
        named = [pattern for pattern in accepted.components if fnmatch.fnmatchcase(component.name, pattern)]
        if named:
            used.update(named)
            continue
        if component.kind == "debian":
            if component.section.startswith(("non-free", "contrib")):
                problems.append(f"{component.name} {component.version}: Debian's {component.section.split('/')[0]} "
                                "archive area, not main: add a [[component]] entry with its license and why")
            continue
        if not component.terms:
            problems.append(f"{component.name} {component.version}: declares no license: read it and add a "
                            "[[component]] entry with its license and why")
            continue
        for term in component.terms:
            if term in accepted.terms:
                used.add(term)
            else:
                problems.append(f"{component.name} {component.version}: license {term!r} is not accepted: accept it "
                                "in a [[license]] entry (for every component) or this component in a [[component]] "
                                "entry, each with why")
    problems += [f"[[component]] {name}: matches no shipped component: remove it, or limit its flavors"
                 for name in sorted((set(accepted.components) | set(accepted.text_urls)) - used)]
    if problems:
        problems.insert(0, f"licenses not accepted by {accepted_file} ({len(problems)} problems):")
    return problems


def read_components(sbom: dict) -> list[Component]:
    """The SBOM's Python distributions and Debian packages as Components (Debian sections from dpkg)."""
    sections = dict(line.split("\t", 1) for line in subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Section}\n"], capture_output=True, text=True,
        check=True).stdout.splitlines())
    components = []
    for entry in sbom["components"]:
        purl = entry["purl"]
        if purl.startswith("pkg:pypi/"):
            terms, declared = component_terms(entry)
            urls = {ref["type"]: ref["url"] for ref in entry.get("externalReferences", [])
                    if ref["url"].startswith("https://")}
            source = urls.get("vcs") or urls.get("website") or \
                f"https://pypi.org/project/{entry['name']}/{entry['version']}/"
            components.append(Component(entry["name"], entry["version"], "python", terms, declared, source))
        elif purl.startswith("pkg:deb/"):
            props = {p["name"]: p["value"] for p in entry.get("properties", [])}
            source_name, source_version = props["dtc:debian:source"].split(" ", 1)
            copyright_file = Path("/usr/share/doc") / entry["name"] / "copyright"
            text = copyright_file.read_text(errors="replace") if copyright_file.exists() else ""
            terms = debian_terms(text)
            components.append(Component(entry["name"], entry["version"], "debian", terms, " AND ".join(terms),
                                        f"https://sources.debian.org/src/{source_name}/{source_version}/",
                                        sections.get(entry["name"], "")))
    return components


# Debian's copies of common licenses' texts (base-files), for a distribution whose wheel ships none.
COMMON_LICENSES = Path("/usr/share/common-licenses")
COMMON = {"Apache-2.0": "Apache-2.0", "License :: OSI Approved :: Apache Software License": "Apache-2.0",
          "MPL-2.0": "MPL-2.0", "LGPL-2.1": "LGPL-2.1", "CC0-1.0": "CC0-1.0", "GPL-2.0": "GPL-2", "GPL-3.0": "GPL-3"}


def license_texts(component: Component, license_: str) -> list[tuple[Path, str]]:
    """(file, path under the component's directory) of every license text to ship for
    ``component`` under ``license_`` (its final license): a Python distribution's installed
    license files (see the module's docstring), else its metadata's License text, else Debian's
    common-licenses text of a license it is under; a Debian package's copyright file."""
    if component.kind == "debian":
        source = Path("/usr/share/doc") / component.name / "copyright"
        return [(source, "copyright")] if source.exists() else []
    dist = metadata.distribution(component.name)
    declared = set(dist.metadata.get_all("License-File") or [])
    found = []
    for file in dist.files or ():
        parts = file.parts
        if parts and parts[0].endswith(".dist-info") and len(parts) > 1 and (
                parts[1] == "licenses" or file.name in declared or LICENSE_FILE.match(file.name)):
            found.append((Path(dist.locate_file(file)), "/".join(parts[1:])))
    if found:
        return found
    if "\n" in (dist.metadata.get("License") or "").strip():    # its METADATA's License field is the text
        return [(Path(dist.locate_file(file)), "METADATA") for file in dist.files or ()
                if file.name == "METADATA" and file.parts[0].endswith(".dist-info")][:1]
    common = [COMMON[term] for term in (*expression_terms(license_), license_) if term in COMMON]
    return [(COMMON_LICENSES / common[0], f"common-licenses/{common[0]}")] if common else []


def final_license(component: Component, accepted: Accepted) -> str:
    """The license a component is shipped under: its [[component]] entry's, else what it declares."""
    named = [value for pattern, value in accepted.components.items() if fnmatch.fnmatchcase(component.name, pattern)]
    return named[0][0] if named else component.declared


def write(components: list[Component], texts: dict[str, list[tuple[Path, str]]], accepted: Accepted,
          out: Path) -> list[dict]:
    """Copies every component's license texts under ``out`` and returns the manifest's rows."""
    rows = []
    for component in sorted(components, key=lambda c: (c.kind, c.name.lower())):
        target = out / component.kind / (f"{component.name}-{component.version}" if component.kind == "python"
                                         else component.name)
        files = []
        for source, relative in texts[component.name]:
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
            files.append(str(destination.relative_to(out)))
        urls = [url for pattern, url in accepted.text_urls.items() if fnmatch.fnmatchcase(component.name, pattern)]
        rows.append({"name": component.name, "version": component.version, "kind": component.kind,
                     "license": final_license(component, accepted), "source": component.source,
                     "files": sorted(files), **({"text_url": urls[0]} if urls and not files else {})})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sbom", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--accepted", type=Path, default=ACCEPTED)
    parser.add_argument("--flavor", choices=("cpu", "gpu"), required=True)
    args = parser.parse_args(argv)
    try:
        sbom = json.loads(args.sbom.read_text())
        accepted = read_accepted(args.accepted, args.flavor)
    except (OSError, ValueError, KeyError) as error:
        print(f"licenses: cannot read {args.sbom} or {args.accepted}: {error}", file=sys.stderr)
        return 2
    components = read_components(sbom)
    texts = {c.name: license_texts(c, final_license(c, accepted)) for c in components}
    problems = judge(components, accepted, str(args.accepted),
                     frozenset(name for name, found in texts.items() if not found))
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    rows = write(components, texts, accepted, args.out)
    (args.out / "manifest.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"licenses: {len(rows)} components ({sum(r['kind'] == 'python' for r in rows)} Python, "
          f"{sum(r['kind'] == 'debian' for r in rows)} Debian), all accepted, "
          f"{sum(bool(r['files']) for r in rows)} with their license text -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
