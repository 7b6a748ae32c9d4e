"""The documentation says what the code does: the README's and getting-started's code blocks run as written, the
generated reference pages are current, every error and environment variable is documented, and the site builds
with `mkdocs build --strict` (no broken link, no missing reference).

Each runnable block runs in a fresh temporary directory of its own (deleted afterwards), standing for the root of
a checkout: `.venv` there is this environment, ZOO_REGISTRY is unset (the shipped registry.db), and ZOO_CACHE,
HOME and the Hugging Face and torch hub caches are empty temporary folders, offline. A block is marked by an HTML
comment on the line before it:

- `<!-- needs: setup -->`: `make run` / `make test` (they create .venv and install from the network): not run;
  the targets are checked to exist;
- `<!-- needs: network -->`: a download; run offline, it must fail with one of zoo's typed errors (a ZooError),
  never a raw traceback;
- `<!-- needs: gpu -->`: run where torch sees a CUDA GPU; elsewhere it must fail with a ZooError too;
- `<!-- file: NAME -->`: not run: the file NAME that the page asks the reader to save, written into the
  directory of every block of that page.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml  # PyYAML: timm depends on it

import zoo
from zoo import errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN_PAGES = (ROOT / "README.md", DOCS / "getting-started.md")
README_MAX_LINES = 150  # the README is the front page: the rest lives in docs/
RUNNABLE = {"python", "sh"}
MARKERS = {"needs: setup", "needs: network", "needs: gpu"}
BLOCK_TIMEOUT_S = 600

# Runs one Python block; on an exception, records what it was before letting it end the process as usual.
RUNNER = """
import json, runpy, sys
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except BaseException as e:
    from zoo.errors import ZooError
    with open("outcome.json", "w") as f:
        json.dump({"type": type(e).__name__, "zoo_error": isinstance(e, ZooError), "message": str(e)}, f)
    raise
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    marker: str | None  # "needs: gpu", "file: mynets.py", ...
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the marker comment on the line before it."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
        assert end is not None, f"{page.name}:{i + 1}: a code fence that never closes"
        before = lines[i - 1].strip() if i else ""
        marker = re.fullmatch(r"<!--\s*(.*?)\s*-->", before)
        found.append(
            Block(
                page, i + 1, fence.group(2), marker.group(1) if marker else None, "\n".join(lines[i + 1 : end]) + "\n"
            )
        )
        i = end + 1
    return found


def _run_blocks() -> list[Block]:
    return [b for page in RUN_PAGES for b in blocks(page) if not (b.marker or "").startswith("file:")]


def _files(page: Path) -> dict[str, str]:
    return {b.marker.split(":", 1)[1].strip(): b.code for b in blocks(page) if (b.marker or "").startswith("file:")}


def test_every_block_of_the_run_pages_is_runnable_or_marked():
    """No block escapes the run below: each is Python or sh, and a marker is one this test knows."""
    for block in (b for page in RUN_PAGES for b in blocks(page)):
        assert block.language in RUNNABLE, f"{block.where}: a {block.language or 'plain'} block (python or sh only)"
        assert block.marker is None or block.marker in MARKERS or block.marker.startswith("file: "), block.where


def test_the_readme_is_short_and_its_setup_is_the_two_make_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "the README is the front page: move the detail into docs/"
    setup = [b.code.strip() for b in blocks(ROOT / "README.md") if b.marker == "needs: setup"]
    assert setup == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "docs"):
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no {target} target"


def test_usage_notation_stays_out_of_runnable_blocks():
    """`[--json]` or `a|b` in a command a reader copies is syntax, not a command: it belongs in the reference."""
    for block in (b for b in _run_blocks() if b.language == "sh"):
        for line in block.code.splitlines():
            command = line.split("#", 1)[0]
            assert not re.search(r"\s\[-", command) and "PATTERN" not in command, f"{block.where}: {line}"
            assert not re.search(r"\w\|\w", command), f"{block.where}: {line}"


def _environment(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOO_")}
    for name in ("HOME", "ZOO_CACHE", "HF_HOME", "TORCH_HOME"):
        (base / name.lower()).mkdir(exist_ok=True)
        env[name] = str(base / name.lower())
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["HF_HUB_OFFLINE"] = "1"  # the tests never need the network: a block that downloads fails here
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def scratch():
    """One temporary directory for the blocks' own folders, deleted at the end."""
    with tempfile.TemporaryDirectory(prefix="zoo-docs-") as folder:
        yield Path(folder)


@pytest.mark.parametrize("block", [b for b in _run_blocks() if b.marker != "needs: setup"], ids=lambda b: b.where)
@pytest.mark.slow  # each block in a fresh process: 90 s in all
def test_the_block_runs_as_written(block: Block, scratch: Path):
    home = scratch / re.sub(r"\W", "-", block.where)
    home.mkdir()
    env = _environment(home)
    work = home / "checkout"
    work.mkdir()
    for name, text in _files(block.page).items():
        (work / name).write_text(text)
    if block.language == "sh":
        if not (Path(sys.prefix) / "bin" / "activate").exists():
            pytest.skip("the shell blocks source .venv/bin/activate: these tests do not run in a virtualenv")
        (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        (home / "block.py").write_text(block.code)
        command = [sys.executable, "-c", RUNNER, str(home / "block.py")]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    report = f"{block.where} ({block.marker or 'runs'}), exit {proc.returncode}:\n{output}"
    expect_failure = block.marker == "needs: network" or (block.marker == "needs: gpu" and not _cuda())
    if not expect_failure:
        assert proc.returncode == 0, report
        return
    assert proc.returncode != 0, f"{block.where} is marked {block.marker} but ran here: drop the marker\n{report}"
    if block.language == "sh":  # the CLI prints a ZooError as one line; anything else is a traceback
        assert "zoo: error:" in proc.stderr and "Traceback" not in proc.stderr, report
    else:
        outcome = json.loads((work / "outcome.json").read_text())
        assert outcome["zoo_error"], f"{block.where} failed with {outcome['type']}, not a typed ZooError\n{report}"


# --- the generated reference ------------------------------------------------------------------------------------


def test_the_generated_reference_pages_are_current():
    """docs/reference/cli.md from the argparse parser, fields.md from zoo.columns, schema.md from the tables and
    migrations: a flag, field, column or migration added without running the generator fails here."""
    tool = runpy.run_path(str(DOCS / "gen_reference.py"))
    for path, text in tool["generated"]().items():
        assert path.exists() and path.read_text() == text, f"run python docs/gen_reference.py ({path.name})"


def test_the_cli_reference_names_every_command_and_flag():
    import argparse

    from zoo.cli import parser

    page = (DOCS / "reference" / "cli.md").read_text()
    tool = runpy.run_path(str(DOCS / "gen_reference.py"))
    for words, sub, _ in tool["_commands"](parser()):
        assert f"zoo {' '.join(words)}\n" in page, words
        for action in sub._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                for flag in action.option_strings:
                    assert f"`{flag}`" in page, (words, flag)


# --- errors and environment variables ---------------------------------------------------------------------------


def _error_classes() -> dict[str, type]:
    found = {n: c for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, BaseException)}
    exported = {n: getattr(zoo, n) for n in zoo.__all__ if isinstance(getattr(zoo, n), type)}
    found |= {n: c for n, c in exported.items() if issubclass(c, BaseException)}
    return found


def test_every_error_is_documented_with_its_bases():
    """docs/reference/errors.md has a section per exception, headed by the class as declared (its bases), saying
    what causes it and what to do."""
    page = (DOCS / "reference" / "errors.md").read_text()
    headings = {m.group(1): m for m in re.finditer(r"^## `(\w+)\(([^)]*)\)`$", page, re.M)}
    classes = _error_classes()
    for name, cls in classes.items():
        assert name in headings, f"document {name} in docs/reference/errors.md: ## `{name}(...)`"
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        assert headings[name].group(2) == bases, f"{name}'s bases are ({bases}), the page says ({headings[name][2]})"
        body = page[headings[name].end() :].split("\n## ", 1)[0]
        assert "**What to do:**" in body, f"{name}: say what to do"
    assert set(headings) <= set(classes), "errors.md documents an error zoo does not have"


def _environment_variables() -> set[str]:
    """Every environment variable zoo's code reads: os.environ.get / os.environ[...] / os.getenv with a literal
    name, and every literal ZOO_ name."""
    names = set()
    for path in (ROOT / "zoo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"ZOO_[A-Z0-9_]+", node.value):
                    names.add(node.value)
            call = node.func if isinstance(node, ast.Call) else None
            reads = (
                isinstance(call, ast.Attribute)
                and (call.attr == "getenv" or (call.attr == "get" and ast.unparse(call.value).endswith("environ")))
                and node.args
            )
            key = node.args[0] if reads else node.slice if isinstance(node, ast.Subscript) else None
            if (
                key is not None
                and (reads or ast.unparse(node.value).endswith("environ"))
                and isinstance(key, ast.Constant)
                and isinstance(key.value, str)
            ):
                names.add(key.value)
    return names


def test_every_environment_variable_is_documented():
    page = (DOCS / "reference" / "environment.md").read_text()
    documented = set(re.findall(r"^## `(\w+)`$", page, re.M))
    read = _environment_variables()
    assert {"ZOO_REGISTRY", "ZOO_CACHE", "ZOO_TRUSTED_MODULES", "ZOO_LOCK_TIMEOUT"} <= read  # the scan finds them
    assert read - documented == set(), "document these in docs/reference/environment.md (## `NAME`)"


# --- the site ---------------------------------------------------------------------------------------------------


def test_the_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not there"


class _IgnoreTags(yaml.SafeLoader):
    """mkdocs.yml's own tags (!relative, !ENV) read as plain values."""


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_every_page_is_in_the_navigation():
    def listed(node) -> set[str]:
        if isinstance(node, str):
            return {node}
        if isinstance(node, list):
            return set().union(*(listed(n) for n in node))
        if isinstance(node, dict):
            return set().union(*(listed(v) for v in node.values()))
        return set()

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_IgnoreTags)
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - listed(config["nav"]) == set()


def test_the_site_builds_strictly():
    """`make docs`: a broken link, a missing page or an API reference that does not resolve fails the build."""
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python") if not _has(m)]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    with tempfile.TemporaryDirectory(prefix="zoo-site-") as site:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mkdocs",
                "build",
                "--strict",
                "--config-file",
                str(ROOT / "mkdocs.yml"),
                "-d",
                site,
            ],
            cwd=ROOT,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
        assert (Path(site) / "reference" / "python" / "index.html").read_text().count('id="zoo.api.Zoo.get"') == 1


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
