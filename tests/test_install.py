"""The package installs where its users already are: its metadata states ranges that admit
Python 3.10-3.13 and the user's torch; pip, asked for it beside a user's torch, FBGEMM and
faiss, proposes none of them again; the built wheel runs from site-packages (on every Python
from 3.10 found here) and writes nothing into it.

The wheel is built once (`pip wheel --no-deps`, from a copy of the sources: nothing is built
in the checkout). Fresh venvs under tmp; the stub distributions are tiny wheels made here.
Only the dry run asks the package index (metadata, no downloads) and skips where it cannot.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging", reason="the metadata checks read versions with `packaging`")
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "embcache", "cpu_kernels")
# whatever an index or network failure looks like in pip's output: the dry run then skips
UNREACHABLE = ("NewConnectionError", "Network is unreachable", "Temporary failure in name resolution",
               "Max retries exceeded", "ConnectTimeout", "ReadTimeout", "Connection refused")


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def run(cmd: list, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    return done


def checked(cmd: list, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    done = run(cmd, timeout, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def venv(python: str | Path, where: Path) -> Path:
    """A fresh venv (with pip) made by `python`; its interpreter."""
    checked([python, "-m", "venv", where], timeout=180)
    return where / "bin" / "python"


def stub_wheel(out: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A tiny wheel of distribution `name`: metadata, one module, a RECORD with hashes."""
    dist = canonicalize_name(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f"__version__ = {version!r}  # a stub made by tests/test_install.py\n",
        f"{info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                     *(f"Requires-Dist: {r}\n" for r in requires)]),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(text.encode())])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue()
    path = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, text in files.items():
            zf.writestr(name_in_zip, text)
    return path


def other_pythons() -> list[str]:
    """Interpreters 3.10-3.13 other than this one: on PATH, or pyenv's versions beside it."""
    found = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in (10, 11, 12, 13):
        if minor == sys.version_info.minor:
            continue
        candidates = [shutil.which(f"python3.{minor}"), *sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}"))]
        for exe in filter(None, candidates):
            ok = run([exe, "-c", "import sys, venv; print(sys.version_info[1])"], timeout=30)
            if ok.returncode == 0 and ok.stdout.strip() == str(minor):
                found[minor] = str(exe)
                break
    return [found[m] for m in sorted(found)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of its sources (no build/ or egg-info here)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    try:  # offline where this environment can build it (setuptools with bdist_wheel), else isolated
        from importlib.metadata import version

        local = Version(version("setuptools")) >= Version("70.1")
    except Exception:
        local = False
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, src]
    done = run(cmd[:4] + ["--no-build-isolation"] + cmd[4:] if local else cmd, timeout=300)
    if done.returncode != 0 and not local and any(s in done.stdout + done.stderr for s in UNREACHABLE):
        pytest.skip("building the wheel needs setuptools from the package index, which is unreachable")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("embcache-*.whl")
    return built


# ------------------------------------------------------------------------------ the metadata
def test_metadata_admits_python_3_10_to_3_13_and_any_current_torch():
    project = pyproject()["project"]
    python = SpecifierSet(project["requires-python"])
    for v in ("3.10.0", "3.11.7", "3.12.1", "3.13.0", "3.14.0"):
        assert python.contains(v), f"requires-python {python} refuses {v}"
    base = [Requirement(r) for r in project["dependencies"]]
    torch = next(r for r in base if r.name == "torch")
    for v in ("2.11.0+cu128", "2.13.0+cpu", "2.14.1"):
        assert torch.specifier.contains(v, prereleases=True), f"torch {torch.specifier} refuses {v}"


def test_metadata_states_ranges_and_leaves_the_builds_to_the_user():
    """No exact pin or cap anywhere; no FBGEMM, faiss or torchrec in the base; the faiss
    extras never put two builds of `faiss` together."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    groups = {"base": project["dependencies"], **extras}
    for group, reqs in groups.items():
        for r in map(Requirement, reqs):
            ops = {s.operator for s in r.specifier}
            assert not ops & {"==", "===", "~=", "<", "<=", "!="}, f"{group}: {r} pins or caps"
    names = {group: {canonicalize_name(Requirement(r).name) for r in reqs} for group, reqs in groups.items()}
    assert not {n for n in names["base"] if n.startswith(("fbgemm", "faiss", "torchrec"))}, names["base"]
    for group, found in names.items():
        assert len({n for n in found if n.startswith("faiss")}) <= 1, f"{group}: two builds of faiss"
        assert len({n for n in found if n.startswith("fbgemm")}) <= 1, f"{group}: two builds of fbgemm"
    assert "faiss-cpu" not in names["gpu"] and "faiss-cpu" in names["faiss"]
    assert "torchrec" in names["torchrec"] and not {n for n in names["torchrec"] if n.startswith("fbgemm")}
    assert "fbgemm-gpu-cpu" in names["torchrec-cpu"] and "torchrec" not in names["torchrec-cpu"]
    assert {"onnx", "onnxscript", "onnxruntime"} <= names["onnx"]
    assert {"pytest", "hypothesis", "onnx", "onnxscript", "onnxruntime"} <= names["test"]


def test_the_constraints_pin_what_the_metadata_admits():
    """constraints/cpu.txt (this project's machines) pins every one of them exactly, each pin
    inside the metadata's range: the Makefile's install resolves without conflict."""
    project = pyproject()["project"]
    pins = {}
    for line in (ROOT / "constraints" / "cpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            r = Requirement(line)
            assert [s.operator for s in r.specifier] == ["=="], f"constraints/cpu.txt: {line} is not an exact pin"
            pins[canonicalize_name(r.name)] = next(iter(r.specifier)).version
    assert pins["torch"] == "2.13.0" and pins["fbgemm-gpu-cpu"] == "1.8.0" and pins["torchrec"] == "1.8.0"
    reqs = project["dependencies"] + [r for group in ("test", "faiss", "torchrec-cpu", "torchrec")
                                      for r in project["optional-dependencies"][group]]
    for r in map(Requirement, reqs):
        name = canonicalize_name(r.name)
        assert name in pins, f"constraints/cpu.txt has no pin for {name}"
        assert r.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {r}"


# ------------------------------------------------------------------ where files are written
def test_a_checkout_keeps_its_own_folders_and_embcache_home_moves_them(monkeypatch, tmp_path):
    from embcache import paths

    monkeypatch.delenv("EMBCACHE_HOME", raising=False)
    assert paths.source_root() == ROOT
    assert (paths.datasets_dir(), paths.results_dir()) == (ROOT / "datasets", ROOT / "bench" / "results")
    monkeypatch.setenv("EMBCACHE_HOME", str(tmp_path))
    assert (paths.datasets_dir(), paths.results_dir()) == (tmp_path / "datasets", tmp_path / "bench" / "results")
    monkeypatch.setenv("EMBCACHE_HOME", "")  # empty is unset
    assert paths.datasets_dir() == ROOT / "datasets"


def test_every_default_folder_comes_from_embcache_paths():
    """No module but embcache/paths.py finds its folders from its own file's location."""
    offenders = [str(p.relative_to(ROOT)) for package in ("embcache", "cpu_kernels")
                 for p in sorted((ROOT / package).rglob("*.py"))
                 if "__file__" in p.read_text() and p != ROOT / "embcache" / "paths.py"]
    assert not offenders, offenders


# ----------------------------------------------------------------------------- the wheel
def test_the_wheel_holds_every_module_of_the_checkout_and_no_other(wheel):
    """Each package module of the sources, byte for byte, and nothing else (a wheel built over
    a stale build/ folder carries modules moved away since: `make wheel` builds from a clean one)."""
    import zipfile

    inside = zipfile.ZipFile(wheel)
    modules = {n for n in inside.namelist() if n.endswith(".py")}
    here = {p.relative_to(ROOT).as_posix() for package in ("embcache", "cpu_kernels")
            for p in (ROOT / package).rglob("*.py")}
    assert modules == here
    assert all(inside.read(n) == (ROOT / n).read_bytes() for n in modules)


@pytest.mark.parametrize("python", [sys.executable, *other_pythons()],
                         ids=lambda p: "this-python" if p == sys.executable else Path(p).name)
def test_the_wheel_installs_without_deps_and_runs_from_site_packages(wheel, python, tmp_path):
    """`pip install --no-deps` of the wheel into a fresh venv: it imports, `embcache --help`
    runs, every module compiles on that Python, the wheel holds only the two packages, and an
    installed package puts data and results outside site-packages."""
    py = venv(python, tmp_path / "venv")
    checked([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheel], timeout=180)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("EMBCACHE_HOME", "XDG_CACHE_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)
    code = ("import json, sysconfig, embcache, embcache.paths as p; "
            "print(json.dumps([embcache.__version__, str(p.source_root()), str(p.datasets_dir()), "
            "str(p.results_dir()), sysconfig.get_paths()['purelib']]))")
    version, root, datasets, results, site = json.loads(checked([py, "-c", code], cwd=work, env=env).stdout)
    assert version == wheel.name.split("-")[1]
    assert root == "None"
    assert Path(datasets) == home / ".cache" / "embcache" / "datasets"
    assert Path(results) == work / "bench" / "results"
    with_home = {**env, "EMBCACHE_HOME": str(tmp_path / "eh")}
    _, _, datasets, results, _ = json.loads(checked([py, "-c", code], cwd=work, env=with_home).stdout)
    assert (Path(datasets), Path(results)) == (tmp_path / "eh" / "datasets", tmp_path / "eh" / "bench" / "results")
    helped = checked([py.parent / "embcache", "--help"], cwd=work, env=env)
    assert "dlrm" in helped.stdout and "bench" in helped.stdout
    checked([py, "-m", "compileall", "-q", Path(site) / "embcache", Path(site) / "cpu_kernels"], timeout=300)
    top = {Path(n).parts[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert top == {"embcache", "cpu_kernels", wheel.name.split("-py3")[0] + ".dist-info"}, top


# --------------------------------------------------------------------------- the dry run
def test_a_dry_run_beside_a_users_torch_proposes_no_torch_fbgemm_or_faiss(wheel, tmp_path):
    """A user's CUDA environment, as stubs: torch 2.11 (a CUDA build's version), fbgemm-gpu
    (the CUDA FBGEMM) and faiss-gpu-cu12. `pip install --dry-run` of `embcache[torchrec,gpu]`
    beside them proposes torchrec and the base's dependencies, but no torch, no fbgemm and no
    faiss (it would, were any pinned, or were fbgemm-gpu-cpu or faiss-cpu asked for)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    user = [("torch", "2.11.0+cu128"), ("fbgemm-gpu", "1.6.0"), ("faiss-gpu-cu12", "1.11.0")]
    py = venv(sys.executable, tmp_path / "venv")
    checked([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
             *(stub_wheel(stubs, n, v) for n, v in user)], timeout=120)
    report = tmp_path / "report.json"
    done = run([py, "-m", "pip", "install", "--dry-run", "--quiet", "--retries", "1", "--timeout", "30",
                "--report", report, f"{wheel}[torchrec,gpu]"], timeout=240)
    said = done.stdout + done.stderr
    if done.returncode != 0 and any(s in said for s in UNREACHABLE):
        pytest.skip(f"the package index is unreachable: {said.strip().splitlines()[-1][:200]}")
    assert done.returncode == 0, said[-3000:]
    proposed = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert "embcache" in proposed and "torchrec" in proposed and "numpy" in proposed, proposed
    clobbered = {n: v for n, v in proposed.items() if n == "torch" or n.startswith(("fbgemm", "faiss"))}
    assert not clobbered, f"pip would install {clobbered} over the user's {dict(user)}"
