"""make's installer: uv where it can be had, pip otherwise (docs/testing.md, "Install").

    python3 tools/venv_install.py venv VENV          create VENV, pip in it
    python3 tools/venv_install.py pip VENV ARGS...   `pip install ARGS` into VENV
    python3 tools/venv_install.py unpack VENV DIR PLATFORM PYVER SPEC...
                                    the files of SPEC's wheels for PLATFORM
                                    (manylinux_2_28_aarch64) under DIR, no dependencies

uv installs the same packages as pip in a tenth of the time (it unpacks wheels in
parallel and links them from its cache), and it does not compile bytecode: Python
writes it on first import (make's commands unset PYTHONDONTWRITEBYTECODE), so only
the modules in use are compiled. uv is `uv` on PATH, or fetched once into build/uv by
this Python's pip; INSTALLER=pip (or no uv to be had) keeps pip, which compiles
everything at install. uv reads no pip configuration, so the sources pip is
configured with (pip.conf, PIP_* variables: indexes, find-links, constraints) are
handed to it, and like pip it takes the newest match across all of them.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "build" / "uv"
# pip's configuration keys that name where packages come from, and uv's flags for them
SOURCE_FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
                "find-links": "--find-links", "constraint": "--constraint"}


def find_uv() -> str | None:
    if os.environ.get("INSTALLER", "uv") == "pip":
        return None
    found = shutil.which("uv")
    if found:
        return found
    local = BOOTSTRAP / "bin" / "uv"
    if not local.exists():
        print(f"fetching uv into {BOOTSTRAP.relative_to(ROOT)} (pip; once)", flush=True)
        fetched = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                                  "--disable-pip-version-check", "--no-deps", "--no-compile",
                                  "--target", str(BOOTSTRAP), "uv"],
                                 capture_output=True, text=True)
        if fetched.returncode != 0 or not local.exists():
            print("note: uv could not be installed; pip installs instead", flush=True)
            return None
    return str(local)


def pip_config() -> dict[str, str]:
    """pip's effective settings, key -> value: a PIP_* variable over an [install] entry
    over a [global] one, as pip applies them."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True)
    rank = {"global": 0, "install": 1, ":env:": 2}
    best: dict[str, tuple[int, str]] = {}
    for line in listed.stdout.splitlines() if listed.returncode == 0 else ():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in rank and (key not in best or rank[section] >= best[key][0]):
            best[key] = (rank[section], _literal(value))
    return {key: value for key, (_, value) in best.items()}


def _literal(value: str) -> str:
    try:  # pip prints each value as Python's repr
        return str(ast.literal_eval(value))
    except (ValueError, SyntaxError):
        return value


def uv_sources(config: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]  # pip's: newest across all indexes
    for key, flag in SOURCE_FLAGS.items():
        for value in config.get(key, "").split():
            args += [flag, value]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


def uv_env(config: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    if "cert" in config:
        env.setdefault("SSL_CERT_FILE", config["cert"])
    timeout = config.get("timeout") or config.get("default-timeout")
    if timeout:
        env.setdefault("UV_HTTP_TIMEOUT", timeout)
    return env


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    print(" ".join(command), flush=True)
    done = subprocess.run(command, env=env)
    if done.returncode != 0:
        sys.exit(done.returncode)


def unpack(uv: str | None, python: str, into: Path, platform: str, version: str,
           specs: list[str]) -> None:
    """Another platform's wheels as files (the native runners' libraries and headers).
    uv takes them from its cache; pip downloads them again and they are unzipped."""
    shutil.rmtree(into, ignore_errors=True)
    if uv is not None:
        config = pip_config()
        arch = next(a for a in ("x86_64", "aarch64") if platform.endswith(a))
        uv_platform = f"{arch}-{platform[:-len(arch) - 1]}"  # aarch64-manylinux_2_28
        run([uv, "pip", "install", "--quiet", *uv_sources(config), "--no-deps",
             "--only-binary", ":all:", "--python", python, "--python-platform", uv_platform,
             "--python-version", version, "--target", str(into), *specs], env=uv_env(config))
        return
    run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", version, "--platform", platform, "-d", str(into / "dl"), *specs])
    for wheel in sorted((into / "dl").glob("*.whl")):
        run([python, "-m", "zipfile", "-e", str(wheel), str(into)])
    shutil.rmtree(into / "dl")


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("venv", "pip", "unpack"):
        sys.exit(__doc__)
    action, venv, args = argv[0], Path(argv[1]), argv[2:]
    python = str(venv / "bin" / "python")
    uv = find_uv()
    if action == "unpack":
        unpack(uv, python, Path(args[0]), args[1], args[2], args[3:])
        return
    if uv is None:
        if action == "venv":
            run([sys.executable, "-m", "venv", str(venv)])
            run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        else:
            run([python, "-m", "pip", "install", *args])
        return
    config = pip_config()
    install = [uv, "pip", "install", "--python", python, *uv_sources(config)]
    if action == "venv":
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        args = ["--quiet", "pip"]  # the tests, install.sh and native-deps use the venv's pip
    run([*install, *args], env=uv_env(config))


if __name__ == "__main__":
    main(sys.argv[1:])
