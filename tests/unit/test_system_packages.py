"""`make test` on a machine without the Debian packages it needs: one line naming them and the command.

Run as an unprivileged user (``nobody``, through ``su`` when the tests run as root) with a PATH that
holds ``ls`` only: the script finds none of chromium, docker-compose or redis-server, and cannot install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_missing_packages_stop_at_once_with_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ls").symlink_to(shutil.which("ls") or "/bin/ls")
    tmp_path.chmod(0o755)
    script = ROOT / ".ci" / "system-packages"
    command = f"PATH={bin_dir} /bin/bash {script}"
    if os.geteuid() == 0:
        if shutil.which("su") is None:
            pytest.skip("no su to drop root")
        argv = ["su", "nobody", "-s", "/bin/bash", "-c", command]
    else:
        argv = ["/bin/bash", "-c", command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "chromium docker-compose redis-server" in lines[0]
    assert "apt-get install -y --no-install-recommends" in lines[0]


def test_ci_runs_exactly_make_test() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert commands[-1] == "exec make test"
    makefile = (ROOT / "Makefile").read_text()
    assert "test: system-packages lint bytecode" in makefile
