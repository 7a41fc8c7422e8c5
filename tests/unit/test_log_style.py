"""One structured log call style: a constant message, every datum a field passed through `extra`.

A `key=value` inside the message text is invisible to a JSON log pipeline (`error`, `retry_in_s`
would be part of `msg`, not fields), so the source check below refuses it, and a real run of the
plugin with JSON logs against an API server that refuses connections shows the output keeps it.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dracommon import logs

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("draplugin", "controller", "dracommon")
LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})
# `name=` not preceded by a word character, a dot or a dash: `--health-recovery=never`
# names a flag, it is not a field.
KEY_VALUE = re.compile(r"(?<![\w.-])[A-Za-z_]\w*=")
WAIT = 20.0


def _is_logger(node: ast.expr) -> bool:
    """`log`, `logger`, `self._log`, `logging`: the receivers this project logs through."""
    return "log" in ast.unparse(node).lower()


def style_problems(source: str) -> list[tuple[int, str]]:
    """(line, why) for each logger call whose message is not one constant without `key=`."""
    problems: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not _is_logger(node.func.value):
            continue
        method = node.func.attr
        if method == "log":
            args = node.args[1:]
        elif method in LEVELS:
            args = node.args
        else:
            continue
        if not args:
            continue
        message = args[0]
        if not (isinstance(message, ast.Constant) and isinstance(message.value, str)):
            problems.append((node.lineno, "message is not a constant string (put the data in extra)"))
        elif len(args) > 1:
            problems.append((node.lineno, "message has %-format arguments (put them in extra)"))
        elif KEY_VALUE.search(message.value):
            problems.append((node.lineno, f"message embeds a field: {message.value!r}"))
        problems.extend((node.lineno, why) for why in _extra_clashes(node))
    return problems


# A key of `extra` that names a LogRecord attribute (`created`, `name`, `msg`...) makes logging
# raise KeyError at the call, and only when the level is enabled: a crash no quiet test run sees.
RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _extra_clashes(call: ast.Call) -> list[str]:
    clashes: list[str] = []
    for keyword in call.keywords:
        if keyword.arg != "extra" or not isinstance(keyword.value, ast.Dict):
            continue
        for key in keyword.value.keys:
            if isinstance(key, ast.Constant) and key.value in RECORD_ATTRIBUTES:
                clashes.append(f"extra key {key.value!r} is a LogRecord attribute (logging raises KeyError)")
    return clashes


def test_the_checker_finds_each_kind_of_embedded_field() -> None:
    source = "\n".join(
        [
            'log.info("synced node=%s", name)',
            'log.warning(f"failed error={err}")',
            'self._log.error("retry_in_s=1 left")',
            'logging.log(logging.INFO, "%s done", what)',
            'log.info("done", extra={"node": name})',
            'log.info("taint kept (--health-recovery=never)")',
            'parser.error("bad value=%s" % v)',
            'log.info("published", extra={"created": 1, "node": name})',
        ]
    )
    assert [line for line, _ in style_problems(source)] == [1, 2, 3, 4, 8]


def test_no_log_call_in_the_daemons_embeds_fields_in_its_message() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for line, why in style_problems(path.read_text()):
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: {why}")
    assert not found, "\n".join(found)


def test_urllib3_retry_warnings_are_dropped_above_debug(restore_root_logger: None) -> None:
    """The project's own retry line carries the facts; urllib3's three per failed call are noise."""

    for level, expected in (("info", 0), ("debug", 1)):
        stream = io.StringIO()
        logs.setup_logging("json", level, stream)
        pool = logging.getLogger("urllib3.connectionpool")
        pool.warning("Retrying (%r) after connection broken by '%r': %s", "Retry(total=2)", "refused", "/api")
        pool.warning("Connection pool is full, discarding connection: %s", "host")
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        retries = [line for line in lines if line["msg"].startswith("Retrying")]
        assert len(retries) == expected, lines
        assert all(line["level"] == "DEBUG" for line in retries)
        assert any(line["msg"].startswith("Connection pool is full") for line in lines)


def _kubeconfig(path: Path) -> Path:
    # Port 1 on loopback refuses every connection: each API call fails at once.
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


def test_a_plugin_run_against_a_refusing_api_server_logs_only_structured_json(tmp_path: Path) -> None:
    kubelet = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))  # short: socket paths have a length limit
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "draplugin.cli", "run", "--node-name", "node-1", "--backend", "fake"),
            *("--kubeconfig", str(_kubeconfig(tmp_path / "kubeconfig")), "--log-format", "json"),
            *("--kubelet-root-dir", str(kubelet), "--state-dir", str(tmp_path / "state")),
            *("--cdi-root", str(tmp_path / "cdi"), "--metrics-port", "0"),
        ],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "LOG_FORMAT")},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + WAIT
        # Two failed syncs: the publisher's retry line, and urllib3's retries of each call, are out.
        while sum("api server unreachable, retrying" in line for line in lines) < 2:
            assert time.monotonic() < deadline, "".join(lines)
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=WAIT)
        lines.extend(rest.splitlines())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(kubelet, ignore_errors=True)
    records = [json.loads(line) for line in lines if line.strip()]  # every line is one JSON object
    assert [r["logger"] for r in records if r["logger"].startswith("urllib3")] == []
    embedded = [r["msg"] for r in records if KEY_VALUE.search(r["msg"])]
    assert embedded == []
    retries = [r for r in records if r["msg"].startswith("api server unreachable")]
    assert retries and all(isinstance(r["retry_in_s"], float) and "refused" in r["error"] for r in retries)
