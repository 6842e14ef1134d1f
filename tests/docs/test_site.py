"""The documentation site builds in strict mode (``make docs``): a broken link, a missing
anchor or a page left out of ``mkdocs.yml``'s nav fails ``make test``.

Both tests run mkdocs as a separate process, as ``make docs`` does, into ``tmp_path``.
The second one breaks a copy of the docs on purpose, so a configuration that stopped
checking anchors or links would fail here instead of passing silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: A build takes 1-3 s; a busy 2-core machine may take several times that.
BUILD_TIMEOUT_S = 120


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False,
    )


def nav_pages(nav: object) -> list[str]:
    """Every page named in mkdocs.yml's nav, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = nav_pages(config["nav"])
    for page in pages:
        html = page.removesuffix(".md")
        html = "index.html" if html == "index" else html.removesuffix("/index") + "/index.html"
        assert (tmp_path / "site" / html).is_file(), f"{page} was not built"
    # every Markdown file under docs/ is a page of the nav (strict mode also says so)
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk <= set(pages), f"not in mkdocs.yml's nav: {sorted(on_disk - set(pages))}"


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    broken = {
        "getting-started/operator.md": "[gone](../operations.md#no-such-section)",
        "concepts/index.md": "[gone](../no-such-page.md)",
    }
    for page, link in broken.items():
        target = tmp_path / "docs" / page
        target.write_text(target.read_text(encoding="utf-8") + f"\n{link}\n", encoding="utf-8")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    out = done.stdout + done.stderr
    assert done.returncode != 0, "a broken link or anchor did not fail the build"
    assert "does not contain an anchor '#no-such-section'" in out, out
    assert "'no-such-page.md' is not found" in out, out
