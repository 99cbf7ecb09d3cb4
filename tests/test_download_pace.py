"""A download server that trickles (one byte every 50 s kept a download alive forever, since each read had its own
timeout): a download below MIN_RATE over a window ends with one line, and its temp file is removed."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from test_data_safety import server  # noqa: F401 - the loopback http server fixture

from yolo_cb.errors import DataError
from yolo_cb.utils.download import download_file


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
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/data.zip"
    httpd.shutdown()
    httpd.server_close()


def test_a_trickling_download_ends_with_one_line_and_leaves_nothing(tmp_path, trickling_url):
    with pytest.raises(DataError, match=r"download of http://127\.0\.0\.1:\d+/data\.zip stalled: \d+ bytes in the last"):
        download_file(trickling_url, tmp_path / "data.zip", timeout=1.0)  # each read arrives within the timeout
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


def test_an_archive_aimed_at_a_sibling_dataset_is_refused(tmp_path, server):  # noqa: F811 - the fixture
    """An archive whose members land in a sibling dataset's folder in datasets_dir replaced its label and image, exit 0;
    a dataset's archive now extracts only into its own folder: the whole archive is refused, nothing is written."""
    from test_data_safety import dataset_zip, snapshot

    from yolo_cb.data.resolve import check_data

    www, base, _ = server
    ddir = tmp_path / "datasets"
    (ddir / "other" / "labels").mkdir(parents=True)
    (ddir / "other" / "labels" / "a.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    before = snapshot(ddir)
    dataset_zip(www / "mine.zip", "mine", extra={"other/labels/a.txt": b"1 0.1 0.1 0.9 0.9\n"})
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text(f"path: mine\ntrain: images/train\nval: images/val\nnames: [a, b]\ndownload: {base}/mine.zip\n")
    with pytest.raises(DataError, match=r"unsafe member 'other/labels/a\.txt' in mine\.zip: the dataset's files go in .*mine"):
        check_data(str(yaml_file), str(ddir))
    assert snapshot(ddir) == before  # the sibling untouched, nothing of the dataset extracted either
