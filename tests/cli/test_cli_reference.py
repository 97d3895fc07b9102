"""docs/cli.md is what scripts/cli_reference.py writes from today's ``--help``: a command,
an option or a help text changed without ``make docs`` fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from mnist2db.cli.app import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "scripts" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cli_reference"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered(reference: ModuleType) -> str:
    return str(reference.render())


def test_the_reference_is_fresh(rendered: str) -> None:
    on_disk = (ROOT / "docs" / "cli.md").read_text()
    assert on_disk == rendered, "docs/cli.md is stale: run make docs"


def test_the_reference_holds_every_command_and_drop_in(rendered: str) -> None:
    for name, (_, summary) in COMMANDS.items():
        assert f"\n## mnist2db {name}\n\n```text\nUsage: mnist2db {name} " in rendered
        assert f"| [`{name}`](#mnist2db-{name}) | {summary} |" in rendered
    for script in ("convert_mnist_data", "compute_image_mean", "convert_mnist_siamese_data"):
        assert f"\n### {script}\n\n```text\n{script}: " in rendered
    assert "_MNIST2DB_COMPLETE=bash_source mnist2db" in rendered


def test_check_fails_on_a_stale_page(
    reference: ModuleType, rendered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "cli.md"
    monkeypatch.setattr(reference, "OUT", page)
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    monkeypatch.setattr(reference, "render", lambda: rendered)
    assert reference.main([]) == 0 and page.read_text() == rendered
    assert reference.main(["--check"]) == 0
    page.write_text(rendered.replace("--backend", "--bakend", 1))
    assert reference.main(["--check"]) == 1
