"""The execution summary, error grouping and the resume notice (SPEC §6.1, §6.2)."""

from __future__ import annotations

import io
import sys

import pytest

from bellis._run._summary import format_summary, resume_message, status_symbol
from bellis._state import TaskState
from bellis._stats._errorgroups import (
    MAX_BLOCK_IDS_PER_GROUP,
    OTHER_ERRORS_SUMMARY,
    ErrorCollector,
    ErrorGroup,
)
from bellis._streams import print_to_stdout

TABLE_HEAD = (
    "\n"
    "Execution Summary\n"
    "-----------------\n"
    "\n"
    "    task     blocks   completed  skipped  failed  orphaned\n"
    "    ──────  ───────  ──────────  ───────  ──────  ────────\n"
)

VALUE_ERROR_TB = (
    "Traceback (most recent call last):\n"
    '  File "process.py", line 3, in process\n'
    '    raise ValueError("boom")\n'
    "ValueError: boom\n"
)


def done(task_id: str, total: int = 6, **fields: object) -> TaskState:
    values: dict[str, object] = {"completed_count": total}
    values.update(fields)
    return TaskState(task_id=task_id, started=True, total_block_count=total, **values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- layout


def test_all_completed_layout_is_byte_exact() -> None:
    states = {"a": done("a"), "b": done("b", total=12)}
    text = format_summary(states, ["a", "b"], log_dir="daisy_logs")
    assert text == TABLE_HEAD + (
        "    a ✔           6           6        0       0         0\n"
        "    b ✔          12          12        0       0         0"
    )


def test_name_column_grows_with_the_longest_task_id() -> None:
    states = {"segmentation": done("segmentation", total=1000)}
    text = format_summary(states, ["segmentation"], log_dir=None)
    assert text == (
        "\n"
        "Execution Summary\n"
        "-----------------\n"
        "\n"
        "    task             blocks   completed  skipped  failed  orphaned\n"
        "    ──────────────  ───────  ──────────  ───────  ──────  ────────\n"
        "    segmentation ✔     1000        1000        0       0         0"
    )


def test_failed_and_orphaned_without_collector_follow_daisy() -> None:
    states = {
        "a": done("a", completed_count=3, failed_count=3, first_worker_error=VALUE_ERROR_TB),
        "b": done("b", completed_count=5, orphaned_count=1),
    }
    text = format_summary(states, ["a", "b"], log_dir="daisy_logs")
    assert text == TABLE_HEAD + (
        "    a ✗           6           3        0       3         0\n"
        "    b ∅           6           5        0       0         1\n"
        "\n"
        "    First failure in task 'a':\n"
        "      Traceback (most recent call last):\n"
        '        File "process.py", line 3, in process\n'
        '          raise ValueError("boom")\n'
        "      ValueError: boom\n"
        "      (+ 2 more failed blocks — see worker logs)\n"
        "\n"
        "    See worker logs for details under daisy_logs/a/"
    )


def test_interrupted_run_is_prefixed_and_unfinished_tasks_show_ellipsis() -> None:
    states = {
        # ready blocks only: daisy 2.0.0 printed ✔ here
        "a": done("a", completed_count=4, ready_count=2),
        "b": done("b", completed_count=0),
        "c": done("c", completed_count=5, processing_count=1),
    }
    text = format_summary(states, ["a", "b", "c"], log_dir="daisy_logs", interrupted=True)
    assert text == "Run interrupted; counts at shutdown:\n" + TABLE_HEAD + (
        "    a …           6           4        0       0         0\n"
        "    b …           6           0        0       0         0\n"
        "    c …           6           5        0       0         0"
    )


def test_timeout_lines_name_the_default_and_use_g_format() -> None:
    states = {
        "a": done("a", timeout_reclaim_count=2, timeout_secs=1.0),
        "b": done("b", timeout_reclaim_count=3),
        "c": done("c", timeout_reclaim_count=1, timeout_secs=2.5),
    }
    text = format_summary(states, ["a", "b", "c"], log_dir="daisy_logs")
    assert text == TABLE_HEAD + (
        "    a ✔           6           6        0       0         0\n"
        "    b ✔           6           6        0       0         0\n"
        "    c ✔           6           6        0       0         0\n"
        "\n"
        "    2 block attempt(s) in task 'a' exceeded the block timeout (1s; pass "
        "Task(timeout=...) to raise it for slow blocks)\n"
        "\n"
        "    3 block attempt(s) in task 'b' exceeded the block timeout (600s — the default; "
        "pass Task(timeout=...) to raise it for slow blocks)\n"
        "\n"
        "    1 block attempt(s) in task 'c' exceeded the block timeout (2.5s; pass "
        "Task(timeout=...) to raise it for slow blocks)"
    )


def test_abandoned_task_shows_its_last_worker_error() -> None:
    states = {
        "a": done(
            "a",
            completed_count=0,
            orphaned_count=6,
            abandoned=True,
            abandon_reason="worker restart cap exhausted",
            worker_failure_count=3,
            worker_restart_count=1,
            last_worker_error="worker exited with code 1\nRuntimeError: cannot import model",
        ),
        "b": done(
            "b",
            completed_count=0,
            orphaned_count=6,
            abandoned=True,
            abandon_reason="upstream task abandoned",
        ),
    }
    text = format_summary(states, ["a", "b"], log_dir="logs")
    assert text == TABLE_HEAD + (
        "    a ∅           6           0        0       0         6\n"
        "    b ∅           6           0        0       0         6\n"
        "\n"
        "    Task 'a' was abandoned (worker restart cap exhausted): workers failed 3 times, "
        "1 restart performed.\n"
        "    Last worker error:\n"
        "      worker exited with code 1\n"
        "      RuntimeError: cannot import model\n"
        "\n"
        "    Task 'b' was abandoned (upstream task abandoned).\n"
        "\n"
        "    See worker logs for details under logs/a/"
    )


def test_abandoned_task_without_any_captured_error_says_so() -> None:
    state = done(
        "a",
        completed_count=0,
        orphaned_count=6,
        abandoned=True,
        abandon_reason="worker restart cap exhausted",
        worker_failure_count=1,
    )
    text = format_summary({"a": state}, ["a"], log_dir=None)
    assert text.endswith(
        "    Task 'a' was abandoned (worker restart cap exhausted): workers failed 1 time, "
        "0 restarts performed.\n"
        "    No worker error was captured."
    )


def test_multiple_failed_tasks_with_grouped_errors() -> None:
    collector = ErrorCollector()
    for block_id in range(13):
        collector.add("a", block_id, VALUE_ERROR_TB, "daisy_logs/a/worker_0.err")
    collector.add("a", 3, VALUE_ERROR_TB, "daisy_logs/a/worker_1.err")
    collector.add("a", 20, "KeyError: 'x'", None)
    collector.add("b", 7, "Traceback (most recent call last):\nOSError: disk full\n", None)
    states = {
        "a": done("a", total=20, completed_count=6, failed_count=14),
        "b": done("b", completed_count=5, failed_count=1),
        "c": done("c", completed_count=6),
    }
    text = format_summary(states, ["a", "b", "c"], log_dir="daisy_logs", errors=collector.as_dict())
    assert text == (
        "\n"
        "Execution Summary\n"
        "-----------------\n"
        "\n"
        "    task     blocks   completed  skipped  failed  orphaned\n"
        "    ──────  ───────  ──────────  ───────  ──────  ────────\n"
        "    a ✗          20           6        0      14         0\n"
        "    b ✗           6           5        0       1         0\n"
        "    c ✔           6           6        0       0         0\n"
        "\n"
        "    14 blocks failed in task 'a' with 2 distinct errors:\n"
        "\n"
        "    ValueError: boom\n"
        "      blocks 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, … and 3 more (14 failed attempts)\n"
        "      first recorded in daisy_logs/a/worker_0.err\n"
        "      Traceback (most recent call last):\n"
        '        File "process.py", line 3, in process\n'
        '          raise ValueError("boom")\n'
        "      ValueError: boom\n"
        "\n"
        "    KeyError: 'x'\n"
        "      block 20\n"
        "\n"
        "    1 block failed in task 'b' with 1 distinct error:\n"
        "\n"
        "    OSError: disk full\n"
        "      block 7\n"
        "      Traceback (most recent call last):\n"
        "      OSError: disk full\n"
        "\n"
        "    See worker logs for failed tasks under daisy_logs/\n"
        "      daisy_logs/a/\n"
        "      daisy_logs/b/"
    )


def test_skip_lines_list_only_the_kinds_that_skipped() -> None:
    states = {
        "a": done("a", skipped_count=6, skipped_done_count=4, skipped_check_count=2),
        "b": done("b", skipped_count=2, skipped_mask_count=2),
        "c": done("c", skipped_count=1),
    }
    text = format_summary(states, ["a", "b", "c"], log_dir=None)
    assert text == TABLE_HEAD + (
        "    a ✔           6           6        6       0         0\n"
        "    b ✔           6           6        2       0         0\n"
        "    c ✔           6           6        1       0         0\n"
        "\n"
        "    Skipped: 6 in task 'a' (done markers 4, check function 2)\n"
        "    Skipped: 2 in task 'b' (skip mask 2)\n"
        "    Skipped: 1 in task 'c'"
    )


def test_task_order_first_then_extra_ids_alphabetically() -> None:
    states = {"zeta": done("zeta"), "b": done("b"), "alpha": done("alpha"), "a": done("a")}
    text = format_summary(states, ["b", "a", "missing"], log_dir=None)
    names = [line.split()[0] for line in text.splitlines()[6:]]
    assert names == ["b", "a", "alpha", "zeta"]


def test_log_pointer_needs_failure_and_log_dir() -> None:
    failed = {"a": done("a", completed_count=5, failed_count=1, first_worker_error="E")}
    assert "See worker logs" not in format_summary(failed, ["a"], log_dir=None)
    assert "See worker logs" not in format_summary({"a": done("a")}, ["a"], log_dir="logs")
    text = format_summary(failed, ["a"], log_dir="logs/", worker_log_dirs={"a": "/x/run1/a"})
    assert text.endswith("    See worker logs for details under /x/run1/a/")


def test_log_pointer_escapes_task_ids_like_the_log_directories() -> None:
    failed = {"a/b": done("a/b", completed_count=5, failed_count=1, first_worker_error="E")}
    text = format_summary(failed, ["a/b"], log_dir="logs")
    assert text.endswith("    See worker logs for details under logs/a%2Fb/")


def test_failed_block_without_error_text() -> None:
    text = format_summary({"a": done("a", completed_count=5, failed_count=1)}, ["a"], log_dir=None)
    assert text.endswith("    First failure in task 'a':\n      (no error text was captured)")


def test_retried_errors_of_a_successful_task_are_not_listed() -> None:
    collector = ErrorCollector()
    collector.add("a", 1, VALUE_ERROR_TB, None)
    text = format_summary({"a": done("a")}, ["a"], log_dir="logs", errors=collector.as_dict())
    assert "ValueError" not in text


def test_many_distinct_errors_are_listed_up_to_five() -> None:
    collector = ErrorCollector()
    for block_id in range(8):
        collector.add("a", block_id, f"RuntimeError: error number {block_id}", None)
    collector.add("a", 9, "RuntimeError: error number 7", None)
    state = done("a", total=10, completed_count=1, failed_count=9)
    text = format_summary({"a": state}, ["a"], log_dir=None, errors=collector.as_dict())
    assert "RuntimeError: error number 4" in text
    assert "RuntimeError: error number 5" not in text
    assert text.endswith("    … and 3 more distinct errors (4 failed attempts) — see worker logs")


@pytest.mark.parametrize(
    ("fields", "symbol"),
    [
        ({}, "✔"),
        ({"completed_count": 4, "failed_count": 1, "orphaned_count": 1}, "✗"),
        ({"completed_count": 5, "orphaned_count": 1}, "∅"),
        ({"completed_count": 5, "ready_count": 1}, "…"),
        ({"completed_count": 5, "processing_count": 1}, "…"),
        ({"completed_count": 5}, "…"),
    ],
)
def test_status_symbol(fields: dict[str, int], symbol: str) -> None:
    assert status_symbol(done("a", **fields)) == symbol


# ------------------------------------------------------------------------------- grouping


def test_collector_groups_by_type_and_raising_line() -> None:
    """One group per exception type and innermost frame (file:line), its messages
    counted; the same message raised at another line is another group."""
    collector = ErrorCollector()
    first = collector.add("a", 1, VALUE_ERROR_TB + "\n\n", "log0")
    other_message = VALUE_ERROR_TB.replace("boom", "bust")
    second = collector.add("a", 2, other_message, "log1")
    assert first is second
    assert collector.groups("a") == [
        ErrorGroup(
            summary="ValueError: boom",
            traceback=VALUE_ERROR_TB.rstrip("\n"),
            block_ids=[1, 2],
            count=2,
            log_path="log0",
        )
    ]
    assert first.messages == {"boom": 1, "bust": 1}
    assert first.where == "process.py:3 in process" and first.type == "ValueError"
    assert first.title == "ValueError (2 distinct messages)"
    other_line = collector.add("a", 3, VALUE_ERROR_TB.replace("line 3", "line 9"), None)
    assert other_line is not first and other_line.title == "ValueError: boom"
    # without a frame: by the error text
    collector.add("a", 1, "Traceback\nValueError: other", None)
    collector.add("b", 1, VALUE_ERROR_TB, None)
    assert [g.summary for g in collector.groups("a")] == [
        "ValueError: boom",
        "ValueError: boom",
        "ValueError: other",
    ]
    assert collector.task_ids() == ["a", "b"]
    assert collector.groups("missing") == []
    assert set(collector.as_dict()) == {"a", "b"}


def test_the_summary_lists_a_groups_messages_and_leaves_done_blocks_out() -> None:
    collector = ErrorCollector()
    for k in range(4):
        text = VALUE_ERROR_TB.replace("boom", f"bad data at {k}")
        collector.add("a", 10 + k, text, None, index=k, coord=(0, k))
        collector.add("a", 10 + k, text, None, index=k, coord=(0, k))
    flaky = VALUE_ERROR_TB.replace("ValueError", "RuntimeError").replace("line 3", "line 7")
    for k in range(4, 7):
        collector.add("a", 10 + k, flaky, None, index=k, coord=(1, k))
    collector.settle("a", lambda k: "failed" if k < 4 else "done")
    state = done("a", total=10, completed_count=6, failed_count=4)
    text = format_summary({"a": state}, ["a"], log_dir=None, errors=collector.as_dict())
    assert (
        "    4 blocks failed in task 'a' with 1 distinct error:\n"
        "\n"
        "    ValueError (4 distinct messages)\n"
        "      blocks 10 (0, 0), 11 (0, 1), 12 (0, 2), 13 (0, 3) (8 failed attempts)\n"
        "      messages: 'bad data at 0' (2), 'bad data at 1' (2), 'bad data at 2' (2) "
        "and 1 more\n"
    ) in text
    assert text.endswith(
        "    3 blocks done after a retry in task 'a':\n"
        "      RuntimeError: boom at process.py:7 in process (3 failed attempts; "
        "blocks 14 (1, 4), 15 (1, 5), 16 (1, 6))"
    )


def test_collector_counts_every_attempt_but_keeps_distinct_ids() -> None:
    collector = ErrorCollector()
    for _ in range(3):
        collector.add("a", 5, VALUE_ERROR_TB, None)
    (group,) = collector.groups("a")
    assert group.block_ids == [5]
    assert group.count == 3
    assert group.log_path is None
    collector.add("a", 6, VALUE_ERROR_TB, "late.err")
    assert group.log_path == "late.err"


def test_collector_memory_is_bounded() -> None:
    collector = ErrorCollector(max_groups_per_task=3)
    for block_id in range(MAX_BLOCK_IDS_PER_GROUP + 500):
        collector.add("a", block_id, VALUE_ERROR_TB, None)
    (group,) = collector.groups("a")
    assert len(group.block_ids) == MAX_BLOCK_IDS_PER_GROUP
    assert group.count == MAX_BLOCK_IDS_PER_GROUP + 500
    for number in range(5):
        collector.add("a", number, f"KeyError: {number}", None)
    groups = collector.groups("a")
    assert [g.summary for g in groups] == [
        "ValueError: boom",
        "KeyError: 0",
        "KeyError: 1",
        OTHER_ERRORS_SUMMARY,
    ]
    assert groups[3].count == 3
    assert groups[3].traceback == ""
    state = done("a", total=2000, completed_count=0, failed_count=2000)
    text = format_summary({"a": state}, ["a"], log_dir=None, errors=collector.as_dict())
    assert "… and at least 990 more (1500 failed attempts)" in text


def test_collector_rejects_a_zero_group_budget() -> None:
    with pytest.raises(ValueError, match="max_groups_per_task"):
        ErrorCollector(max_groups_per_task=0)


def test_empty_traceback_text_gets_a_placeholder_summary() -> None:
    collector = ErrorCollector()
    group = collector.add("a", 0, "\n  \n", None)
    assert group.summary == "(no error text was captured)"


# ------------------------------------------------------------------------------- resume notice


def test_resume_message_for_done_markers_matches_daisy() -> None:
    state = done("seg", total=12, skipped_count=12, skipped_done_count=12)
    assert resume_message(state) == (
        "task 'seg': resumed — 12/12 blocks skipped via done markers "
        "(Task.reset() or done_marker_path=False reprocesses them)"
    )


def test_resume_message_names_mask_and_check_function_skips() -> None:
    masked = done("seg", total=12, skipped_count=4, skipped_mask_count=4)
    assert resume_message(masked) == "task 'seg': resumed — 4/12 blocks skipped via skip mask"
    checked = done("seg", total=12, skipped_count=2, skipped_check_count=2)
    assert resume_message(checked) == "task 'seg': resumed — 2/12 blocks skipped via check function"
    mixed = done(
        "seg",
        total=12,
        skipped_count=12,
        skipped_done_count=9,
        skipped_mask_count=2,
        skipped_check_count=1,
    )
    assert resume_message(mixed) == (
        "task 'seg': resumed — 12/12 blocks skipped via done markers (9), skip mask (2), "
        "check function (1) (Task.reset() or done_marker_path=False reprocesses them)"
    )


def test_resume_message_is_none_without_skips() -> None:
    assert resume_message(done("seg")) is None


# ------------------------------------------------------------------------------- printing


def test_the_summary_goes_to_the_sys_stdout_in_force_when_it_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process_stdout = io.StringIO()
    in_force = io.StringIO()  # redirect_stdout, capsys, a notebook cell
    monkeypatch.setattr(sys, "__stdout__", process_stdout)
    monkeypatch.setattr(sys, "stdout", in_force)
    print_to_stdout("summary")
    assert in_force.getvalue() == "summary\n"
    assert process_stdout.getvalue() == ""


def test_without_a_sys_stdout_the_summary_is_not_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process_stdout = io.StringIO()
    monkeypatch.setattr(sys, "__stdout__", process_stdout)
    monkeypatch.setattr(sys, "stdout", None)  # code that silenced stdout
    print_to_stdout("summary")
    assert process_stdout.getvalue() == ""


def test_task_ids_are_quoted_literally_as_daisy_does() -> None:
    state = done("it's", completed_count=5, failed_count=1, first_worker_error="E")
    text = format_summary({"it's": state}, ["it's"], log_dir=None)
    assert "    First failure in task 'it's':" in text


def test_abandoned_without_a_reason_has_no_parenthesis() -> None:
    state = done("a", completed_count=0, orphaned_count=6, abandoned=True)
    text = format_summary({"a": state}, ["a"], log_dir=None)
    assert text.endswith(
        "    Task 'a' was abandoned: workers failed 0 times, 0 restarts performed.\n"
        "    No worker error was captured."
    )


def test_a_group_names_only_its_failed_blocks_messages_under_failed() -> None:
    """One raising line, two blocks failed for good and one done after a retry: the
    failure section gives the failed blocks' message, the retry line the other's."""
    collector = ErrorCollector()
    for k, message in ((0, "bad tile"), (1, "bad tile"), (2, "slow disk")):
        text = VALUE_ERROR_TB.replace("boom", message)
        collector.add("a", 20 + k, text, None, index=k, coord=(k, 0))
    collector.settle("a", lambda k: "done" if k == 2 else "failed")
    state = done("a", total=3, completed_count=1, failed_count=2)
    text = format_summary({"a": state}, ["a"], log_dir=None, errors=collector.as_dict())
    assert (
        "    2 blocks failed in task 'a' with 1 distinct error:\n"
        "\n"
        "    ValueError: bad tile\n"
        "      blocks 20 (0, 0), 21 (1, 0)\n"
    ) in text
    assert "slow disk" not in text[: text.index("done after a retry")]
    assert text.endswith(
        "    1 block done after a retry in task 'a':\n"
        "      ValueError: slow disk at process.py:3 in process (1 failed attempt; "
        "block 22 (2, 0))"
    )
