"""Downloads by name: fetched from a loopback HTTP server (never the internet), checked by sha256,
cached atomically, then resolved by `trace=NAME` / `dataplane.profile=NAME` without a network."""
from __future__ import annotations

import os
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from policylab.apps import trace_cli
from policylab.apps.data_cli import main as profile_main
from policylab.datasets.cache import DatasetError, profile_path, resolve
from policylab.datasets.catalog import PROFILES, TRACES
from policylab.datasets.download import download
from policylab.traces.config import TraceConfig
from policylab.traces.errors import TraceError
from policylab.traces.load import load_trace

pytestmark = pytest.mark.timeout(60)

SHARED = Path(os.environ.get("POLICYLAB_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
needs_shared = pytest.mark.skipif(not (SHARED / "traces").is_dir() or not (SHARED / "profiles").is_dir(),
                                  reason=f"public trace and profile copies not found at {SHARED} "
                                         "(the test serves them from a loopback server)")
# the registry entries whose published files are the copies in ../shared
SHARED_COPIES = {
    TRACES["azure_code"].files[0].path: "traces/azure_code_2023.csv",
    TRACES["mooncake_synthetic"].files[0].path: "traces/mooncake_synthetic.jsonl",
    **{f.path: "profiles/" + f.path.removeprefix("profiles/")
       for name in ("a100/meta-llama/Meta-Llama-3-8B", "network/h100_dgx") for f in PROFILES[name].files},
}


class _Handler(SimpleHTTPRequestHandler):
    """Serves the mirror folder; `cut` (path -> bytes) sends the full Content-Length, then hangs up early."""
    cut: dict = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        rel = self.path.lstrip("/")
        if rel in self.cut:
            body = (Path(self.directory) / rel).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: self.cut[rel]])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def mirror(tmp_path):
    """A loopback server over a folder laid out as the cache; yields (url, folder, handler class)."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    handler = type("Handler", (_Handler,), {"cut": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _publish(folder: Path, rel: str, data: bytes) -> None:
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_bytes(data)


def _publish_shared(folder: Path) -> None:
    for rel, shared in SHARED_COPIES.items():
        _publish(folder, rel, (SHARED / shared).read_bytes())


def _leftovers(root: Path) -> list:
    return sorted(p.name for p in root.rglob("*") if p.is_file() and p.name.endswith(".part"))


@needs_shared
def test_download_then_trace_and_profile_names_resolve_offline(mirror, tmp_path, monkeypatch):
    url, folder, _ = mirror
    _publish_shared(folder)
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLICYLAB_CACHE", str(cache))
    assert trace_cli.main(["download", "azure_code", "mooncake_synthetic", "--mirror", url]) == 0
    assert profile_main(["download", "a100/meta-llama/Meta-Llama-3-8B", "network/h100_dgx", "--mirror", url]) == 0
    got = cache / TRACES["azure_code"].files[0].path
    assert got.read_bytes() == (SHARED / "traces/azure_code_2023.csv").read_bytes()
    assert _leftovers(cache) == []

    # offline: nothing listens on the mirror any more; names resolve from the cache alone
    monkeypatch.setenv("POLICYLAB_MIRROR", "http://127.0.0.1:9")
    reqs = load_trace(TraceConfig(name="azure_code", dataset="azure_code", format="azure"))
    assert len(reqs) == 8819 and reqs[0].prompt_tokens == 4808
    mooncake = load_trace(TraceConfig(name="m", path="mooncake_synthetic", format="mooncake"))
    assert len(mooncake) == 3993 and mooncake[0].prefix_hashes
    assert (profile_path("a100/meta-llama/Meta-Llama-3-8B") / "mlp.csv").is_file()
    assert (profile_path("network/h100_dgx") / "send_recv.csv").is_file()
    # a second download finds the valid copy and needs no network
    assert download("trace", "azure_code", say=lambda line: None) == got


@needs_shared
def test_checksum_mismatch_keeps_nothing(mirror, tmp_path):
    url, folder, _ = mirror
    rel = TRACES["azure_code"].files[0].path
    data = (SHARED / "traces/azure_code_2023.csv").read_bytes()
    _publish(folder, rel, data.replace(b"4808,10", b"4808,11", 1))     # one digit changed
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match="sha256 mismatch"):
        download("trace", "azure_code", cache_dir=str(cache), mirror=url, say=lambda line: None)
    assert not (cache / rel).exists() and _leftovers(cache) == []
    with pytest.raises(DatasetError, match="trace download azure_code"):
        resolve("trace", "azure_code", str(cache))


@needs_shared
def test_interrupted_download_leaves_no_partial_file(mirror, tmp_path):
    url, folder, handler = mirror
    _publish_shared(folder)
    rel = TRACES["mooncake_synthetic"].files[0].path
    handler.cut[rel] = 100_000          # of 1.1 MB
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match="connection closed after"):
        download("trace", "mooncake_synthetic", cache_dir=str(cache), mirror=url, say=lambda line: None)
    assert not (cache / rel).exists() and _leftovers(cache) == []
    handler.cut.clear()                 # the next try completes
    download("trace", "mooncake_synthetic", cache_dir=str(cache), mirror=url, say=lambda line: None)
    assert (cache / rel).stat().st_size == (SHARED / "traces/mooncake_synthetic.jsonl").stat().st_size


def test_unpublished_checksum_is_pinned_on_first_download(mirror, tmp_path):
    """BurstGPT publishes no checksum: the first download records one, later reads are held to it."""
    url, folder, _ = mirror
    rel = TRACES["burstgpt"].files[0].path
    csv = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
           "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n")
    _publish(folder, rel, csv.encode())
    cache = tmp_path / "cache"
    lines = []
    download("trace", "burstgpt", cache_dir=str(cache), mirror=url, say=lines.append)
    assert "recorded" in lines[0] and (cache / (rel + ".sha256")).is_file()
    reqs = load_trace(TraceConfig(name="burstgpt", dataset="burstgpt", format="burstgpt", cache_dir=str(cache)))
    assert [r.prompt_tokens for r in reqs] == [472, 1087]
    (cache / rel).write_text(csv.replace("472", "473"))     # changed after download
    with pytest.raises(TraceError, match="--force"):
        load_trace(TraceConfig(name="burstgpt", dataset="burstgpt", format="burstgpt", cache_dir=str(cache)))


def test_missing_download_names_the_command(tmp_path, capsys):
    with pytest.raises(TraceError, match=r"run `python -m policylab trace download azure_conv`"):
        load_trace(TraceConfig(name="azure_conv", dataset="azure_conv", format="azure", cache_dir=str(tmp_path)))
    assert profile_main(["download", "a100/llama3", "--cache-dir", str(tmp_path)]) == 2
    assert "unknown profile 'a100/llama3'" in capsys.readouterr().err
    with pytest.raises(DatasetError, match="profile download network/a100_dgx"):
        profile_path("network/a100_dgx", str(tmp_path))


def test_unreachable_server_is_one_clear_error(tmp_path):
    """A refused connection (port 9 on loopback: nothing listens) says so and leaves nothing behind."""
    with pytest.raises(DatasetError, match="download failed"):
        download("trace", "azure_conv", cache_dir=str(tmp_path), mirror="http://127.0.0.1:9", timeout=5,
                 say=lambda line: None)
    assert list(tmp_path.rglob("*.part")) == []


def test_every_trace_name_has_a_config_and_every_url_is_pinned():
    """`trace=NAME` exists for each downloadable trace; git-hosted URLs name a commit, not a branch."""
    configs = Path(__file__).resolve().parents[1] / "configs" / "trace"
    for name, ds in TRACES.items():
        assert f"dataset: {name}" in (configs / f"{name}.yaml").read_text(), name
    for ds in [*TRACES.values(), *PROFILES.values()]:
        for f in ds.files:
            assert f.url.startswith("https://")
            if "raw.githubusercontent.com" in f.url:
                assert len(f.url.split("/")[5]) == 40, f.url     # a full commit hash
            assert (f.sha256 is None) == (f.verified == "pinned on first download"), f.path


def test_shared_copies_match_the_registry():
    """The checksums marked git+copy equal the independent copies (skipped without them)."""
    if not SHARED.is_dir():
        pytest.skip(f"public copies not found at {SHARED}")
    import hashlib
    files = {f.path: f for ds in [*TRACES.values(), *PROFILES.values()] for f in ds.files}
    for rel, shared in SHARED_COPIES.items():
        assert hashlib.sha256((SHARED / shared).read_bytes()).hexdigest() == files[rel].sha256
        assert files[rel].verified == "git+copy"


def test_an_offline_download_says_where_to_fetch_the_file_and_how_to_read_it(tmp_path, capsys):
    """No network: the URL to fetch by hand, `trace=azure trace.path=FILE` to read it where it lies,
    and the cache path that makes `trace=azure_code` find it."""
    from policylab.apps import trace_cli
    dead = "http://127.0.0.1:9"                  # (the discard port: nothing listens, the connection is refused)
    assert trace_cli.main(["download", "azure_code", "--mirror", dead, "--cache-dir", str(tmp_path),
                           "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    url = f"{dead}/traces/azure_code/AzureLLMInferenceTrace_code.csv"
    assert f"{url}: download failed" in err and f"offline? fetch {url} by hand" in err
    assert "python -m policylab run trace=azure trace.path=FILE" in err
    assert f"or save it as {tmp_path / 'traces/azure_code/AzureLLMInferenceTrace_code.csv'}" in err
    assert not list(tmp_path.rglob("*.csv")) and not list(tmp_path.rglob("*.part"))
