"""The job's store in a real etcd server: what the agents need of it beyond torch's EtcdStore
(a TCPStore's compare_set, and failures raised as torch's DistStoreError, a RuntimeError)."""

import datetime
import subprocess
import sys
import time

import pytest

from rankguard.launcher.config import RendezvousConfig
from tests.conftest import ROOT, script
from tests.launcher.etcd_server import etcd_server


def _open(endpoint: str, read_timeout: int = 5):
    from rankguard.launcher.etcd_store import open_etcd

    host, port = endpoint.rsplit(":", 1)
    cfg = RendezvousConfig(2, 2, host, int(port), backend="etcd-v2", read_timeout=read_timeout)
    return open_etcd(cfg, "job")[1]


def test_compare_set_writes_only_over_the_expected_value_as_a_tcpstore_does(tmp_path):
    with etcd_server(tmp_path) as endpoint:
        store = _open(endpoint)
        assert store.compare_set("end", "", "first") == b"first"
        assert store.compare_set("end", "", "second") == b"first"  # the first one stands
        assert store.compare_set("end", "other", "third") == b"first"
        assert store.compare_set("end", "first", "third") == b"third"
        assert store.compare_set("absent", "something", "x") == b""
        assert not store.check(["absent"])
        assert store.add("count", 2) == 2 and store.add("count", 3) == 5


def test_a_wait_that_runs_out_and_a_server_that_is_gone_raise_dist_store_errors(tmp_path):
    from torch.distributed import DistStoreError

    with etcd_server(tmp_path) as endpoint:
        store = _open(endpoint, read_timeout=2)
        started = time.monotonic()
        with pytest.raises(DistStoreError, match="wait: timed out"):
            store.wait(["never"], datetime.timedelta(seconds=0.3))
        assert time.monotonic() - started < 10
    started = time.monotonic()  # the server is stopped now
    with pytest.raises(DistStoreError, match=f"etcd at {endpoint}: add: "):
        store.add("count", 1)
    assert time.monotonic() - started < 2 * 2 + 10  # read_timeout, a retry, a loaded machine


def test_etcd_v2_without_the_python_etcd_client_is_one_line_naming_the_package(tmp_path):
    # the client is hidden from this one process (None in sys.modules makes importing it fail)
    code = ("import sys; sys.modules['etcd'] = None; from rankguard.cli import main; "
            f"sys.exit(main(['run', '--log-dir', {str(tmp_path)!r}, '--nnodes', '2', "
            "'--rdzv-backend', 'etcd-v2', '--rdzv-endpoint', '127.0.0.1:1', '--rdzv-id', 'j', "
            f"{script('node_env.py')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "etcd-v2 needs the python-etcd package" in lines[0], proc.stderr
    assert "pip install 'rankguard[etcd]'" in lines[0]
