"""Sorting ranks by where their main threads are (``rankguard.processes.stack_summary``), on
dumps in the format faulthandler writes."""

from __future__ import annotations

import os

from rankguard.processes import stack_summary as ss

USER = os.path.abspath("train.py")
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def dump(*frames: tuple[str, int, str], thread: str = "Current thread") -> str:
    lines = [f"{thread} 0x00007f0000000001 (most recent call first):"]
    lines += [f'  File "{path}", line {line} in {func}' for path, line, func in frames]
    helper = ['Thread 0x00007f0000000002 (most recent call first):',
              '  File "/usr/lib/python3.11/threading.py", line 331 in wait']
    return "\n".join(helper + [""] + lines) + "\n"


WAITING = dump((TORCH, 2501, "all_reduce"), (USER, 88, "train_step"), (USER, 120, "<module>"))
LOADING = dump(("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 630,
                "__next__"), (USER, 80, "train_step"), (USER, 120, "<module>"))


def test_the_outlier_stands_out_and_the_largest_set_comes_first() -> None:
    dumps = {rank: WAITING for rank in range(7)} | {7: LOADING}
    same = ss.by_stack(dumps, list(range(9)))  # rank 8 never answered
    lines = ss.describe(same)
    assert lines[0].startswith("ranks 0-6 (7): all_reduce (") and \
        lines[0].endswith(f"train_step ({USER}:88)"), lines
    assert lines[1].startswith("rank 7: __next__ (") and "train_step" in lines[1], lines
    assert lines[2] == "rank 8: no stacks (it did not answer)"


def test_the_last_dump_of_a_file_counts_and_its_current_thread() -> None:
    frames = ss.main_thread(LOADING + WAITING)
    assert frames[0] == ss.Frame(TORCH, 2501, "all_reduce") and frames[1].user
    assert not frames[0].user and not ss.Frame("<frozen runpy>", 88, "_run_code").user
    unmarked = dump((USER, 5, "f"), thread="Thread")  # no current thread: the last one
    assert ss.main_thread(unmarked) == (ss.Frame(USER, 5, "f"),)
    assert ss.main_thread("") == () and ss.main_thread("garbage\n  File oops") == ()


def test_a_dump_taken_on_rankguards_watcher_thread_counts_the_main_thread_not_the_watcher(
        ) -> None:
    # a main thread that blocks the requests' signals leaves them to another thread: the
    # current one is then rankguard's watcher, and every such rank was grouped by the
    # watcher's frame; faulthandler lists the main thread, the oldest, last
    watcher = os.path.join(os.path.dirname(os.path.dirname(ss.__file__)), "runtime",
                           "signal_watch.py")
    text = "\n".join([
        "Current thread 0x00007f0000000003 (most recent call first):",
        f'  File "{watcher}", line 69 in _watch',
        '  File "/usr/lib/python3.11/threading.py", line 982 in run', "",
        "Thread 0x00007f0000000001 (most recent call first):",
        f'  File "{USER}", line 35 in <module>']) + "\n"
    assert ss.main_thread(text) == (ss.Frame(USER, 35, "<module>"),)


def test_rank_lists_show_runs_as_ranges() -> None:
    assert ss.rank_list([9, 0, 1, 2, 3]) == "0-3,9"
    assert ss.rank_list([1, 3]) == "1,3" and ss.rank_list([4, 5]) == "4,5"
    assert ss.last_dump("/nonexistent/stacks.txt") == ""


def test_every_thread_of_a_dump_is_a_line_the_signalled_one_first() -> None:
    lines = ss.every_thread(WAITING)
    assert lines[0].startswith("main thread: all_reduce (") and "train_step" in lines[0], lines
    assert lines[1].startswith("thread 2: wait (") and lines[1].endswith("threading.py:331)"), \
        lines
    assert ss.every_thread("") == []


RANKGUARD = os.path.dirname(os.path.dirname(os.path.abspath(ss.__file__)))  # the package


def test_rankguards_own_frames_are_neither_the_users_nor_shown_as_where_a_process_lingers(
        ) -> None:
    eviction = ss.Frame(os.path.join(RANKGUARD, "runtime", "eviction.py"), 85, "_watch")
    assert eviction.ours and not eviction.user
    assert ss.Frame(USER, 88, "train_step").user and not ss.Frame(USER, 88, "x").ours
    watcher = ("Thread 0x00007f0000000003 (most recent call first):\n"
               f'  File "{eviction.file}", line 85 in _watch\n'
               '  File "/usr/lib/python3.11/threading.py", line 982 in run\n')
    lines = ss.every_thread(watcher + "\n" + WAITING)
    assert len(lines) == 2 and not any("_watch" in line for line in lines), lines
