"""The documentation: the site builds strictly, its reference covers the public API and every
config key, every code block is run, checked or marked as not run, and the README stays the
front door."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import docblocks
import pytest
from conftest import run_patiently

import jaxnet
from jaxnet import cli, config

ROOT = docblocks.ROOT
MKDOCS = Path(sys.executable).with_name("mkdocs")
needs_mkdocs = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs not installed (scripts/test installs it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@needs_mkdocs
def test_site_builds_strictly_with_every_page_of_the_nav(site):
    nav = re.findall(r":\s*([\w-]+)\.md\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert len(nav) == len(list((ROOT / "docs").glob("*.md")))  # every page is in the navigation
    for name in nav:
        page = site / ("index.html" if name == "index" else f"{name}/index.html")
        assert page.is_file(), name


@needs_mkdocs
def test_api_reference_shows_every_public_name_with_its_signature_and_docstring(site):
    html = (site / "api" / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", html)
    modules_and_internals = ("data", "models", "tasks", "TextDataset", "Dataset")
    headings = set(re.findall(r'class="doc doc-heading">\s*(jaxnet\.[\w.]+)\s*<', html))
    for name in jaxnet.__all__:
        if name not in modules_and_internals:
            assert f"jaxnet.{name}" in headings, name
    assert "workdir" in text and "Train as" in text  # jaxnet.train's signature and docstring
    assert "Could not" not in text and "mkdocstrings" not in text.lower().replace("mkdocstrings-python", "")


@needs_mkdocs
def test_config_page_lists_every_key_of_every_family_once(site):
    html = (site / "config" / "index.html").read_text()
    from jaxnet.models import base

    for key in config.keys(config.Config()):
        if not key.startswith("model."):
            assert html.count(f"<code>{key}</code>") == 1, key
    for name, family in base.REGISTRY.items():
        if not family.config.__module__.startswith("jaxnet."):
            continue  # registered by an experiment file another test of this process loaded
        assert f"model.name={name}" in html
        for key in config.model_keys(family.config):
            assert f"<code>{key}</code>" in html, (name, key)


def test_every_code_block_is_run_checked_or_marked_not_run():
    unmarked = [b.where() for b in docblocks.all_blocks() if b.lang in ("python", "bash") and b.kind is None]
    assert not unmarked, f"code blocks without a <!-- docs:... --> marker (see tests/docblocks.py): {unmarked}"
    skips = [b for b in docblocks.all_blocks() if b.kind == "skip"]
    assert all(b.arg for b in skips), "a docs:skip marker must give its reason"


def test_blocks_run_by_tests_are_read_by_a_test():
    tests = "".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for b in docblocks.all_blocks():
        if b.kind == "test":
            assert f'docblocks.block("{b.arg}")' in tests, f"{b.where()}: no test reads docs:test {b.arg}"
        if b.kind == "file":
            assert (ROOT / b.arg).is_file() and b.code == (ROOT / b.arg).read_text(), b.where()


def _commands(code: str) -> list[list[str]]:
    """The command lines of a bash block, continuation lines joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def _subcommands() -> set[str]:
    """The jaxnet command's subcommands, from its own parser."""
    parser = cli._parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    return set(commands.choices)


def _placeholder(token: str) -> bool:
    return "..." in token or "$" in token or (token.isupper() and len(token) > 1) or token.startswith("[")


def check_command(words: list[str]) -> None:
    """Parse one documented command as the jaxnet command would, and check its experiment and its
    config keys, without running it; a script it names must exist."""
    if words[:3] == ["python", "-m", "jaxnet"]:
        words = ["jaxnet", *words[3:]]
    if words[0] == "python" and len(words) > 1 and words[1].endswith(".py"):
        assert (ROOT / words[1]).is_file(), words[1]
        return
    if words[0] == "bash" and len(words) > 1:
        words = words[1:]
    if words[0].startswith(("scripts/", "./scripts/")):
        assert (ROOT / words[0]).is_file(), words[0]
        return
    if words[0] != "jaxnet":
        return
    args = words[1:]
    if any(_placeholder(a) for a in args):  # a synopsis: only the subcommand is checked
        assert args[0] in _subcommands(), args
        return
    parsed = cli.parse_args(args)  # a UserError fails the test with the command's own message
    experiment = getattr(parsed, "experiment", None)
    overrides = [o for o in getattr(parsed, "overrides", None) or [] if "=" in o]
    if parsed.command in ("sweep", "study"):
        for o in overrides:
            key = o.split("=", 1)[0]
            assert key in ("batch", "staleness", "workers") or key in config.keys(config.load_experiment(experiment)), o
        overrides = []
    if experiment:
        config.load_experiment(experiment, [o for o in overrides if "," not in o])
    elif overrides:
        config.apply_overrides(config.Config(), overrides)


CHECKED = [b for b in docblocks.all_blocks() if b.kind == "check"]


@pytest.mark.parametrize("doc", CHECKED, ids=[b.where() for b in CHECKED])
def test_documented_commands_parse_with_known_experiments_and_keys(doc):
    commands = _commands(doc.code)
    assert commands, f"{doc.where()}: a docs:check block with no command"
    for words in commands:
        check_command(words)


def test_the_command_check_fails_on_a_typo():
    with pytest.raises(jaxnet.UserError, match="did you mean optim.lr"):
        check_command(shlex.split("jaxnet train cnn_fashion_mnist optim.learning_rate=0.1"))
    with pytest.raises(jaxnet.UserError):
        check_command(shlex.split("jaxnet train no_such_experiment"))
    with pytest.raises(jaxnet.UserError):
        check_command(shlex.split("jaxnet trian cnn_fashion_mnist"))


RUN = [b for b in docblocks.all_blocks() if b.kind == "run"]


@pytest.mark.parametrize("doc", RUN, ids=[b.where() for b in RUN])
def test_docs_run_blocks_run(doc, tmp_path):
    command = [sys.executable, "-c", doc.code] if doc.lang == "python" else ["bash", "-euo", "pipefail", "-c", doc.code]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = run_patiently(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, f"{doc.where()}: {result.stderr[-2000:]}"


def test_readme_is_the_front_door_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "./scripts/train" in readme and "./scripts/test" in readme
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_docs_screenshots_show_rendered_pages(tmp_path):
    result = subprocess.run([str(ROOT / "scripts" / "docs_shots"), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name, title in (("home", "jaxnet"), ("guide", "Getting started"), ("api", "Python API")):
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000, name  # a drawn page, not a blank one
        dom = (tmp_path / f"{name}.html").read_text()
        assert f"<title>{title}" in dom or "<h1" in dom and title in dom, name
        assert 'name="query"' in dom  # the search box
        assert "mkdocstrings" not in dom.lower() and "Could not" not in dom
