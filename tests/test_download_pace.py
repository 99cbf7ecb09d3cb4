"""A download server that trickles (one byte every 50 s kept a download alive forever, since each read had its own
timeout): a download below MIN_RATE over a window ends with one line, and its temp file is removed."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from yolo_cb.data.download import download_file
from yolo_cb.errors import DataError


class Trickle(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(40):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.25)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def trickling_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/data.zip"
    server.shutdown()
    server.server_close()


def test_a_trickling_download_ends_with_one_line_and_leaves_nothing(tmp_path, trickling_url):
    with pytest.raises(DataError, match=r"download of http://127\.0\.0\.1:\d+/data\.zip stalled: \d+ bytes in the last"):
        download_file(trickling_url, tmp_path / "data.zip", timeout=1.0)  # each read arrives within the timeout
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file
