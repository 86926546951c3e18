"""The set-up files agree (pyproject vs environment.yml, README's test command vs .ci/run), and the
README stays a short user's guide whose every named path exists."""
import pathlib
import re
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["course"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {p for p in pip if not p.startswith("-e")}
    assert {_name(p) for p in listed} == {_name(p) for p in wanted}
    assert listed == wanted, "same packages but different version bounds"


def _readme_commands():
    """The README's `python -m pip install ...` commands, a line ending in `&&` or `\\` joined with
    the next (so a long command can wrap under the 120-character bar)."""
    text = re.sub(r"(&&|\\)\n\s*", lambda m: "&& " if m.group(1) == "&&" else "", (ROOT / "README.md").read_text())
    return re.findall(r"^\s*(python -m pip install .+)$", text, flags=re.M)


def test_ci_runs_exactly_the_readme_test_command():
    commands = [c for c in _readme_commands() if "pytest" in c]
    assert len(commands) == 1, commands
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == [commands[0].strip()]


def test_readme_has_the_two_setup_commands():
    commands = _readme_commands()
    assert any("jupyter lab" in c for c in commands) and any("pytest" in c for c in commands)
    assert all("-c constraints-cpu.txt" in c for c in commands)


def test_readme_opens_jupyterlab_at_the_repository_root(monkeypatch):
    """Lessons send learners to exercises/: JupyterLab must serve the repository's root. A bare
    folder or file argument (`jupyter lab lessons/`) makes lessons/ the root instead."""
    import shlex

    from jupyter_server.serverapp import ServerApp

    command = next(c for c in _readme_commands() if "jupyter lab" in c)
    monkeypatch.chdir(ROOT)
    app = ServerApp()
    try:
        app.parse_command_line(shlex.split(command.split("jupyter lab", 1)[1]))
        assert pathlib.Path(app.root_dir) == ROOT
        assert app.file_to_run and pathlib.Path(app.file_to_run).is_file()
    finally:
        ServerApp.clear_instance()


def test_readme_is_short_with_short_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; measurements go to benchmarks/README.md"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README.md lines over 120 characters (line, length): {long}"


def test_benchmarks_top_level_holds_at_most_six_scripts():
    """Supported entry points only; one-off probes live in benchmarks/probes/."""
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                     if p.is_file() and p.suffix in (".py", ".sh"))
    assert len(scripts) <= 6, scripts


# A relative path with at least one slash and a file extension, e.g. `lessons/00_gpu_primer.ipynb`,
# `h100/forward_float16.json` (result files are named relative to benchmarks/results/), or a glob
# such as `h100/fa2_fa3_forward_probe_*.log`. Placeholders (`<gpu>`) and URLs are left out.
_PATH = re.compile(r"(?<![\w/.:<>*-])((?:[\w.*-]+/)+[\w*-][\w.*-]*\.[A-Za-z][A-Za-z0-9]*)(?![\w/])")


def _missing_paths(doc):
    text = (ROOT / doc).read_text()
    bases = (ROOT, ROOT / "benchmarks" / "results")
    return sorted({p for p in _PATH.findall(text)
                   if not any(list(base.glob(p)) for base in bases)})


def test_every_path_the_readme_names_exists():
    assert _missing_paths("README.md") == []


def test_every_path_the_benchmark_notes_name_exists():
    assert _missing_paths("benchmarks/README.md") == []


def test_readme_lists_every_lesson_and_exercise():
    """The README's lessons table names every lesson's number and every exercise in solutions/."""
    text = (ROOT / "README.md").read_text()
    lessons = sorted(p.name[:2] for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
    exercises = sorted(p.stem for p in (ROOT / "solutions").glob("ex*.py"))
    assert [n for n in lessons if f"| {n} |" not in text] == []
    assert [e for e in exercises if f"`{e}`" not in text] == []
