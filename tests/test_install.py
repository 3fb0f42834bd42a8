"""Installing from this repository alone, as the docs say.

No package index serves gpu-exporter, so no doc, no message of the exporter and no
manifest may tell a user to ``pip install gpu-exporter``: every install names the
checkout (``'.[top]'``) or a wheel built from it. The wheel and sdist are built with the
command docs/deploy.md gives, from a copy of the checkout's files, and a fresh virtual
environment installs the wheel with the ``top`` and ``otlp`` extras. The exporter's
version, the chart's appVersion (the image tag it deploys), the image's version label and
the kustomize tag are one number, and the registry commands of docs/deploy.md are run as
far as this machine allows: the version read the documented way, the chart packaged by
Helm's own code (helm-python-sdk), and the packaged chart rendered to the image that the
documented ``docker build -t`` names.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_MD = ROOT / "docs" / "deploy.md"
CHART = ROOT / "helm" / "gpu-exporter"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
# What users read or run: the docs, the manifests, the image, and the exporter's own words.
SHIPPED = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "deploy").rglob("*.y*ml")), *sorted(CHART.rglob("*")),
           *sorted((ROOT / "systemd").glob("*")), *sorted((ROOT / "exporter").rglob("*.py"))]
NOT_FOUND = ("Could not fetch", "NewConnectionError", "Temporary failure in name resolution",
             "Network is unreachable", "No matching distribution found")


def shipped_text() -> dict[Path, str]:
    return {p: p.read_text() for p in SHIPPED if p.is_file()}


def test_no_doc_or_message_names_an_index_that_does_not_serve_us() -> None:
    from_index = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?gpu[-_]exporter\b|"
                            r"\bgpu[-_]exporter\[\w")
    found = [(p.relative_to(ROOT), m.group(0)) for p, text in shipped_text().items()
             for m in from_index.finditer(text)]
    assert found == []
    # the check reads what it should: an index install in a doc would be caught
    assert from_index.search("pip install 'gpu-exporter[top]'")
    assert from_index.search("pip install -q gpu_exporter")


def test_every_documented_extra_exists() -> None:
    """Each ``'.[a,b]'`` or ``.whl[a,b]`` a doc or message names is an extra of
    pyproject.toml, and the docs name the two the issue of installing was about."""
    named: set[str] = set()
    for text in shipped_text().values():
        for extras in re.findall(r"(?:['\"]\.|\.whl)\[([\w,]+)\]", text):
            named |= set(extras.split(","))
    assert named and named <= EXTRAS
    assert {"top", "otlp", "amd"} <= named


def test_the_exporter_says_how_to_install_what_it_misses() -> None:
    """The one-line errors of `top` and `--otlp.endpoint` without their extra name the
    checkout install, the one a user of this repository can follow."""
    advice = [m for p, text in shipped_text().items() if p.suffix == ".py"
              for m in re.findall(r"pip install '\.\[(\w+)\]'", text)]
    assert {"top", "otlp"} <= set(advice) <= EXTRAS


def test_the_version_is_one_number() -> None:
    """pyproject's version is the chart's appVersion (the image tag it deploys), the
    Dockerfile's version label, the kustomize tag and the wheel the docs install."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.M) == [VERSION]
    kustomization = yaml.safe_load((ROOT / "deploy/kubernetes/kustomization.yaml").read_text())
    assert [i["newTag"] for i in kustomization["images"]] == [VERSION]
    wheels = set(re.findall(r"gpu_exporter-([\d.]+)-py3-none-any\.whl", DEPLOY_MD.read_text()))
    assert wheels == {VERSION}


def documented_block(marker: str) -> list[str]:
    """The lines of the docs/deploy.md sh block that contains ``marker``."""
    blocks = re.findall(r"```sh\n(.*?)```", DEPLOY_MD.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block.replace("\\\n", " ").splitlines()


@pytest.mark.slow
def test_the_registry_commands_push_the_tag_the_packaged_chart_deploys(tmp_path: Path) -> None:
    from helm_python.chart import Chart, package

    lines = documented_block("helm push")
    env = {"PATH": os.environ["PATH"]}
    for line in lines:
        m = re.match(r"(\w+)=(.*?)(?:\s+#.*)?$", line)
        if m:  # REGISTRY=..., VERSION=$(sed ...), CHART=$(sed ...): as the shell runs them
            out = subprocess.run(["bash", "-c", f"{line}\necho \"${m.group(1)}\""], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=30, check=True)
            env[m.group(1)] = out.stdout.strip()
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert env["VERSION"] == chart_meta["appVersion"] == VERSION
    assert env["CHART"] == chart_meta["version"]

    def expand(word: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: env[m.group(1)], word.strip('"'))

    (build,) = [line.split() for line in lines if line.startswith("docker build")]
    tag = expand(build[build.index("-t") + 1])
    assert [expand(w) for line in lines if line.startswith("docker push")
            for w in line.split()[2:3]] == [tag]
    (pack,) = [line.split() for line in lines if line.startswith("helm package")]
    dest = tmp_path / pack[pack.index("--destination") + 1]
    dest.mkdir()
    archive = Path(package(ROOT / pack[2], destination=dest))
    (push,) = [line.split() for line in lines if line.startswith("helm push")]
    assert archive == tmp_path / expand(push[2])
    (install,) = [line for line in lines if line.startswith("helm install")]
    repository = expand(re.search(r"image\.repository=(\S+)", install).group(1))  # type: ignore[union-attr]
    with Chart.load_archive(archive.read_bytes()) as chart:
        assert chart.metadata["version"] == expand(re.search(  # type: ignore[union-attr]
            r"--version (\S+)", install).group(1))
        out = chart.render(values={"image": {"repository": repository}}, name="gpu-exporter",
                           namespace="gpu-exporter", is_install=True)
    daemonset = yaml.safe_load(out["gpu-exporter/templates/daemonset.yaml"])
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == tag
    # helm package --app-version X: the packaged chart deploys the tag X (one place)
    other = Path(package(CHART, destination=tmp_path / "other", app_version="9.9.9"))
    with Chart.load_archive(other.read_bytes()) as chart:
        out = chart.render(values={}, name="gpu-exporter", namespace="gpu-exporter")
    assert "image: gpu-exporter:9.9.9" in out["gpu-exporter/templates/daemonset.yaml"]


def fresh_checkout(where: Path) -> Path:
    """The files a clone of this repository has (tracked, and new files not ignored),
    copied with their symlinks as links: what a user builds from."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        src, dst = ROOT / name, where / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return where


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                         timeout=600)
    text = out.stdout + out.stderr
    if out.returncode != 0 and any(s in text for s in NOT_FOUND):
        pytest.skip(f"no package index reachable: {text[-300:]}")
    assert out.returncode == 0, text[-3000:]
    return out


def wheel_files(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as z:
        return {n for n in z.namelist() if ".dist-info/RECORD" not in n}


@pytest.mark.slow
@pytest.mark.network
def test_a_fresh_checkout_builds_a_wheel_and_sdist_that_install_top_and_otlp(
        tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the test extra's build package is not installed")
    src = fresh_checkout(tmp_path / "src")
    # docs/deploy.md: python -m build --outdir dist . (build installed from PyPI)
    (line,) = [b for b in documented_block("-m build") if "-m build" in b]
    args = line.split("-m build", 1)[1].split()
    assert args == ["--outdir", "dist", "."]
    run(sys.executable, "-m", "build", *args, cwd=src)
    wheel = src / "dist" / f"gpu_exporter-{VERSION}-py3-none-any.whl"
    sdist = src / "dist" / f"gpu_exporter-{VERSION}.tar.gz"
    assert sorted(p.name for p in (src / "dist").iterdir()) == sorted([wheel.name, sdist.name])
    # The wheel: every package, the docs beside it, the command, the extras' requirements.
    files = wheel_files(wheel)
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in files, package
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:  # the page's files, dcgm-exporter's generations of names
            assert fnmatch.filter(files, f"{package.replace('.', '/')}/{pattern}"), pattern
    assert f"gpu_exporter-{VERSION}.data/data/share/doc/gpu-exporter/docs/deploy.md" in files
    # Only the product: no doc generator (tools/), no test module, nothing else of the checkout.
    code = {f for f in files if f.endswith(".py")}
    assert code and all(f.startswith("exporter/") for f in code), sorted(code)[:5]
    assert not {f.rsplit("/", 1)[-1] for f in code} & {"metricsdoc.py", "flagsdoc.py"}
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"gpu_exporter-{VERSION}.dist-info/METADATA").decode()
        scripts = z.read(f"gpu_exporter-{VERSION}.dist-info/entry_points.txt").decode()
    assert "gpu-exporter = exporter.__main__:run" in scripts
    provided = set(re.findall(r"^Provides-Extra: (\S+)$", meta, re.M))
    assert provided == EXTRAS
    for extra in ("top", "otlp"):
        for req in PYPROJECT["project"]["optional-dependencies"][extra]:
            name = re.match(r"[\w.-]+", req).group(0)  # type: ignore[union-attr]
            assert re.search(rf"^Requires-Dist: {re.escape(name)}\b.*extra == \"{extra}\"",
                             meta, re.M | re.I), (extra, req)
    # The sdist holds what a wheel needs: the wheel built from it has the same files.
    with tarfile.open(sdist) as t:
        assert f"gpu_exporter-{VERSION}/pyproject.toml" in t.getnames()
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "again", sdist)
    assert wheel_files(tmp_path / "again" / wheel.name) == files
    # A fresh venv installs the wheel with both extras, from the index for the rest.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "-q", f"{wheel}[top,otlp]")
    version = run(venv / "bin" / "gpu-exporter", "--version", cwd=tmp_path).stdout
    assert version.startswith(f"gpu-exporter {VERSION} ")
    run(venv / "bin" / "python", "-c", "import exporter.client.top.command, exporter.output.otlp",
        cwd=tmp_path)
