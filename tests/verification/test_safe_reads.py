"""Planted files where the ledger, its signed head or the trust store's files belong (issue 34 item 2).

A FIFO blocks a plain ``open`` forever, ``/dev/zero`` never ends, a link reads someone else's file: every
reader refuses them at once with an error naming the path. Real FIFOs and links; every test that a regression
could hang has a ``pytest.mark.timeout``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.contracts.bounded_json import SIGNED_LIMITS, DocumentLimitError, read_limited
from mixle_parallel.contracts.safe_read import OversizeFileError, UnsafeFileError, open_regular, read_regular
from mixle_parallel.verification.keys import TrustStore, TrustStoreError
from mixle_parallel.verification.ledger.chain import Ledger, LedgerError, iter_ledger
from mixle_parallel.verification.ledger.seal import head_path, read_head
from mixle_parallel.verification.ledger.verify import main_audit, verify_ledger
from tests.verification.test_ledger import write_run


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _replace_with_fifo(path: Path) -> None:
    if os.path.lexists(path):
        path.unlink()
    os.mkfifo(path)


@pytest.mark.timeout(30)
def test_the_safe_reader_refuses_everything_but_a_regular_file(tmp_path):
    regular = tmp_path / "doc.json"
    regular.write_bytes(b"{}")
    assert read_regular(regular, 2) == b"{}"
    with pytest.raises(OversizeFileError, match=r"doc\.json holds 2 bytes, over the limit of 1"):
        read_regular(regular, 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    good_link = tmp_path / "good-link"
    good_link.symlink_to(regular)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        for path, kind in ((fifo, r"a FIFO \(named pipe\)"), (link, "a symbolic link"),
                           (good_link, "a symbolic link"), (tmp_path / "sock", "a socket"), (tmp_path, "a folder")):
            with pytest.raises(UnsafeFileError, match=rf"{path} is {kind}, not a regular file"):
                read_regular(path, 1 << 20, what="document")
        with pytest.raises(UnsafeFileError, match="a character device"):
            read_regular(link, 1 << 20, follow_symlinks=True)  # a typed path may be a link, but not to a device
        assert read_regular(good_link, 2, follow_symlinks=True) == b"{}"
        with pytest.raises(UnsafeFileError, match="a FIFO"):
            open_regular(fifo)
    finally:
        sock.close()
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 1)
    with pytest.raises(UnsafeFileError, match="a FIFO"):  # read_limited (every signed document) is the same reader
        read_limited(fifo, SIGNED_LIMITS)
    regular.write_bytes(b"x" * (SIGNED_LIMITS.max_bytes + 1))
    with pytest.raises(DocumentLimitError, match="over the limit"):
        read_limited(regular, SIGNED_LIMITS)


def _ledger(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    write_run(path, ParallelPlan(dp_shard=2), steps=2)
    return path


@pytest.mark.timeout(60)
def test_a_fifo_as_the_signed_head_fails_the_audit_and_the_writer_at_once(tmp_path, capsys):
    ledger = _ledger(tmp_path)
    _replace_with_fifo(head_path(ledger))
    assert main_audit([str(ledger)]) == 1
    assert f"{head_path(ledger)} is a FIFO" in capsys.readouterr().out
    with pytest.raises(LedgerError, match=rf"refusing to append: .*{head_path(ledger)} is a FIFO"):
        Ledger(ledger)
    with pytest.raises(ValueError, match="is a FIFO"):
        read_head(head_path(ledger), TrustStore())


@pytest.mark.timeout(60)
def test_a_head_linked_to_dev_zero_or_given_as_since_is_refused(tmp_path):
    ledger = _ledger(tmp_path)
    fifo = tmp_path / "old.head"
    os.mkfifo(fifo)
    report = verify_ledger(ledger, since=fifo)
    assert not report.ok and any("is a FIFO" in str(f) for f in report.faults)
    head_path(ledger).unlink()
    head_path(ledger).symlink_to("/dev/zero")
    report = verify_ledger(ledger)
    assert not report.ok and any("is a symbolic link" in str(f) for f in report.faults)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_planted_ledger_file_is_a_fault_not_a_hang(tmp_path, capsys, kind):
    ledger = tmp_path / "run.jsonl"
    if kind == "fifo":
        os.mkfifo(ledger)
    else:
        ledger.symlink_to("/dev/zero")
    assert main_audit([str(ledger), "--no-head"]) == 1
    assert f"{ledger} is a" in capsys.readouterr().out
    with pytest.raises(LedgerError, match=rf"{ledger} is a"):
        Ledger(ledger)
    with pytest.raises(UnsafeFileError):
        list(iter_ledger(ledger))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["trust.json", "policy.json"])
def test_a_fifo_in_the_trust_store_is_refused_naming_it(home, name):
    store = TrustStore(home)
    store.init()
    _replace_with_fifo(home / name)
    with pytest.raises(TrustStoreError, match=rf"{home / name}.*is a FIFO"):
        store.keys() if name == "trust.json" else store.policy()
