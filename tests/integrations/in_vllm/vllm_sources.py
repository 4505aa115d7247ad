"""vLLM 0.14.0's own test files, from its source distribution on the package registry.

vLLM's wheels do not ship its tests; its sdist does. :func:`vllm_tests`
downloads the sdist with pip (once, into a cache folder git ignores),
checks its SHA-256 and unpacks its ``tests/`` folder there. vLLM's code is
never part of this repository.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.14.0"
#: SHA-256 of vllm-0.14.0.tar.gz as published (checked after every download).
SDIST_SHA256 = "ed86c6a9d22fbfd059648794493cad88444c71688f3ff6efcb26c5ca353f0e5d"
REPO = Path(__file__).resolve().parents[3]
#: Where the sdist and its tests go: KVCORE_VLLM_SOURCES, else .cache/ in the repository.
CACHE = Path(os.environ.get("KVCORE_VLLM_SOURCES", REPO / ".cache" / "vllm-sources"))


def _download(folder: Path) -> Path:
    sdist = folder / f"vllm-{VERSION}.tar.gz"
    if not sdist.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        # pip prepares the sdist's metadata before saving it: vLLM's setup.py
        # needs a target device ("empty": no build) and, to report exactly
        # the version asked for, the override.
        env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": VERSION}
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--no-binary", ":all:", "--no-build-isolation", "-d", str(folder)]
        subprocess.run([*command, f"vllm=={VERSION}"], check=True, env=env)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sdist.unlink()
        msg = f"{sdist.name} has SHA-256 {digest}, not the published {SDIST_SHA256}; removed"
        raise RuntimeError(msg)
    return sdist


def vllm_tests() -> Path:
    """The folder holding vLLM 0.14.0's ``tests/`` package (downloaded on first use).

    Raises:
        subprocess.CalledProcessError: pip could not download the sdist.
        RuntimeError: the download is not the published file.
    """
    root = CACHE / f"vllm-{VERSION}-tests"
    if (root / "tests" / "v1" / "core" / "test_scheduler.py").is_file():
        return root
    sdist = _download(CACHE)
    prefix = f"vllm-{VERSION}/"
    partial = root.with_name(root.name + ".partial")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix + "tests/")]
        for member in members:
            member.name = member.name.removeprefix(prefix)
        archive.extractall(partial, members=members, filter="data")
    # Its own (empty) pytest configuration: kvcore's pyproject.toml, found by
    # walking up from the cache folder, must not apply to vLLM's tests.
    (partial / "pytest.ini").write_text("[pytest]\n")
    partial.rename(root)
    return root
