"""dtc_local.licenses: what the image build accepts, from what the SBOM and Debian's copyright files declare."""

from dtc_local.licenses import ACCEPTED, Accepted, Component, debian_terms, expression_terms, judge, read_accepted


def python(name: str, *terms: str) -> Component:
    return Component(name, "1.0", "python", terms, " AND ".join(terms), f"https://pypi.org/project/{name}/1.0/")


def debian(name: str, section: str) -> Component:
    return Component(name, "1.0-1", "debian", ("GPL-2+",), "GPL-2+", "https://sources.debian.org/src/x/1.0-1/", section)


ACCEPT = Accepted({"MIT": "permissive", "Apache-2.0": "permissive", "LLVM-exception": "an exception"},
                  {"nvidia-*-cu12": ("LicenseRef-NVIDIA", "redistributable"), "quiet": ("MIT", "its LICENSE")},
                  {"textless": "https://example.org/LICENSE"})


def test_expression_terms_keep_identifiers_and_exceptions_once():
    assert expression_terms("Apache-2.0 AND (Apache-2.0 WITH LLVM-exception OR MIT)") == (
        "Apache-2.0", "LLVM-exception", "MIT")


def test_debian_terms_read_machine_readable_copyright_files_only():
    dep5 = ("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\n"
            "License: GPL-2+ or Artistic\n text\n\nFiles: lib/*\nLicense: BSD-3-clause\n")
    assert debian_terms(dep5) == ("GPL-2+", "Artistic", "BSD-3-clause")
    assert debian_terms("This package was debianized by ...\nLicense: GPL\n") == ()


def test_everything_accepted_gives_no_problem():
    shipped = [python("a", "MIT"), python("b", "Apache-2.0", "LLVM-exception"), python("nvidia-cublas-cu12"),
               python("quiet"), python("textless", "MIT"), debian("bash", "shells")]
    assert judge(shipped, ACCEPT, "accepted.toml", frozenset({"textless"})) == []


def test_each_problem_is_named_after_a_first_line_naming_the_file():
    shipped = [python("a", "MIT", "AGPL-3.0-only"), python("silent"), debian("nvidia-driver", "non-free/libs")]
    problems = judge(shipped, ACCEPT, "entrypoint/dtc_local/accepted_licenses.toml", frozenset({"a"}))
    assert problems[0] == "licenses not accepted by entrypoint/dtc_local/accepted_licenses.toml (7 problems):"
    assert problems[1:] == [
        "a: its wheel ships no license text and no common license has it: add a [[component]] entry with text_url "
        "(where the text is) and why",
        "a 1.0: license 'AGPL-3.0-only' is not accepted: accept it in a [[license]] entry (for every component) "
        "or this component in a [[component]] entry, each with why",
        "silent 1.0: declares no license: read it and add a [[component]] entry with its license and why",
        "nvidia-driver 1.0-1: Debian's non-free archive area, not main: add a [[component]] entry with its license "
        "and why",
        "[[component]] nvidia-*-cu12: matches no shipped component: remove it, or limit its flavors",
        "[[component]] quiet: matches no shipped component: remove it, or limit its flavors",
        "[[component]] textless: matches no shipped component: remove it, or limit its flavors",
    ]


def test_the_projects_file_reads_for_each_flavor_and_limits_entries_to_their_flavors():
    cpu, gpu = read_accepted(ACCEPTED, "cpu"), read_accepted(ACCEPTED, "gpu")
    assert "cuda-bindings" in gpu.components and "cuda-bindings" not in cpu.components
    assert cpu.terms == gpu.terms and "MIT" in cpu.terms and all(cpu.terms.values())
    assert all(why for _, why in gpu.components.values())
    flask = {"flask-cors": "https://github.com/corydolphin/flask-cors/blob/main/LICENSE"}
    assert cpu.text_urls == flask and gpu.text_urls == {
        **flask, "nvidia-cusparselt-cu12": "https://docs.nvidia.com/cuda/cusparselt/license.html"}
