"""No secret of a URL reaches what warmenv prints: errors, log lines, events, `--json`, a terminal.

A URL carries a credential in its user information, in a query value or a
query item without `=`, and in a path parameter (`/b;token=.../x.bundle`,
which servers read as they read a query). Each test takes a URL with its
secret in one of those places, through a real HTTP server or a real port,
and looks for the secret in everything the URL's use printed: the error's
message, every log record at DEBUG from every logger, the import's events,
the command line's output (`--json`, an error line, a terminal's progress bar).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from redis_server import free_port
from test_cli import terminal, warmenv
from test_download import BundleServer, server  # noqa: F401 (a fixture, used by name)
from warmenv import Environment
from warmenv.blocking import export_bundle as export_blocking
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import DownloadError, export_bundle, importing, preflight
from warmenv.remote import RemoteError, RemoteSettings

SECRET = "Zq7-SECRET"
"""The secret each URL carries in one place."""

# The path each form of URL asks the server for, and the URL on top of `base`.
FORMS = {
    "user information": ("/b.bundle", f"http://u:{SECRET}@{{base}}/b.bundle"),
    "query value": ("/b.bundle", f"http://{{base}}/b.bundle?sig={SECRET}"),
    "path parameter": (f"/b;token={SECRET}/x.bundle", f"http://{{base}}/b;token={SECRET}/x.bundle"),
    "bare path parameter": (f"/b;{SECRET}/x.bundle", f"http://{{base}}/b;{SECRET}/x.bundle"),
}


@pytest.fixture(params=list(FORMS))
def form(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _url(form: str, httpd: BundleServer, *, missing: bool = False) -> tuple[str, str]:
    """The form's URL on `httpd`, and the path it asks for; `missing`: one not served."""
    path, url = FORMS[form]
    url = url.format(base=f"127.0.0.1:{httpd.server_address[1]}")
    if missing:
        url, path = url.replace(".bundle", "-gone.bundle"), path.replace(".bundle", "-gone.bundle")
    return url, path


async def _served(form: str, httpd: BundleServer, warm_env: Environment, out: Path) -> str:
    """The form's URL, with a bundle of `warm_env` served there."""
    await export_bundle(warm_env, out / "b", name="n", version="1")
    url, path = _url(form, httpd)
    httpd.put(path, (out / "b").read_bytes())
    return url


@pytest.mark.anyio
async def test_an_import_by_url_prints_no_secret_in_its_events_or_logs(
    form: str,
    server: BundleServer,  # noqa: F811
    warm_env: Environment,
    cold_env: Environment,
    out_dir: Path,
    records: list[str],
) -> None:
    url = await _served(form, server, warm_env, out_dir)
    async with importing(url, cold_env) as progress:
        events = [event async for event in progress]
        report = progress.report
    assert report is not None and report.imported > 0
    assert server.seen[-1].path == _url(form, server)[1]  # the secret was sent, as given
    assert any("HTTP Request: GET" in line for line in records), records
    shown = [repr(event) for event in events] + [repr(report), *records]
    assert [line for line in shown if SECRET in line] == []


@pytest.mark.anyio
async def test_a_failed_download_and_preflight_print_no_secret(
    form: str,
    server: BundleServer,  # noqa: F811
    cold_env: Environment,
    records: list[str],
) -> None:
    url, _ = _url(form, server, missing=True)
    with pytest.raises(DownloadError) as imported:
        async with importing(url, cold_env) as progress:
            async for _ in progress:
                pass
    with pytest.raises(DownloadError) as checked:
        await preflight(url)
    for error in (imported.value, checked.value):
        assert "404" in str(error) and "gone.bundle" in str(error)
        assert SECRET not in str(error) and SECRET not in repr(error)
    assert records and [line for line in records if SECRET in line] == []


@pytest.mark.anyio
@pytest.mark.parametrize("refusal", ["tls", "dns"])
async def test_a_connection_refused_for_good_prints_no_secret(
    form: str,
    refusal: str,
    server: BundleServer,  # noqa: F811
    cold_env: Environment,
    records: list[str],
) -> None:
    """https:// to a plain HTTP server (a TLS handshake refused); a host that does not exist."""
    url, _ = _url(form, server)
    if refusal == "dns":
        url = url.replace(f"127.0.0.1:{server.server_address[1]}", "bundles.invalid")
    else:
        url = url.replace("http://", "https://")
    with pytest.raises(DownloadError) as caught:
        async with importing(url, cold_env) as progress:
            async for _ in progress:
                pass
    said = str(caught.value)
    assert ("TLS handshake" if refusal == "tls" else "could not be resolved") in said
    assert SECRET not in said and [line for line in records if SECRET in line] == []


def test_the_command_line_prints_no_secret_in_json_errors_or_on_a_terminal(
    form: str,
    server: BundleServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    with open_blocking("warm", root=tmp_path / "w", remote="") as warm:
        warm.store("n/1").get_or_compute("k", str, "v")
        export_blocking(warm, tmp_path / "b", name="n", version="1")
    url, path = _url(form, server)
    server.put(path, (tmp_path / "b").read_bytes())
    imported = warmenv("import", url, "--env", "c", "--json", root=tmp_path / "r")
    assert imported.returncode == 0, imported.stderr
    missing, _ = _url(form, server, missing=True)
    failed = warmenv("import", missing, "--env", "c", root=tmp_path / "r")
    assert failed.returncode == 1 and "404" in failed.stderr
    checked = warmenv("check", missing, "--json", root=tmp_path / "r")
    assert checked.returncode != 0
    status, shown = terminal("import", url, "--env", "t", "--root", str(tmp_path / "t"))
    assert status == 0 and "downloading" in shown.decode("utf-8", "replace")
    for output in (imported, failed, checked):
        assert SECRET not in output.stdout + output.stderr
    assert SECRET.encode() not in shown


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:6390/0;token={SECRET}",
        f"redis://:{SECRET}@127.0.0.1:6390/0;{SECRET}",
        f"redis://127.0.0.1:6390/0;password={SECRET}",
    ],
)
def test_a_redis_url_with_a_path_parameter_is_refused_without_its_secret(
    url: str, tmp_path: Path
) -> None:
    with pytest.raises(RemoteError, match="malformed database number") as raised:
        RemoteSettings(url)
    assert SECRET not in str(raised.value)
    with open_blocking("fleet", root=tmp_path, remote=""):
        pass
    completed = warmenv("ls", "--env", "fleet", "--remote", url, root=tmp_path)
    assert completed.returncode != 0 and "malformed database number" in completed.stderr
    assert SECRET not in completed.stdout + completed.stderr


def test_a_redis_url_s_secrets_stay_out_of_the_command_line_s_warning_and_json(
    tmp_path: Path,
) -> None:
    with open_blocking("fleet", root=tmp_path, remote=""):
        pass
    url = f"redis://u:{SECRET}@127.0.0.1:{free_port()}/0?password={SECRET}"
    completed = warmenv("ls", "--env", "fleet", "--remote", url, "--json", root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "unavailable" in completed.stderr and "redis://***@127.0.0.1" in completed.stderr
    assert SECRET not in completed.stdout + completed.stderr


def test_a_url_the_command_line_refuses_is_one_line_without_its_secret(tmp_path: Path) -> None:
    completed = warmenv("import", f"ftp://h/b;token={SECRET}/x", "--env", "e", root=tmp_path)
    assert completed.returncode in (1, 2) and completed.stderr.count("\n") == 1, completed.stderr
    assert SECRET not in completed.stdout + completed.stderr
