"""`flowwarden run` while a stream copies its existing documents: the progress line reports the copy
(copied of the estimate, the rate, the time left); a terminal also gets a progress bar, a pipe
and JSON logs never do."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers import wait_until

HANDLERS = """
import os
import time

from flowwarden import Snapshot, change_stream, checkpoint, on_change, on_snapshot


@change_stream(
    "orders",
    os.environ["FW_TEST_DB"],
    name="orders",
    snapshot=Snapshot.INITIAL,
    snapshot_chunk_size=10,
    max_await_time_ms=50,
)
@checkpoint(save_every_n=10)
class Orders:
    @on_snapshot
    def copied(self, event):
        time.sleep(0.02)  # a copy of 300 documents that takes seconds, so that it can be watched

    @on_change
    def changed(self, event):
        pass
"""

COPY_LINE = re.compile(
    r"stream orders: copying the existing documents \(initial snapshot\), [\d,]+ of about 300 copied "
    r"\(\d+%\), [\d,]+ documents/s, about [\w ]+ left; the change stream opens once the copy is done"
)


def start(
    tmp_path: Path, uri: str, db: str, *flags: str, stderr: int, env: dict[str, str]
) -> subprocess.Popen:
    """``flowwarden run`` of the copying class, a progress line every 0.3 s."""
    (tmp_path / "copy_handlers.py").write_text(HANDLERS)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_")}
    command = [sys.executable, "-m", "flowwarden.cli", "run", "copy_handlers:Orders", "--uri", uri]
    return subprocess.Popen(
        [*command, "--progress-interval", "0.3", *flags],
        cwd=tmp_path,
        env={**environment, "FW_TEST_DB": db, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def stop(child: subprocess.Popen) -> int:
    child.send_signal(signal.SIGINT)
    return child.wait(60)


def test_the_progress_line_reports_the_copy_and_json_logs_get_no_bar(tmp_path, mongodb_uri, client, db_name):
    client[db_name].orders.insert_many([{"n": n} for n in range(300)])
    log = tmp_path / "stderr"
    with log.open("w") as err:
        child = start(tmp_path, mongodb_uri, db_name, "--log-format", "json", stderr=err.fileno(), env={})
    try:
        wait_until(
            lambda: any(COPY_LINE.search(line) for line in log.read_text().splitlines()),
            timeout=60,
            what="a progress line with the copy's rate and time left",
        )
    finally:
        code = stop(child)
    lines = log.read_text().splitlines()
    assert code == 0, "\n".join(lines)
    records = [json.loads(line) for line in lines]  # JSON, every one: no bar, no control codes
    copying = [r["message"] for r in records if "initial snapshot" in r["message"]]
    assert copying and not any("never opened" in message for message in copying), copying


def on_terminal(tmp_path: Path, uri: str, db: str, *flags: str, until: str) -> str:
    """Run the copying class with stderr on a terminal (a pseudo-terminal) until ``until`` shows
    and a copy line has been written, then stop it; what the terminal got."""
    parent, child_end = pty.openpty()
    child = start(tmp_path, uri, db, *flags, stderr=child_end, env={"TERM": "xterm", "COLUMNS": "160"})
    os.close(child_end)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # the child's end closed: it exited
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: until.encode() in seen, timeout=60, what=f"{until!r} on the terminal")
        wait_until(lambda: COPY_LINE.search(seen.decode("utf-8", "replace")), timeout=60, what="a copy line")
    except AssertionError as error:
        got = seen.decode("utf-8", "replace")[-3000:]
        raise AssertionError(f"{error}; the terminal got: {got}") from None
    finally:
        code = stop(child)
        reader.join(10)
        os.close(parent)
    text = seen.decode("utf-8", "replace")
    assert code == 0, text
    return text


def test_a_terminal_gets_a_progress_bar_for_the_copy(tmp_path, mongodb_uri, client, db_name):
    client[db_name].orders.insert_many([{"n": n} for n in range(300)])
    text = on_terminal(tmp_path, mongodb_uri, db_name, until="━")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # the terminal's colours and cursor moves
    assert re.search(r"orders: initial snapshot [━╺╸ ]+ +\d+/300 +\d+% ", plain), plain[-3000:]


def test_json_logs_on_a_terminal_get_no_bar(tmp_path, mongodb_uri, client, db_name):
    client[db_name].orders.insert_many([{"n": n} for n in range(300)])
    text = on_terminal(tmp_path, mongodb_uri, db_name, "--log-format", "json", until="initial snapshot")
    assert "━" not in text and "\x1b" not in text
    assert all(json.loads(line) for line in text.splitlines() if line.strip())
