"""The set-up files agree: pyproject vs environment.yml, README's test command vs .ci/run."""
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
    text = (ROOT / "README.md").read_text()
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
