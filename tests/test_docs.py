"""The documentation site (docs/, mkdocs.yml) builds without a warning, and what its pages
show is the project's own: Python examples are files the tests run, not code typed into a
page; every `manage.py` command and flag, `make` target, `AGENTRUN_*` setting and repository
path they name exists. Each check is also shown failing on a page that breaks it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands, load_command_class

from agentrun.models import Run
from agentrun.tools import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
# The pages, and the README, which names the same commands and settings.
PAGES = sorted(DOCS.rglob("*.md"))
TEXTS = [*PAGES, ROOT / "README.md"]

# Named on the pages, but not settings: each is read from the environment where it is used.
NOT_SETTINGS = {
    # Read at each request, never stored, so never a Django setting.
    "AGENTRUN_LLM_API_KEY": "agentrun/builtin/llm.py",
    # A worker's profiling switch, read when the worker starts.
    "AGENTRUN_PROFILE_PATH": "agentrun/celery.py",
}
# Repository folders whose paths, in code font, must exist.
TOP_DIRS = ("agentrun/", "bench/", "debugger/", "docs/", "tests/", "templates/", "static/")


# --- reading the pages ---------------------------------------------------------------


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, its indentation (a list item's) removed."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(```+)\s*([\w+-]*)", lines[i])
        i += 1
        if not opening:
            continue
        indent, fence, language = opening.groups()
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1
        blocks.append((language, "\n".join(body)))
    return blocks


def code_spans(text: str) -> list[str]:
    """The inline code of the text outside its fenced blocks."""
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def shell_lines(text: str) -> list[str]:
    """Every command line of the shell blocks (continuations joined), and every code span."""
    lines = []
    for language, body in code_blocks(text):
        if language in ("sh", "bash", "console", "shell"):
            lines += [ln.removeprefix("$ ") for ln in body.replace("\\\n", " ").splitlines()]
    return lines + code_spans(text)


def unquoted(line: str) -> str:
    """The line without its quoted strings and its comment: what is left are words and flags."""
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "''", line)
    return re.sub(r"(^|\s)#.*", "", line)


# --- the checks: each returns what is wrong with a text --------------------------------


def python_block_problems(text: str) -> list[str]:
    """A Python block longer than a line must be one snippet line naming a file that runs."""
    problems = []
    for language, body in code_blocks(text):
        if language not in ("python", "py", "pycon"):
            continue
        included = re.fullmatch(r'\s*--8<--\s+"([^"]+)"\s*', body)
        if included and not runs_in_tests(included[1]):
            problems.append(f"{included[1]} is included, but no test imports or runs it")
        elif not included and len(body.strip().splitlines()) > 1:
            problems.append(f"a Python block typed into the page: {body.strip()[:60]!r}")
    return problems


def runs_in_tests(path: str) -> bool:
    if path.startswith("docs/snippets/"):
        return Path(path).name in SNIPPET_TESTS and (ROOT / path).is_file()
    module = path.removesuffix(".py").replace("/", ".")
    tests = [t for t in (ROOT / "tests").rglob("test_*.py") if t.name != Path(__file__).name]
    return (ROOT / path).is_file() and any(module in t.read_text() for t in tests)


def command_problems(text: str) -> list[str]:
    """Each `manage.py COMMAND --flag` (or a span `COMMAND --flag`): a real command and flag."""
    commands = get_commands()
    problems = []
    for line in shell_lines(text):
        line = unquoted(line)
        found = re.findall(r"manage\.py\s+(\S+)(.*?)(?=$|&&|\|\||;)", line)
        bare = re.match(r"\s*([a-z_]+)\s+(.*-.*)$", line)
        if not found and bare and bare[1] in commands:
            found = [(bare[1], bare[2])]  # a span of the commands table: `watch RUN_ID [--json]`
        for name, rest in found:
            if not re.fullmatch(r"[a-z_]+", name):
                continue  # `manage.py …`
            if name not in commands:
                problems.append(f"manage.py {name}: no such command")
                continue
            parser = load_command_class(commands[name], name).create_parser("manage.py", name)
            known = {s for action in parser._actions for s in action.option_strings}
            for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                if flag not in known:
                    problems.append(f"manage.py {name}: no flag {flag}")
    return problems


def makefile_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, re.M))


def make_problems(text: str) -> list[str]:
    """Each `make TARGET` names a target of the Makefile (`make NAME=value` sets a variable)."""
    targets, problems = makefile_targets(), []
    for line in shell_lines(text):
        for words in re.findall(r"(?:^|[\s;&(])make((?:\s+[^\s;&|)`]+)+)", unquoted(line)):
            for word in words.split():
                if re.fullmatch(r"[a-z][\w-]*", word) and word not in targets:
                    problems.append(f"make {word}: no such target")
    return problems


def setting_problems(text: str) -> list[str]:
    """Each AGENTRUN_* name is read in agentrun/settings.py, or is one of NOT_SETTINGS."""
    settings_py = (ROOT / "agentrun" / "settings.py").read_text()
    problems = []
    for name in sorted(set(re.findall(r"\bAGENTRUN_[A-Z0-9_]*[A-Z0-9]\b", text))):
        if name in NOT_SETTINGS:
            if name not in (ROOT / NOT_SETTINGS[name]).read_text():
                problems.append(f"{name} is no longer read in {NOT_SETTINGS[name]}")
        elif f'"{name}"' not in settings_py:
            problems.append(f"{name} is not a setting of agentrun/settings.py")
    return problems


def path_problems(text: str) -> list[str]:
    """Each repository path in code font (`bench/RESULTS.md`, `docs/snippets/…`) exists."""
    problems = []
    for span in code_spans(text):
        path = span.split("#")[0].rstrip("/")
        in_repository = span.startswith(TOP_DIRS) and re.fullmatch(r"[\w./-]+", path)
        if in_repository and not (ROOT / path).exists():
            problems.append(f"{span}: no such file or folder")
    return problems


CHECKS = [python_block_problems, command_problems, make_problems, setting_problems, path_problems]


# GitHub shows the README as it is, so its Python block is the example module typed out:
# tests/agentrun/test_readme_own_agent.py holds it to the module, verbatim.
PAGE_CHECKS = [
    (check, page)
    for page in TEXTS
    for check in CHECKS
    if (check, page.name) != (python_block_problems, "README.md")
]


@pytest.mark.parametrize(
    ("check", "page"),
    PAGE_CHECKS,
    ids=[f"{p.relative_to(ROOT)}-{c.__name__}" for c, p in PAGE_CHECKS],
)
def test_the_pages_name_only_what_exists(check, page):
    assert check(page.read_text()) == []


BROKEN = {
    python_block_problems: [
        "```python\nx = 1\ny = 2\n```",
        '```python\n--8<-- "bench/report.py"\n```',  # no test imports it
        '```python\n--8<-- "docs/snippets/nowhere.py"\n```',
    ],
    command_problems: [
        "```sh\n.venv/bin/python manage.py startrun scripted --no-such-flag\n```",
        "```sh\npython manage.py startrn scripted\n```",
        "`watch RUN_ID PATH --jsn`",
        "`manage.py purge --older 30d`",
    ],
    make_problems: ["```sh\nmake upp\n```", "`make PYTHON=python3.12 tests`"],
    setting_problems: ["`AGENTRUN_NO_SUCH_THING`", "set AGENTRUN_LEASE_SECS to 60"],
    path_problems: ["`bench/results/no-such-file.md`", "`docs/operations/nowhere.md`"],
}


@pytest.mark.parametrize(
    ("check", "page"),
    [(check, page) for check, pages in BROKEN.items() for page in pages],
    ids=lambda x: getattr(x, "__name__", None) or x[:40],
)
def test_each_check_finds_a_page_that_breaks_it(check, page):
    assert check(page) != []


def test_a_page_that_keeps_to_the_rules_passes_every_check():
    page = (
        '```python\n--8<-- "agentrun/examples/glossary.py"\n```\n\n```python\nprint(1)\n```\n\n'
        "```sh\nexport AGENTRUN_AGENT_MODULES=x  # comment: --not-a-flag\nmake up\n"
        '.venv/bin/python manage.py startrun llm --input \'{"goal": "--x"}\' --wait\n```\n\n'
        "`exportrun RUN_ID [-o FILE|-] [--with-ancestors]`, `make PYTHON=python3.12 test`, "
        "`bench/RESULTS.md#watch`, `AGENTRUN_LLM_API_KEY`"
    )
    assert [p for check in CHECKS for p in check(page)] == []


# --- the build ------------------------------------------------------------------------


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice, not a warning
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(
        [*command, "--site-dir", str(site)],
        cwd=ROOT,  # snippets are read from the repository's top
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    output = result.stdout + result.stderr
    return [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]


def test_the_site_builds_with_no_warning_and_loads_nothing_from_elsewhere(tmp_path):
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")

    assert result.returncode == 0, result.stdout + result.stderr
    assert warnings(result) == []
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) >= len(PAGES)
    assert (tmp_path / "site" / "img" / "run-page.png").exists()
    external = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//")
    assert [p.name for p in pages if external.search(p.read_text())] == []


def test_a_broken_link_fails_the_build(tmp_path):
    # The real configuration, on a copy of the pages one of which links to a missing page.
    shutil.copytree(DOCS, tmp_path / "docs")
    with open(tmp_path / "docs" / "index.md", "a") as page:
        page.write("\nSee [the missing page](operators/missing.md).\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))

    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert result.returncode != 0
    assert any("operators/missing.md" in w for w in warnings(result)), result.stderr


# --- the snippets the pages include, run -----------------------------------------------


def load_snippet(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_snippets_{name}", SNIPPETS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hybrid_tool(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    yield load_snippet("hybrid_tool.py")
    REGISTRY.pop("hold_seat", None)


@pytest.mark.django_db
def test_the_hybrid_tool_of_the_tools_page_is_undone_when_its_run_fails(hybrid_tool, tmp_path):
    from agentrun.lifecycle import services
    from tests.base import drive

    script = [
        {
            "thought": "Hold",
            "calls": [{"tool": "hold_seat", "args": {"flight": "AR1", "seat": "3C"}}],
        },
        {"thought": "Fail", "calls": [{"tool": "fail", "args": {"message": "no payment"}}]},
    ]
    run = drive(services.start_run("scripted", {"goal": "fly", "steps": script}))

    assert run.status == "failed"
    call = run.tool_calls.get(tool="hold_seat")
    assert (call.kind, call.status) == ("hybrid", "compensated"), call.compensation
    assert list((tmp_path / "holds").iterdir()) == []  # the seat is released


@pytest.mark.django_db
def test_the_hybrid_tool_holds_one_seat_per_key_and_refuses_a_blank_seat(hybrid_tool):
    from agentrun.tools import ToolContext, ToolError, get_tool

    tool = get_tool("hold_seat")
    ctx = ToolContext(run_id="r", step=1, call_index=0, idempotency_key="r:1:0:hold_seat:abc")
    first = tool(ctx, {"flight": "AR1", "seat": "3C"})
    assert tool(ctx, {"flight": "AR1", "seat": "3C"}) == first  # a retry: the same hold
    assert tool.compensate(ctx, {}, first) == {"released": True}
    assert tool.compensate(ctx, {}, first) == {"released": False}  # idempotent
    with pytest.raises(ToolError):
        tool(ctx, {"flight": "AR1", "seat": " "})
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_incident_regression_test_of_the_fleet_page_passes_on_the_fix(on_v1, monkeypatch):
    from tests.fleet.scenario import deploy_v2

    deploy_v2(monkeypatch)
    monkeypatch.chdir(ROOT)  # the page's paths are the repository's
    load_snippet("incident_regression_test.py").test_the_empty_order_incident_stays_fixed(None)


@pytest.mark.django_db
def test_the_incident_regression_test_of_the_fleet_page_fails_on_the_bug(on_v1, monkeypatch):
    monkeypatch.chdir(ROOT)
    snippet = load_snippet("incident_regression_test.py")
    with pytest.raises(AssertionError, match="still_failing"):
        snippet.test_the_empty_order_incident_stays_fixed(None)


def test_the_webhook_check_of_the_observability_page_takes_only_what_agentrun_signed():
    from agentrun.telemetry import webhooks

    verify = load_snippet("verify_webhook.py").verify
    body, now = b'{"event": "run_failed"}', str(int(time.time()))
    signed = {"X-Agentrun-Timestamp": now, "X-Agentrun-Signature": webhooks.sign(body, now, "s")}
    assert verify(body, signed, "s")
    assert not verify(body + b" ", signed, "s")
    assert not verify(body, signed, "another secret")
    old = str(int(time.time()) - 3600)
    stale = {"X-Agentrun-Timestamp": old, "X-Agentrun-Signature": webhooks.sign(body, old, "s")}
    assert not verify(body, stale, "s")


# Every file of docs/snippets/ is run by a test here: the one that says so.
SNIPPET_TESTS = {
    "hybrid_tool.py": test_the_hybrid_tool_of_the_tools_page_is_undone_when_its_run_fails,
    "incident_regression_test.py": (
        test_the_incident_regression_test_of_the_fleet_page_passes_on_the_fix
    ),
    "verify_webhook.py": test_the_webhook_check_of_the_observability_page_takes_only_what_agentrun_signed,
}


def test_every_snippet_file_has_a_test_that_runs_it():
    assert sorted(p.name for p in SNIPPETS.glob("*.py")) == sorted(SNIPPET_TESTS)
