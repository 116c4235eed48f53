"""The log folders a run makes (private, each one), and removes again when it started nothing:
never one that existed before it, nor one that holds anything."""

import os
import stat

import pytest

from rankguard.inputs import options
from rankguard.errors import UsageError
from rankguard.inputs.options import missing_dirs, remove_empty_dirs, writable_dir


def test_the_folders_missing_are_the_path_and_its_missing_parents_outermost_first(tmp_path):
    assert missing_dirs(str(tmp_path / "a" / "b")) == (str(tmp_path / "a"),
                                                       str(tmp_path / "a" / "b"))
    assert missing_dirs(str(tmp_path)) == ()


def test_removing_them_keeps_a_folder_that_holds_anything_and_every_folder_above_it(tmp_path):
    made = missing_dirs(str(tmp_path / "a" / "b" / "c"))
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "someone_elses").write_text("keep\n")
    remove_empty_dirs(made)
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["someone_elses"]
    (tmp_path / "a" / "b" / "someone_elses").unlink()
    remove_empty_dirs(made)
    assert list(tmp_path.iterdir()) == []  # tmp_path itself existed before: kept


def test_every_folder_a_log_dir_makes_is_private_whatever_the_umask(tmp_path):
    """A run of several nodes logs to RUN_ID/HOST-PID/: RUN_ID was made 0755 by the umask."""
    previous = os.umask(0o022)
    try:
        made = writable_dir("--log-dir", str(tmp_path / "run" / "node"))
    finally:
        os.umask(previous)
    for folder in (tmp_path / "run", tmp_path / "run" / "node"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert made == str(tmp_path / "run" / "node")


@pytest.mark.parametrize("env, problem", [
    ({"TORCH_FR_BUFFER_SIZE": "abc"}, "TORCH_FR_BUFFER_SIZE='abc': is not a number of entries"),
    ({"TORCH_FR_BUFFER_SIZE": ""}, "TORCH_FR_BUFFER_SIZE='': is not a number of entries"),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "99999999999999999999"},
     "TORCH_NCCL_TRACE_BUFFER_SIZE='99999999999999999999': is not a number of entries"),
    ({"TORCH_FR_BUFFER_SIZE": "2147483648"},  # past a C int: torch's std::stoi aborts the rank
     "TORCH_FR_BUFFER_SIZE='2147483648': is not a number of entries"),
    ({"TORCH_FR_BUFFER_SIZE": "0", "RANKGUARD_GLOO": "recorder"},
     "TORCH_FR_BUFFER_SIZE=0: turns off torch's Flight Recorder"),
])
def test_a_flight_recorder_size_torch_would_abort_on_or_that_leaves_nothing_watched_is_refused(
        env, problem):
    with pytest.raises(UsageError) as refused:
        options.check_flight_recorder(env)
    assert str(refused.value).startswith(problem), refused.value


@pytest.mark.parametrize("env", [{}, {"TORCH_FR_BUFFER_SIZE": "2000"},
                                 {"TORCH_FR_BUFFER_SIZE": "2147483647"},
                                 {"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_FR_BUFFER_SIZE": "-1"},
                                 {"TORCH_FR_BUFFER_SIZE": "0", "RANKGUARD_GLOO": "wrap"}])
def test_a_flight_recorder_size_torch_takes_is_accepted(env):
    options.check_flight_recorder(env)
