"""The README and docs/ cannot drift from the code: every command their shell blocks show names a nox
session or a module that exists and only options the code defines, every repository file a command
names exists, every page is linked from the README, and every relative link resolves."""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCES = ("noxfile.py", "bench", "infer", "lab", "ops", "opspec", "ort_plugin")
# Other tools' commands (a user's shell, Docker, the OS): only the repository files they name are checked.
OTHER_TOOLS = {"docker", "sha256sum", "gunzip", "git", "apt-get", "cd", "export", "tar", "cp", "mkdir", "ssh", "sudo",
               "echo", "cat", "ls", "sh", "bash", "cmake", "ctest", "uname", "nvidia-smi"}
SOURCE_DIRS = {"requirements", "tests", "kernels", "ops", "bench", "lab", "infer", "ort_plugin", "opspec", "docker",
               "docs", "matrix.yaml", "noxfile.py"}
OPERATORS = {"&&", "||", "|", ";"}


def shell_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command line) of the page's ```bash and ```sh blocks, continuations joined."""
    found, inside, pending, start = [], False, "", 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside and line.strip() in ("```bash", "```sh")
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full, pending = pending + line, ""
        if full.strip() and not full.strip().startswith("#"):
            found.append((start, full))
    return found


def inline_commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of the page's inline code that is a lab command (`nox ...`, `python -m ...`)."""
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        found += [(number, span) for span in re.findall(r"`([^`]+)`", line)
                  if re.match(r"(nox -[sl]|python3? -m )", span)]
    return found


def commands(line: str) -> list[list[str]]:
    """The simple commands of a line: tokens split at &&, ||, | and ;, leading VAR=value dropped."""
    tokens = shlex.split(line, comments=True)
    out, current = [], []
    for token in tokens + [";"]:
        if token in OPERATORS:
            while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", current[0]):
                current.pop(0)
            if current:
                out.append(current)
            current = []
        else:
            current.append(token)
    return out


def nox_sessions() -> set[str]:
    names = set()
    for node in ast.walk(ast.parse((REPO / "noxfile.py").read_text())):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                target = call.func if call else decorator
                if ast.unparse(target) == "nox.session":
                    named = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                    names.add(named[0] if named else node.name)
    return names


def defined_options() -> set[str]:
    """Every string literal starting with -- in the lab's Python: the options its parsers and sessions define."""
    found = set()
    for top in SOURCES:
        for path in [REPO / top] if top.endswith(".py") else sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
                    found.add(node.value.split("=")[0])
    return found


def module_exists(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file() or \
        ((path / "__init__.py").is_file() and name in ("nox",))


def problems_of(tokens: list[str], sessions: set[str], options: set[str], scaffolded: set[str] = frozenset()) -> list[str]:
    program = Path(tokens[0]).name
    problems = []
    options_passed = [t.split("=")[0] for t in tokens[1:] if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", t)]
    if program == "nox":
        if "-s" in tokens:
            session = tokens[tokens.index("-s") + 1]
            if session not in sessions and not re.fullmatch(r"<\w+>|[A-Z_]+", session):  # <session>: a placeholder
                problems.append(f"no nox session {session!r}")
        elif not {"-l", "--list"} & set(tokens):
            problems.append("a nox command names no session (-s)")
        after = tokens[tokens.index("--") + 1:] if "--" in tokens else []
        problems += [f"option {o} is defined nowhere" for o in options_passed if o in after and o not in options]
    elif re.fullmatch(r"python3?(\.\d+)?", program):
        if "-m" in tokens:
            module = tokens[tokens.index("-m") + 1]
            if module not in ("venv", "pip", "pytest") and not module_exists(module):
                problems.append(f"no module {module!r} in the repository")
            if module not in ("venv", "pip"):
                problems += [f"option {o} is defined nowhere" for o in options_passed
                             if o not in options and module != "pytest"]
    elif program == "pip":
        pass
    elif program not in OTHER_TOOLS:
        problems.append(f"{program!r} is no command this check knows: add a rule to tests/test_docs.py")
    for token in tokens[1:]:
        first = token.split("/")[0]
        made = any(name in token for name in scaffolded)  # written by the page's own `nox -s new_op -- NAME`
        if first in SOURCE_DIRS and not made and "<" not in token and not any(c in token for c in "*$"):
            if not (REPO / token).exists():
                problems.append(f"{token} does not exist")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_matches_the_code(page):
    sessions, options = nox_sessions(), defined_options()
    lines = shell_lines(page) + inline_commands(page)
    scaffolded = {tokens[tokens.index("--") + 1] for _, line in lines for tokens in commands(line)
                  if tokens[:3] == ["nox", "-s", "new_op"] and "--" in tokens}
    problems = []
    for number, line in lines:
        for tokens in commands(line):
            problems += [f"{page.relative_to(REPO)}:{number}: {line.strip()}: {p}"
                         for p in problems_of(tokens, sessions, options, scaffolded)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_drift():
    sessions, options = nox_sessions(), defined_options()
    assert "bench" in sessions and "tests" in sessions and "--out" in options
    assert problems_of(["nox", "-s", "benchmark"], sessions, options) == ["no nox session 'benchmark'"]
    assert problems_of(["nox", "-s", "bench", "--", "--no-such-option"], sessions, options) == \
        ["option --no-such-option is defined nowhere"]
    assert problems_of(["python", "-m", "bench.gpu_checks"], sessions, options) == \
        ["no module 'bench.gpu_checks' in the repository"]
    assert problems_of(["pip", "install", "-r", "requirements/missing.txt"], sessions, options) == \
        ["requirements/missing.txt does not exist"]
    assert commands("A=1 nox -s bench && docker load < x.tar # note") == [["nox", "-s", "bench"], ["docker", "load", "<",
                                                                                                     "x.tar"]]


def test_every_page_is_linked_from_the_readme_and_every_link_resolves():
    readme = (REPO / "README.md").read_text()
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"pages the README does not link: {missing}"
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "\n".join(broken)


def test_the_readme_lists_the_files_each_scaffold_kind_writes():
    """The README's table of `nox -s new_op` kinds names exactly the files of each kind's templates."""
    from lab import new_op

    rows = {}
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        kind = re.match(r"`(\w+)`", cells[0]) if len(cells) == 3 else None
        if kind and kind.group(1) in new_op.KINDS:
            rows[kind.group(1)] = set(re.findall(r"`([^`]+)`", cells[2]))
    assert set(rows) == set(new_op.KINDS), f"README rows for {sorted(rows)}; kinds {new_op.KINDS}"
    for kind, listed in rows.items():
        templates = REPO / "lab" / "new_op_templates" / kind
        written = {str(p.relative_to(templates)).removesuffix(".tmpl").replace("NAME", "<op>")
                   for p in templates.rglob("*.tmpl")}
        assert listed == written, f"{kind}: README lists {sorted(listed - written)} that it does not write, " \
                                  f"and leaves out {sorted(written - listed)}"
