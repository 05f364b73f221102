"""The GitHub workflows parse, run the make targets, and have what GitHub Pages needs."""

from pathlib import Path

import yaml

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as the boolean True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def commands(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def actions(job: dict) -> list[str]:
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


def test_every_workflow_parses():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["book.yml", "test.yml"]
    for path in files:
        workflow = yaml.safe_load(path.read_text())
        assert workflow["jobs"], path


def test_test_workflow_runs_make_test_on_push_and_pull_request_and_every_week():
    workflow = load("test.yml")
    assert {"push", "pull_request", "schedule"} <= set(workflow["on"])
    # a cron line of five fields whose day of the week is one day: once a week
    (schedule,) = workflow["on"]["schedule"]
    minute, hour, day, month, weekday = schedule["cron"].split()
    assert (day, month) == ("*", "*") and weekday.isdigit() and minute.isdigit() and hour.isdigit()
    assert any(cmd.strip() == "make test" for cmd in commands(workflow["jobs"]["test"]))


def test_book_workflow_builds_with_make_and_deploys_to_pages():
    workflow = load("book.yml")
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    assert any(cmd.startswith("make book") for cmd in commands(build))
    assert "actions/upload-pages-artifact" in actions(build)
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert actions(deploy) == ["actions/deploy-pages"]


def test_book_workflow_caches_notebooks_keyed_on_chapters_package_and_requirements():
    build = load("book.yml")["jobs"]["build"]
    cache = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/cache"))
    key = cache["with"]["key"]
    for part in ("chapters/**", "transformer/**", "data/**", "requirements.txt", "pyproject.toml"):
        assert part in key
    assert cache["with"]["path"] == "_build/.jupyter_cache"
    assert "restore-keys" not in cache["with"]  # a partial match could publish stale outputs


def test_book_workflow_builds_the_repository_buttons():
    build = load("book.yml")["jobs"]["build"]
    make = next(cmd for cmd in commands(build) if cmd.startswith("make book"))
    assert "REPOSITORY_URL=https://github.com/${{ github.repository }}" in make
    assert "BOOK_EXECUTION=cache" in make


def test_the_repository_tracks_no_symbolic_link():
    # A link committed by mistake (a fetched folder linked into a worktree) breaks every other clone:
    # set-up then writes through it. The ignored folders of set-up are ignored as links too.
    import subprocess

    listing = subprocess.run(["git", "ls-files", "-s"], cwd=WORKFLOWS.parent.parent, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in listing.splitlines() if line.startswith("120000 ")]
    assert links == [], f"symbolic links in the repository: {links}"
