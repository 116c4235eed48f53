"""A rank leaving: its exit code and the time it began to leave, recorded once, by itself."""

import os

from rankguard.records import ledger


def _writer(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    return ledger.LedgerWriter(path), ledger.LedgerReader(path)


def test_leaving_records_the_exit_code_and_when(tmp_path):
    writer, reader = _writer(tmp_path)
    writer.record_exit(3, in_collective=False)
    snap = reader.read()
    assert (snap.fault, snap.exit_code, snap.fault_in_collective) == \
        (ledger.FAULT_EXITING, 3, False)
    assert snap.t_fault >= snap.t_start > 0
    writer.record_exit(0, in_collective=False)  # the first record stands
    assert reader.read().exit_code == 3


def test_leaving_after_an_exception_keeps_the_exception(tmp_path):
    writer, reader = _writer(tmp_path)
    writer.record_fault(ledger.FAULT_RAISED, in_collective=True)
    writer.record_exit(1, in_collective=False)
    snap = reader.read()
    assert (snap.fault, snap.exit_code) == (ledger.FAULT_RAISED, 0)


def test_a_forked_child_leaving_does_not_speak_for_the_rank(tmp_path):
    writer, reader = _writer(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child: its script ends, as a DataLoader worker's or a bare fork's would
        writer.record_exit(0, in_collective=False)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reader.read().fault == ledger.FAULT_NONE


def test_an_exception_of_no_known_kind_records_no_text(tmp_path):
    writer, reader = _writer(tmp_path)
    writer.record_fault(ledger.FAULT_RAISED, in_collective=False)
    snap = reader.read()
    assert (snap.error, snap.error_text) == (ledger.ErrorKind.OTHER, "")


def test_a_usage_error_records_its_kind_and_its_message_cut_at_a_character(tmp_path):
    writer, reader = _writer(tmp_path)
    text = "rankguard.regroup(keep_size): expected True or False, got 'é'" + "é" * 300
    writer.record_error(ledger.ErrorKind.USAGE, text)
    writer.record_fault(ledger.FAULT_RAISED, in_collective=False)
    snap = reader.read()
    assert snap.error == ledger.ErrorKind.USAGE and snap.fault == ledger.FAULT_RAISED
    assert text.startswith(snap.error_text)
    assert len(snap.error_text.encode()) <= ledger.ERROR_TEXT_MAX
    assert len(snap.error_text.encode()) > ledger.ERROR_TEXT_MAX - 2  # cut, not emptied
